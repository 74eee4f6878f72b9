//! The configuration file's schema, as written: every section and key `cairn.toml` may hold.
//! Unknown keys are refused (`deny_unknown_fields`), so a misspelt setting is an error, never
//! a silent default.

use std::path::{Path, PathBuf};

use anyhow::Context;
use receipts::policy;
use serde::Deserialize;

/// The configuration file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) data_dir: Option<PathBuf>,
    pub(super) bind: Option<String>,
    #[serde(default)]
    pub(super) limits: FileLimits,
    #[serde(default)]
    pub(super) ledger: FileLedger,
    #[serde(default)]
    pub(super) jobs: FileJobs,
    #[serde(default)]
    pub(super) workers: FileWorkers,
    #[serde(default)]
    pub(super) projection: FileProjection,
    #[serde(default)]
    pub(super) search: FileSearch,
    #[serde(default)]
    pub(super) http: FileHttp,
    #[serde(default)]
    pub(super) vectors: FileVectors,
    #[serde(default)]
    pub(super) graph: FileGraph,
    #[serde(default)]
    pub(super) mcp: FileMcp,
    #[serde(default)]
    pub(super) connectors: FileConnectors,
    #[serde(default)]
    pub(super) verify: FileVerify,
    #[serde(default)]
    pub(super) backup: FileBackup,
    #[serde(default)]
    pub(super) embeddings: FileEmbeddings,
    /// `[datasets.<name>]`: settings of one dataset.
    #[serde(default)]
    pub(super) datasets: std::collections::BTreeMap<String, FileDataset>,
    #[serde(default)]
    pub(super) oauth: FileOAuth,
    #[serde(default)]
    pub(super) events: FileEvents,
    #[serde(default)]
    pub(super) webhooks: FileWebhooks,
}

/// `[webhooks]`: subscriptions' deliveries.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileWebhooks {
    /// Hosts deliveries may reach over plain http and at private addresses.
    pub(super) allow_hosts: Option<Vec<String>>,
    /// The key file that seals signing secrets.
    pub(super) secret_key_file: Option<PathBuf>,
    /// How long a rotated secret keeps signing (hours).
    pub(super) rotation_grace_hours: Option<u64>,
    /// How long a delivery is retried (seconds).
    pub(super) retry_for_seconds: Option<u64>,
    /// The first retry's delay (milliseconds).
    pub(super) backoff_base_ms: Option<u64>,
    /// The longest delay between attempts (seconds).
    pub(super) backoff_max_seconds: Option<u64>,
    /// The most time one attempt may take (milliseconds).
    pub(super) attempt_timeout_ms: Option<u64>,
    /// Attempts in flight per subscription.
    pub(super) concurrency: Option<usize>,
}

/// `[events]`: the events outbox.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileEvents {
    /// How long events are kept for the change feed (hours).
    pub(super) retention_hours: Option<u64>,
}

/// `[oauth]`: cairn as an OAuth 2.1 resource server.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileOAuth {
    /// cairn's public URL: the audience of every accepted token.
    pub(super) resource: Option<String>,
    /// Whether cairn's own tokens still work beside the issuers' (default true).
    pub(super) cairn_tokens: Option<bool>,
    /// `[[oauth.issuers]]`: each trusted issuer.
    pub(super) issuers: Option<Vec<FileIssuer>>,
}

/// `[[oauth.issuers]]`: one trusted issuer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileIssuer {
    pub(super) issuer: String,
    pub(super) jwks_uri: Option<String>,
    pub(super) algorithms: Option<Vec<String>>,
    /// The issuer's scope names, each to the cairn scopes it grants.
    pub(super) scopes: Option<std::collections::BTreeMap<String, Vec<String>>>,
    pub(super) principal_claim: Option<String>,
    pub(super) groups_claim: Option<String>,
    pub(super) datasets_claim: Option<String>,
    pub(super) datasets: Option<Vec<String>>,
    pub(super) skew_seconds: Option<u64>,
    pub(super) refetch_interval_seconds: Option<u64>,
    /// `[oauth.issuers.introspection]`: token introspection (RFC 7662).
    pub(super) introspection: Option<FileIntrospection>,
}

/// `[oauth.issuers.introspection]`: how cairn introspects the issuer's tokens. The client
/// secret comes from a file or an environment variable, never from this file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileIntrospection {
    pub(super) endpoint: Option<String>,
    pub(super) client_id: String,
    pub(super) client_secret_file: Option<std::path::PathBuf>,
    pub(super) client_secret_env: Option<String>,
    pub(super) cache_seconds: Option<u64>,
    pub(super) jwts: Option<bool>,
}

/// `[datasets.<name>]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileDataset {
    /// `everyone` or `nobody`: who may read the dataset's sources that name no readers.
    pub(super) default_access: Option<String>,
    /// Metadata fields the vector store indexes for filters: name to `keyword`, `number` or
    /// `bool`.
    pub(super) filterable: Option<std::collections::BTreeMap<String, String>>,
}

