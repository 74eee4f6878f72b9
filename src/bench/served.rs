//! cairn served on a free loopback port over a fresh SQLite ledger of its own, with one token:
//! what the benchmarks that measure through the HTTP API (`mcp`, `prune`) start from.

use std::sync::Arc;

use anyhow::Context;
use receipts::auth::NewToken;
use receipts::{Ledger, Scope, SqliteLedger, SystemClock};

use crate::config::Config;

/// A served instance; the server stops when it drops.
pub(super) struct Served {
    /// The ledger behind it.
    pub(super) ledger: Arc<dyn Ledger>,
    /// A token with the scope asked for.
    pub(super) token: String,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub(super) base: String,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    _directory: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Served {
    /// Accepts `docs` synthetic documents of `words` words into `dataset` (in batches of
    /// 1,000, through the ledger, so the lexical index is the real one), and returns
    /// `queries` two-word queries from the same vocabulary.
    pub(super) async fn seed(
        &self,
        dataset: &str,
        docs: usize,
        words: usize,
        queries: usize,
        random: &mut super::search_latency::Random,
    ) -> anyhow::Result<Vec<String>> {
        for start in (0..docs).step_by(1000) {
            let submissions: Vec<receipts::Submission> = (start..(start + 1000).min(docs))
                .map(|n| {
                    receipts::Submission::text(
                        dataset,
                        &format!("doc-{n}"),
                        "bench",
                        &random.text(words),
                    )
                })
                .collect();
            for result in self.ledger.accept(submissions).await {
                result?;
            }
        }
        Ok((0..queries.max(1))
            .map(|_| format!("{} {}", random.word(), random.word()))
            .collect())
    }
}

/// Serves the router alone (no workers) over a new ledger, with a `scope` token.
pub(super) async fn served(config: &Config, scope: Scope) -> anyhow::Result<Served> {
    let directory = tempfile::tempdir().context("temporary directory")?;
    let mut options = config.ledger_options();
    options.path = directory.path().join("ledger.db");
    let ledger: Arc<dyn Ledger> =
        Arc::new(SqliteLedger::open(options, Arc::new(SystemClock)).await?);
    let token = ledger
        .create_token(NewToken {
            name: "bench".to_owned(),
            scopes: vec![scope],
            datasets: None,
            identity: None,
            created_by: "bench".to_owned(),
            expires_at: None,
        })
        .await?
        .secret;
    let app = crate::app(ledger.clone(), config, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(Served {
        ledger,
        token,
        base,
        server,
        _directory: directory,
    })
}
