//! `cairn eval`: retrieval quality through the API.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::{file_config, write_report};

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// nDCG@10 and recall@100 of every mode on a BEIR data set, on a temporary cairn.
    Beir {
        /// The data set's directory (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv).
        directory: PathBuf,
        /// The qrels split.
        #[arg(long, default_value = "train")]
        split: String,
        /// Use only the first N documents (0: all); keeps the queries they fully cover.
        #[arg(long, default_value_t = 0)]
        limit_docs: usize,
        /// Then supersede 20% and delete 10% of the documents and evaluate again.
        #[arg(long)]
        churn: bool,
        /// Budget per search in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        budget_ms: u64,
        /// Modes to evaluate (comma-separated); `lexical` alone skips projection.
        #[arg(long, value_delimiter = ',', default_values_t = ["vector".to_owned(), "lexical".to_owned(), "auto".to_owned()])]
        modes: Vec<String>,
        /// Keep the data in this directory (and reuse an earlier run's) instead of a
        /// temporary one.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Qdrant server gRPC URL, or a cluster's nodes separated by commas (also
        /// `CAIRN_VECTORS_URL`): measure the networked store, in a collection of this run's own.
        #[arg(long)]
        vectors: Option<String>,
        /// Models to compare, one generation each (comma-separated; e.g.
        /// `sentence-transformers/all-MiniLM-L6-v2,sentence-transformers/all-MiniLM-L6-v2@int8`
        /// or `remote`): the first is projected, each further one built as a new generation
        /// beside it, switched to and evaluated.
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
        /// TOML configuration file (projection and search settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report.
        #[arg(long, default_value = "eval-beir.json")]
        out: PathBuf,
    },
}

/// Retrieval quality through the API.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    command: EvalCommand,
}

impl EvalArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let EvalArgs {
            command:
                EvalCommand::Beir {
                    directory,
                    split,
                    limit_docs,
                    churn,
                    budget_ms,
                    modes,
                    data_dir,
                    vectors,
                    config,
                    out,
                    models,
                },
        } = self;
        let config = file_config(config, vectors, env)?;
        let report = crate::eval::beir(
            &config,
            crate::eval::BeirEval {
                directory,
                split,
                limit_docs,
                churn,
                budget_ms,
                modes,
                data_dir,
                models,
            },
        )
        .await?;
        write_report(&out, &report)?;

        Ok(ExitCode::SUCCESS)
    }
}
