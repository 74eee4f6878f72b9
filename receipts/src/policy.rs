//! Defaults, defined once. Every other place that needs one of these values reads it from
//! here (or from configuration that starts from here).

use crate::model::Backend;

/// Failures a projection job may cause before it is dead.
pub const DEFAULT_MAX_ATTEMPTS: i64 = 5;

/// Backends that get a projection receipt when none are configured.
pub const DEFAULT_BACKENDS: &[Backend] = &[Backend::Relational, Backend::Vector];

/// Most submissions the writer commits in one transaction.
pub const DEFAULT_MAX_GROUP: usize = 2048;

/// Largest request body the acceptor reads, in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Largest batch request body, in bytes.
pub const DEFAULT_MAX_BATCH_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Most items in one batch request.
pub const DEFAULT_MAX_BATCH_ITEMS: usize = 1000;