/// `[embeddings]`: the remote embedding server (its key comes from the environment only).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileEmbeddings {
    pub(super) url: Option<String>,
    pub(super) model: Option<String>,
    pub(super) dimensions: Option<usize>,
    pub(super) batch: Option<usize>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) parallel: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileBackup {
    pub(super) dir: Option<PathBuf>,
    pub(super) pg_bin: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileVerify {
    pub(super) interval_ms: Option<u64>,
    pub(super) tier: Option<String>,
    pub(super) repair: Option<bool>,
    pub(super) points_per_second: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConnectors {
    pub(super) folder_roots: Option<Vec<PathBuf>>,
    pub(super) remote_hosts: Option<Vec<String>>,
    pub(super) credentials_dir: Option<PathBuf>,
    pub(super) git_depth: Option<u32>,
    pub(super) max_fetch_bytes: Option<u64>,
    pub(super) fetch_timeout_s: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileMcp {
    pub(super) allowed_hosts: Option<Vec<String>>,
    pub(super) allowed_origins: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileGraph {
    pub(super) url: Option<String>,
    pub(super) user: Option<String>,
    pub(super) database: Option<String>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) retry_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileVectors {
    pub(super) url: Option<String>,
    pub(super) urls: Option<Vec<String>>,
    pub(super) shards: Option<u32>,
    pub(super) replication_factor: Option<u32>,
    pub(super) write_consistency_factor: Option<u32>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) connect_timeout_ms: Option<u64>,
    pub(super) retry_ms: Option<u64>,
    pub(super) collection_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileHttp {
    pub(super) max_connections: Option<usize>,
    pub(super) header_read_timeout_ms: Option<u64>,
    pub(super) request_timeout_ms: Option<u64>,
    pub(super) shutdown_grace_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileSearch {
    pub(super) max_in_flight: Option<usize>,
    pub(super) max_queued: Option<usize>,
    pub(super) default_budget_ms: Option<u64>,
    pub(super) max_budget_ms: Option<u64>,
    pub(super) filter_max_conditions: Option<usize>,
    pub(super) filter_max_depth: Option<usize>,
    pub(super) filter_max_values: Option<usize>,
    pub(super) filter_max_narrowing: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileProjection {
    pub(super) models_dir: Option<PathBuf>,
    pub(super) model: Option<String>,
    pub(super) chunk_max_tokens: Option<usize>,
    pub(super) chunk_overlap_tokens: Option<usize>,
    pub(super) embed_batch: Option<usize>,
    pub(super) embed_sessions: Option<usize>,
    pub(super) embed_threads: Option<usize>,
    pub(super) optimize_min_new_points: Option<u64>,
    pub(super) optimize_max_new_points: Option<u64>,
    pub(super) optimize_quiet_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileLimits {
    pub(super) max_body_bytes: Option<usize>,
    pub(super) max_batch_body_bytes: Option<usize>,
    pub(super) max_batch_items: Option<usize>,
    pub(super) max_body_bytes_in_flight: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileLedger {
    pub(super) url: Option<String>,
    pub(super) pool_size: Option<u32>,
    pub(super) committers: Option<usize>,
    pub(super) token_cache_ms: Option<u64>,
    pub(super) peer_timeout_ms: Option<u64>,
    pub(super) backends: Option<Vec<String>>,
    pub(super) max_group: Option<usize>,
}

/// One job kind's policy as written; every field is optional.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FilePolicy {
    pub(super) max_attempts: Option<i64>,
    pub(super) lease_ms: Option<i64>,
    pub(super) max_run_ms: Option<i64>,
    pub(super) quarantine_after_crashes: Option<i64>,
    pub(super) backoff_base_ms: Option<i64>,
    pub(super) backoff_cap_ms: Option<i64>,
}

impl FilePolicy {
    /// Fields set here win over `under`'s.
    pub(super) fn over(self, under: FilePolicy) -> FilePolicy {
        FilePolicy {
            max_attempts: self.max_attempts.or(under.max_attempts),
            lease_ms: self.lease_ms.or(under.lease_ms),
            max_run_ms: self.max_run_ms.or(under.max_run_ms),
            quarantine_after_crashes: self
                .quarantine_after_crashes
                .or(under.quarantine_after_crashes),
            backoff_base_ms: self.backoff_base_ms.or(under.backoff_base_ms),
            backoff_cap_ms: self.backoff_cap_ms.or(under.backoff_cap_ms),
        }
    }

    pub(super) fn resolve(self) -> policy::JobPolicy {
        let defaults = policy::JobPolicy::default();
        let micros =
            |ms: Option<i64>, default: i64| ms.map_or(default, |ms| ms.saturating_mul(1000));
        policy::JobPolicy {
            max_attempts: self.max_attempts.unwrap_or(defaults.max_attempts),
            lease_micros: micros(self.lease_ms, defaults.lease_micros),
            max_run_micros: micros(self.max_run_ms, defaults.max_run_micros),
            quarantine_after_crashes: self
                .quarantine_after_crashes
                .unwrap_or(defaults.quarantine_after_crashes),
            backoff_base_micros: micros(self.backoff_base_ms, defaults.backoff_base_micros),
            backoff_cap_micros: micros(self.backoff_cap_ms, defaults.backoff_cap_micros),
        }
    }
}

/// `[jobs]`: a policy for every kind, and `[jobs.project]` / `[jobs.tombstone]` per kind.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileJobs {
    pub(super) max_attempts: Option<i64>,
    pub(super) lease_ms: Option<i64>,
    pub(super) max_run_ms: Option<i64>,
    pub(super) quarantine_after_crashes: Option<i64>,
    pub(super) backoff_base_ms: Option<i64>,
    pub(super) backoff_cap_ms: Option<i64>,
    #[serde(default)]
    pub(super) project: FilePolicy,
    #[serde(default)]
    pub(super) tombstone: FilePolicy,
    #[serde(default)]
    pub(super) graph: FilePolicy,
    #[serde(default)]
    pub(super) sync: FilePolicy,
    #[serde(default)]
    pub(super) access: FilePolicy,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileWorkers {
    pub(super) count: Option<usize>,
    pub(super) concurrency: Option<usize>,
    pub(super) unit_jobs: Option<usize>,
    pub(super) unit_max_bytes: Option<usize>,
}

pub(super) fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}
