//! Defaults, defined once. Every other place that needs one of these values reads it from
//! here (or from configuration that starts from here).

use crate::model::{Backend, JobKind};

/// Failures a job may cause before it is dead (per kind: [`JobPolicy::max_attempts`]).
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

/// How long a claimed lease lasts without a heartbeat (workers heartbeat every third of it).
pub const DEFAULT_LEASE_MICROS: i64 = 30_000_000;

/// The hard limit of one run: past it heartbeats are refused and the job is rescued.
pub const DEFAULT_MAX_RUN_MICROS: i64 = 15 * 60 * 1_000_000;

/// Leases lost to crashes or hangs before a job is quarantined.
pub const DEFAULT_QUARANTINE_AFTER_CRASHES: i64 = 3;

/// First retry delay after a failure.
pub const DEFAULT_BACKOFF_BASE_MICROS: i64 = 1_000_000;

/// Longest retry delay.
pub const DEFAULT_BACKOFF_CAP_MICROS: i64 = 10 * 60 * 1_000_000;

/// Jitter: the delay is scaled by a factor drawn from `[1 - JITTER, 1 + JITTER]`.
pub const BACKOFF_JITTER: f64 = 0.1;

/// Retry and lease policy of a job kind. Defaults are the constants above.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobPolicy {
    /// Failures the job may cause before it is dead.
    pub max_attempts: i64,
    /// Lease length without a heartbeat, in microseconds.
    pub lease_micros: i64,
    /// Hard limit of one run, in microseconds.
    pub max_run_micros: i64,
    /// Crashes before quarantine.
    pub quarantine_after_crashes: i64,
    /// First retry delay, in microseconds.
    pub backoff_base_micros: i64,
    /// Longest retry delay, in microseconds.
    pub backoff_cap_micros: i64,
}

impl Default for JobPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            lease_micros: DEFAULT_LEASE_MICROS,
            max_run_micros: DEFAULT_MAX_RUN_MICROS,
            quarantine_after_crashes: DEFAULT_QUARANTINE_AFTER_CRASHES,
            backoff_base_micros: DEFAULT_BACKOFF_BASE_MICROS,
            backoff_cap_micros: DEFAULT_BACKOFF_CAP_MICROS,
        }
    }
}

impl JobPolicy {
    /// Why this policy cannot work, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.max_attempts < 1 {
            return Err("max_attempts must be at least 1".to_owned());
        }
        if self.lease_micros < 100_000 {
            return Err("lease_ms must be at least 100".to_owned());
        }
        if self.max_run_micros < self.lease_micros {
            return Err("max_run_ms must be at least lease_ms".to_owned());
        }
        if self.quarantine_after_crashes < 1 {
            return Err("quarantine_after_crashes must be at least 1".to_owned());
        }
        if self.backoff_base_micros < 1_000 || self.backoff_cap_micros < self.backoff_base_micros {
            return Err(
                "backoff_base_ms must be at least 1 and backoff_cap_ms at least backoff_base_ms"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// The delay before retry after failure number `attempt` (1-based): `base * 2^(attempt-1)`,
    /// capped, scaled by `1 + JITTER * (2 * unit - 1)` where `unit` is uniform in `[0, 1)`.
    pub fn backoff_micros(&self, attempt: i64, unit: f64) -> i64 {
        let exponent = u32::try_from((attempt - 1).clamp(0, 40)).unwrap_or(40);
        let raw = self
            .backoff_base_micros
            .saturating_mul(2_i64.saturating_pow(exponent));
        let capped = raw.min(self.backoff_cap_micros) as f64;
        let factor = 1.0 + BACKOFF_JITTER * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
        (capped * factor).round() as i64
    }
}

/// The policy of every job kind. A kind's policy is read from here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct JobPolicies {
    /// Jobs that project a content revision.
    pub project: JobPolicy,
    /// Jobs that exclude a deleted source.
    pub tombstone: JobPolicy,
    /// Jobs that project a revision into the graph store.
    pub graph: JobPolicy,
    /// Connector runs.
    pub sync: JobPolicy,
    /// Access payload rewrites.
    pub access: JobPolicy,
}

impl JobPolicies {
    /// The same policy for every kind.
    pub fn uniform(policy: JobPolicy) -> Self {
        Self {
            project: policy,
            tombstone: policy,
            graph: policy,
            sync: policy,
            access: policy,
        }
    }

    /// The policy of `kind`.
    pub fn of(&self, kind: JobKind) -> &JobPolicy {
        match kind {
            JobKind::Project => &self.project,
            JobKind::Tombstone => &self.tombstone,
            JobKind::Graph => &self.graph,
            JobKind::Sync => &self.sync,
            JobKind::Access => &self.access,
        }
    }

    /// Every kind with its policy.
    pub fn all(&self) -> [(JobKind, &JobPolicy); 5] {
        [
            (JobKind::Project, &self.project),
            (JobKind::Tombstone, &self.tombstone),
            (JobKind::Graph, &self.graph),
            (JobKind::Sync, &self.sync),
            (JobKind::Access, &self.access),
        ]
    }

    /// The shortest lease of any kind (workers heartbeat at a third of it).
    pub fn shortest_lease_micros(&self) -> i64 {
        self.all()
            .iter()
            .map(|(_, policy)| policy.lease_micros)
            .min()
            .unwrap_or(DEFAULT_LEASE_MICROS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps_with_bounded_jitter() {
        let policy = JobPolicy::default();
        assert_eq!(policy.backoff_micros(1, 0.5), 1_000_000);
        assert_eq!(policy.backoff_micros(2, 0.5), 2_000_000);
        assert_eq!(policy.backoff_micros(4, 0.5), 8_000_000);
        assert_eq!(policy.backoff_micros(30, 0.5), DEFAULT_BACKOFF_CAP_MICROS);
        assert_eq!(policy.backoff_micros(1, 0.0), 900_000);
        assert_eq!(policy.backoff_micros(1, 1.0), 1_100_000);
    }
}
