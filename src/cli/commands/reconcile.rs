//! `cairn reconcile`: drift between the ledger and the graph, found and repaired.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::config::{Config, Overrides};

/// Find drift between the ledger and the graph for a dataset (current heads missing from the
/// graph, graph revisions the ledger does not know or retired), and with --repair fix it.
/// Works on the ledger and the graph directly, like a worker.
#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    /// The dataset.
    #[arg(long)]
    dataset: String,
    /// Repair what is found (default: report only).
    #[arg(long)]
    repair: bool,
    /// Data directory (the embedded ledger).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// PostgreSQL ledger URL (also `CAIRN_LEDGER_URL`).
    #[arg(long)]
    ledger: Option<String>,
    /// TOML configuration file (graph settings; the password from CAIRN_GRAPH_PASSWORD).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl ReconcileArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let config = Config::load(
            &Overrides {
                data_dir: self.data_dir,
                config_file: self.config,
                ledger_url: self.ledger,
                ..Overrides::default()
            },
            env,
        )?;
        receipts::validate::dataset(&self.dataset)?;
        let Some(options) = &config.graph else {
            anyhow::bail!("no graph is configured: set graph.url (or CAIRN_GRAPH_URL)");
        };
        let ledger = crate::open_ledger(&config).await?;
        let files = gateways::ModelFiles::locate(&config.projection.models_dir)?;
        let chunker = std::sync::Arc::new(gateways::Chunker::new(
            files.tokenizer()?,
            config.projection.chunker,
        )?);
        let store = gateways::BoltGraphStore::open(options)
            .await
            .with_context(|| format!("opening the graph at {}", options.url))?;
        let stage = worker::GraphStage::new(
            ledger,
            chunker,
            std::sync::Arc::new(store),
            vec![std::sync::Arc::new(gateways::graph::links::LinkExtractor)],
            &crate::projection::generation(&config).id,
        );
        let report = stage
            .reconcile(&self.dataset, self.repair)
            .await
            .map_err(|failure| anyhow::anyhow!("{}: {}", failure.code, failure.message))?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!(
                "{} current heads checked in {}; {} missing from the graph, {} graph revisions \
                 unknown to the ledger, {} stale HEADs; {} repaired",
                report.checked,
                self.dataset,
                report.missing.len(),
                report.unknown.len(),
                report.stale_heads.len(),
                report.repaired
            );
            for (what, items) in [
                ("missing", &report.missing),
                ("unknown", &report.unknown),
                ("stale HEAD", &report.stale_heads),
            ] {
                for item in items {
                    println!("  {what}: {item}");
                }
            }
        }
        let clean =
            report.missing.is_empty() && report.unknown.is_empty() && report.stale_heads.is_empty();
        Ok(if clean || self.repair {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(3)
        })
    }
}
