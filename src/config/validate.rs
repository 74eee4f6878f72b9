//! Validation: settings that cannot work together are refused at start, with the setting named.

use anyhow::bail;
use receipts::Backend;

use super::Config;

impl Config {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if self.backends.is_empty() {
            bail!("at least one backend must be configured");
        }
        if self.acceptor.max_body_bytes < 1024 {
            bail!("limits.max_body_bytes must be at least 1024");
        }
        let largest = self
            .acceptor
            .max_body_bytes
            .max(self.acceptor.max_batch_body_bytes);
        if self.acceptor.max_body_bytes_in_flight < largest {
            bail!(
                "limits.max_body_bytes_in_flight ({}) must be at least the largest body limit \
                 ({largest}), or a request of that size could never be read",
                self.acceptor.max_body_bytes_in_flight
            );
        }
        if self.acceptor.max_batch_items == 0 || self.acceptor.max_batch_items > 100_000 {
            bail!("limits.max_batch_items must be between 1 and 100000");
        }
        if self.ledger.pool_size < 2 || self.ledger.pool_size > 1000 {
            bail!("ledger.pool_size must be between 2 and 1000");
        }
        if self.ledger.committers == 0
            || self.ledger.committers as u64 >= u64::from(self.ledger.pool_size)
        {
            bail!(
                "ledger.committers must be at least 1 and below ledger.pool_size ({}): each \
                 holds a connection while it commits",
                self.ledger.pool_size
            );
        }
        let peer_ms = self.ledger.peer_timeout.as_millis();
        if peer_ms != 0 && !(1000..=600_000).contains(&peer_ms) {
            bail!(
                "ledger.peer_timeout_ms must be 0 (the kernel's defaults) or between 1000 and \
                 600000: the server's keepalive settings count whole seconds"
            );
        }
        if self.ledger.max_group == 0 {
            bail!("ledger.max_group must be at least 1");
        }
        for (kind, policy) in self.job_policies.all() {
            if let Err(problem) = policy.check() {
                bail!("jobs.{kind}: {problem}");
            }
        }
        if self.workers.concurrency == 0 || self.workers.concurrency > 1024 {
            bail!("workers.concurrency must be between 1 and 1024");
        }
        if self.workers.unit_jobs == 0 || self.workers.unit_jobs > 256 {
            bail!("workers.unit_jobs must be between 1 and 256");
        }
        if self.workers.unit_max_bytes > 1 << 20 {
            bail!("workers.unit_max_bytes must be at most 1048576 (1 MiB)");
        }
        if self.workers.count > 64 {
            bail!("workers.count must be at most 64");
        }
        let chunker = &self.projection.chunker;
        let window = gateways::embedder::MODEL_MAX_TOKENS - 2;
        if chunker.max_tokens == 0 || chunker.max_tokens > window {
            bail!("projection.chunk_max_tokens must be between 1 and {window}");
        }
        if chunker.overlap_tokens >= chunker.max_tokens {
            bail!("projection.chunk_overlap_tokens must be below chunk_max_tokens");
        }
        if self.search.max_in_flight == 0 {
            bail!("search.max_in_flight must be at least 1");
        }
        if self.search.max_queued > 100_000 {
            bail!("search.max_queued must be at most 100000");
        }
        if self.search.default_budget.is_zero()
            || self.search.default_budget > self.search.max_budget
        {
            bail!("search.default_budget_ms must be between 1 and search.max_budget_ms");
        }
        let filters = self.search.filter_limits;
        if !(1..=1000).contains(&filters.max_conditions) {
            bail!("search.filter_max_conditions must be between 1 and 1000");
        }
        if !(1..=16).contains(&filters.max_depth) {
            bail!("search.filter_max_depth must be between 1 and 16");
        }
        if !(1..=100_000).contains(&filters.max_values) {
            bail!("search.filter_max_values must be between 1 and 100000");
        }
        if self.search.filter_max_narrowing > 1_000_000 {
            bail!("search.filter_max_narrowing must be at most 1000000");
        }
        if self.projection.optimize.min_new_points > self.projection.optimize.max_new_points {
            bail!("projection.optimize_min_new_points must not exceed optimize_max_new_points");
        }
        if self.projection.embed_sessions == 0 || self.projection.embed_sessions > 16 {
            bail!("projection.embed_sessions must be between 1 and 16");
        }
        let http = &self.http;
        if http.max_connections == 0 || http.max_connections > 1_000_000 {
            bail!("http.max_connections must be between 1 and 1000000");
        }
        if http.header_read_timeout.is_zero() {
            bail!("http.header_read_timeout_ms must be at least 1");
        }
        if http.request_timeout <= self.search.max_budget {
            bail!(
                "http.request_timeout_ms ({}) must be above search.max_budget_ms ({}): a search \
                 within its budget must not be cut off",
                http.request_timeout.as_millis(),
                self.search.max_budget.as_millis()
            );
        }
        if self.projection.embed_batch == 0 || self.projection.embed_batch > 512 {
            bail!("projection.embed_batch must be between 1 and 512");
        }
        if let Some(server) = &self.embeddings {
            let options = &server.options;
            if !(options.url.starts_with("http://") || options.url.starts_with("https://")) {
                bail!(
                    "embeddings.url `{}` is not an http(s) URL of an OpenAI-compatible API \
                     (e.g. http://gpu-1:8080/v1)",
                    options.url
                );
            }
            // The URL is part of the model id every generation, receipt and dashboard shows:
            // a secret in it would be shown everywhere.
            let authority = options
                .url
                .split("://")
                .nth(1)
                .and_then(|rest| rest.split('/').next())
                .unwrap_or("");
            if authority.contains('@') || options.url.contains('?') {
                bail!(
                    "embeddings.url must not carry credentials or a query string (it names the \
                     model in every generation): put the key in CAIRN_EMBEDDINGS_KEY"
                );
            }
            if options.dimension == 0 || options.dimension > 65_536 {
                bail!("embeddings.dimensions must be between 1 and 65536");
            }
            if options.batch == 0 || options.batch > 2048 {
                bail!("embeddings.batch must be between 1 and 2048");
            }
            if options.timeout.is_zero() {
                bail!("embeddings.timeout_ms must be at least 1");
            }
            if server.parallel == 0 || server.parallel > 64 {
                bail!("embeddings.parallel must be between 1 and 64");
            }
        }
        let remote = self.embeddings.as_ref().map(|server| {
            gateways::embedder::remote_model_id(&server.options.url, &server.options.model)
        });
        if gateways::embedder::local_model(&self.projection.model).is_none()
            && remote.as_deref() != Some(self.projection.model.as_str())
        {
            let mut known: Vec<String> = gateways::embedder::LOCAL_MODELS
                .iter()
                .map(|model| model.id.to_owned())
                .collect();
            known.extend(remote);
            known.push("remote".to_owned());
            bail!(
                "projection.model `{}` is not a model this process can run (one of: {})",
                self.projection.model,
                known.join(", ")
            );
        }
        match &self.graph {
            None if self.backends.contains(&Backend::Graph) => bail!(
                "the graph backend is listed but no graph is configured: set graph.url (or \
                 CAIRN_GRAPH_URL), or remove `graph` from backends"
            ),
            Some(graph) => {
                if graph.timeout.is_zero() {
                    bail!("graph.timeout_ms must be at least 1");
                }
                self.check_retry_budget("graph.retry_ms", graph.retry_budget)?;
            }
            None => {}
        }
        if let Some(vectors) = &self.vectors {
            for url in &vectors.urls {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    bail!(
                        "vectors.url `{url}` is not a Qdrant gRPC URL (http://host:6334, or \
                         https:// for TLS); leave it unset for the embedded qdrant-edge store"
                    );
                }
            }
            let mut unique = vectors.urls.clone();
            unique.sort();
            unique.dedup();
            if unique.len() != vectors.urls.len() {
                bail!("vectors.urls names a node twice: {:?}", vectors.urls);
            }
            let layout = vectors.layout;
            for (name, value) in [
                ("vectors.shards", layout.shards),
                ("vectors.replication_factor", layout.replication_factor),
                ("vectors.write_consistency_factor", layout.write_consistency),
            ] {
                if value == Some(0) {
                    bail!("{name} must be at least 1");
                }
            }
            if let (Some(write), replication) =
                (layout.write_consistency, layout.replication_factor)
            {
                let replication = replication.unwrap_or(1);
                if write > replication {
                    bail!(
                        "vectors.write_consistency_factor {write} is above the replication \
                         factor {replication}: no write could ever be acknowledged"
                    );
                }
            }
            if vectors.timeout.is_zero() || vectors.connect_timeout.is_zero() {
                bail!("vectors.timeout_ms and vectors.connect_timeout_ms must be at least 1");
            }
            let valid_prefix = vectors
                .collection_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !valid_prefix || vectors.collection_prefix.len() > 64 {
                bail!("vectors.collection_prefix may hold only letters, digits, `-` and `_` (at most 64)");
            }
            self.check_retry_budget("vectors.retry_ms", vectors.retry_budget)?;
        }
        Ok(())
    }

    /// In-process retries of a store call must end well inside the lease (at most half the
    /// shortest), so a retrying worker never outlives its own lease.
    fn check_retry_budget(&self, setting: &str, budget: std::time::Duration) -> anyhow::Result<()> {
        let lease_ms = self.job_policies.shortest_lease_micros() / 1000;
        let retry_ms = i64::try_from(budget.as_millis()).unwrap_or(i64::MAX);
        if retry_ms.saturating_mul(2) > lease_ms {
            bail!(
                "{setting} ({retry_ms}) must be at most half the shortest job lease \
                 ({lease_ms} ms): in-process retries are bounded by the lease"
            );
        }
        Ok(())
    }
}
