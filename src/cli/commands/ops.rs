//! `cairn ops`: what is running, retrying, dead; requeue, cancel, pause, resume.

use std::collections::HashMap;
use std::process::ExitCode;

use clap::Subcommand;

use super::ClientArgs;

/// Filters shared by the ops listings and bulk actions.
#[derive(Debug, Clone, clap::Args)]
struct OpsFilter {
    /// Only this dataset.
    #[arg(long)]
    dataset: Option<String>,
    /// Only jobs whose last error has this code.
    #[arg(long)]
    error_code: Option<String>,
    /// Only these states (comma-separated).
    #[arg(long)]
    state: Option<String>,
    /// Source key text, or a job or revision id.
    #[arg(long)]
    query: Option<String>,
}

impl From<OpsFilter> for crate::cli::ops::Filter {
    fn from(filter: OpsFilter) -> Self {
        Self {
            dataset: filter.dataset,
            error_code: filter.error_code,
            state: filter.state,
            q: filter.query,
        }
    }
}

/// One job by id, or every job matching the filters.
#[derive(Debug, Clone, clap::Args)]
struct OpsAction {
    /// Job id (omit to act by filter).
    id: Option<String>,
    #[command(flatten)]
    filter: OpsFilter,
    /// Why (recorded in history).
    #[arg(long)]
    reason: Option<String>,
    /// Act on every match (without it a bulk action only lists the candidates).
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Subcommand)]
enum OpsCommand {
    /// Queue depth, throughput, latency percentiles, lease health, pauses.
    Status,
    /// Running jobs with their worker, stage, lease and heartbeat.
    Leases {
        #[command(flatten)]
        filter: OpsFilter,
        /// Most rows.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Jobs waiting to retry: when, the rule that set it, every error so far.
    Retries {
        #[command(flatten)]
        filter: OpsFilter,
        /// Most rows.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Dead, quarantined and cancelled jobs with the reason.
    Dead {
        #[command(flatten)]
        filter: OpsFilter,
        /// Most rows.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One job: history, receipts with read-back evidence, the revision chain.
    Job {
        /// Job id.
        id: String,
    },
    /// Requeue one job, or (without an id) every dead/quarantined/cancelled job matching the
    /// filters: a dry run unless --yes.
    Requeue(OpsAction),
    /// Cancel one job, or (without an id) every waiting or running job matching the filters:
    /// a dry run unless --yes.
    Cancel(OpsAction),
    /// Stop claiming (one dataset, or all).
    Pause {
        /// Dataset (default: every dataset).
        #[arg(long)]
        dataset: Option<String>,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Claim again.
    Resume {
        /// Dataset (default: the pause of every dataset).
        #[arg(long)]
        dataset: Option<String>,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Operations: what is running, retrying, dead; requeue, cancel, pause, resume.
#[derive(Debug, clap::Args)]
pub struct OpsArgs {
    #[command(subcommand)]
    command: OpsCommand,
    /// Print the server's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl OpsArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let OpsArgs {
            command,
            json,
            client,
        } = self;
        let api = client.connect()?;
        run_ops(&api, command, json).await?;

        Ok(ExitCode::SUCCESS)
    }
}

async fn run_ops(
    api: &crate::cli::client::Client,
    command: OpsCommand,
    json: bool,
) -> anyhow::Result<()> {
    use crate::cli::ops::{self as ops_cli, Target};
    async fn act(
        api: &crate::cli::client::Client,
        name: &str,
        action: OpsAction,
        json: bool,
    ) -> anyhow::Result<()> {
        let target = match action.id {
            Some(id) => Target::Job(id),
            None => Target::Matching(action.filter.into()),
        };
        ops_cli::act(api, name, target, action.reason, action.yes, json).await
    }
    match command {
        OpsCommand::Status => ops_cli::status(api, json).await,
        OpsCommand::Leases { filter, limit } => {
            ops_cli::leases(api, &filter.into(), limit, json).await
        }
        OpsCommand::Retries { filter, limit } => {
            ops_cli::retries(api, &filter.into(), limit, json).await
        }
        OpsCommand::Dead { filter, limit } => ops_cli::dead(api, &filter.into(), limit, json).await,
        OpsCommand::Job { id } => ops_cli::job(api, &id, json).await,
        OpsCommand::Requeue(action) => act(api, "requeue", action, json).await,
        OpsCommand::Cancel(action) => act(api, "cancel", action, json).await,
        OpsCommand::Pause { dataset, reason } => {
            ops_cli::pause(api, "pause", dataset, reason, json).await
        }
        OpsCommand::Resume { dataset, reason } => {
            ops_cli::pause(api, "resume", dataset, reason, json).await
        }
    }
}
