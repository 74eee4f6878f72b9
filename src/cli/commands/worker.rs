//! `cairn worker`: projection workers in a process of their own.

use std::collections::HashMap;
use std::process::ExitCode;

use super::NodeArgs;

/// Run projection workers on the data directory in a process of their own (for a data
/// directory whose `cairn serve` runs with workers.count = 0, or none running: one process
/// owns the embedded vector store).
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Runs at once, a unit of small jobs counting as one (default: `workers.concurrency`).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Lease owner name (default: host-pid).
    #[arg(long)]
    owner: Option<String>,
    /// Fault-injection setting for tests of the job lifecycle: instead of projecting, every
    /// job sleeps this many milliseconds and completes.
    #[arg(long, hide = true)]
    simulate_work_ms: Option<u64>,
}

impl WorkerArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let WorkerArgs {
            node,
            concurrency,
            owner,
            simulate_work_ms,
        } = self;
        let config = node.load(None, env)?;
        // Signals are handled from here on, through the model's loading.
        let shutdown = crate::shutdown_signal();
        let options = crate::WorkOptions {
            concurrency: concurrency.unwrap_or(config.workers.concurrency),
            owner,
            simulate_work: simulate_work_ms.map(std::time::Duration::from_millis),
        };
        crate::work(config, options, shutdown).await?;
        Ok(ExitCode::SUCCESS)
    }
}
