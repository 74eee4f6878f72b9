//! `cairn generation`: build a projection generation beside the active one, follow it, switch, roll
//! back, retire.

use std::collections::HashMap;
use std::process::ExitCode;

use super::ClientArgs;

/// Projection generations: build one beside the active one, follow it, switch, roll back,
/// retire (through the ops API; changes need an admin token).
#[derive(Debug, clap::Args)]
pub struct GenerationArgs {
    #[command(subcommand)]
    command: GenerationCommand,
    /// Print the server's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Subcommand)]
enum GenerationCommand {
    /// Every generation with its state and progress (verified heads, rate, ETA, failures).
    Status,
    /// Build a new generation beside the active one: one low-priority rebuild job per current
    /// head; new documents are projected into both. Unset settings come from the server.
    Create {
        /// Embedding model: a local model's id (e.g.
        /// `sentence-transformers/all-MiniLM-L6-v2@int8`), or `remote` for the configured
        /// embedding server's (default: the server's own model).
        #[arg(long)]
        model: Option<String>,
        /// Most tokens per chunk.
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Tokens shared by neighbouring chunks.
        #[arg(long)]
        overlap_tokens: Option<usize>,
        /// Backends, comma-separated (relational,vector).
        #[arg(long, value_delimiter = ',')]
        backends: Option<Vec<String>>,
        /// Priority of the rebuild jobs (default -10: fresh ingest goes first).
        #[arg(long, allow_hyphen_values = true)]
        priority: Option<i64>,
        /// Why (history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Make a generation the active one in one step (refused while heads are missing in it).
    Switch {
        /// The generation id (`g-...`).
        id: String,
        /// Switch even with heads not yet verified in it (they are named).
        #[arg(long)]
        force: bool,
        /// Why (history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Retire a generation that is not active: cancel its work, delete its chunk rows and
    /// vectors, read back that they are gone.
    Retire {
        /// The generation id (`g-...`).
        id: String,
        /// Why (history).
        #[arg(long)]
        reason: Option<String>,
    },
}

impl GenerationArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let GenerationArgs {
            command,
            json,
            client,
        } = self;
        let api = client.connect()?;
        use crate::cli::generations as generation;
        match command {
            GenerationCommand::Status => generation::status(&api, json).await?,
            GenerationCommand::Create {
                model,
                max_tokens,
                overlap_tokens,
                backends,
                priority,
                reason,
            } => {
                let settings = generation::Settings {
                    model,
                    max_tokens,
                    overlap_tokens,
                    backends,
                    priority,
                };
                generation::create(&api, settings, reason, json).await?
            }
            GenerationCommand::Switch { id, force, reason } => {
                generation::act(&api, "switch", &id, force, reason, json).await?
            }
            GenerationCommand::Retire { id, reason } => {
                generation::act(&api, "retire", &id, false, reason, json).await?
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
