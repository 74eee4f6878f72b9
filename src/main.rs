//! `cairn`: the list of commands. Each command's flags and behaviour live in
//! `cairn::cli::commands`; this file parses them, sets up logging and runs one.

use std::collections::HashMap;
use std::process::ExitCode;

use cairn::cli::commands;
use clap::{Parser, Subcommand};

/// cairn: durable ingest and projection.
#[derive(Debug, Parser)]
#[command(name = "cairn", version, about)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_parser = ["human", "json"], default_value = "human", env = "CAIRN_LOG_FORMAT")]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API (and, with workers.count > 0, the workers) on the embedded SQLite ledger in
    /// --data-dir, or on a PostgreSQL ledger with --ledger.
    Serve(commands::ServeArgs),
    /// Run projection workers on the data directory in a process of their own (for a data
    /// directory whose `cairn serve` runs with workers.count = 0, or none running: one process
    /// owns the embedded vector store).
    Worker(commands::WorkerArgs),
    /// Send files and folders to cairn through the batch API.
    Ingest(commands::IngestArgs),
    /// Search current revisions (vector and lexical, fused) and print a table.
    Search(commands::SearchArgs),
    /// The sources linked to a source in the graph, and their tags.
    Graph(commands::GraphArgs),
    /// Find (and with --repair fix) drift between the ledger and the graph for a dataset.
    Reconcile(commands::ReconcileArgs),
    /// Operations: what is running, retrying, dead; requeue, cancel, pause, resume.
    Ops(commands::OpsArgs),
    /// Connectors: keep a dataset equal to a folder, deletions included (add, list, show,
    /// runs, run, pause, resume, remove).
    Connector(commands::ConnectorArgs),
    /// Webhooks: subscriptions to events, signed and delivered at least once (create, list,
    /// show, pause, resume, rotate-secret, delete, deliveries, retry, discard, replay).
    Webhook(commands::WebhookArgs),
    /// Projection generations: build one beside the active one, follow it, switch, roll
    /// back, retire.
    Generation(commands::GenerationArgs),
    /// Server health and counts.
    Status(commands::StatusArgs),
    /// Block exact content (by SHA-256) in a dataset.
    Block(commands::BlockArgs),
    /// Who may read a source: show it, or set its readers without a new revision.
    Access(commands::AccessArgs),
    /// Erase a source: every trace of every revision, in every store.
    Erase(commands::EraseArgs),
    /// OAuth sign-in: `check` prints what cairn makes of an access token.
    Auth(commands::AuthArgs),
    /// A source's validity timeline: its assertions, and which revision held when.
    Timeline(commands::TimelineArgs),
    /// Manage API tokens (works on the data directory directly).
    Token(commands::TokenArgs),
    /// Retrieval quality through the API.
    Eval(commands::EvalArgs),
    /// Apply the ledger's migrations and say what was done (`serve` and `worker` also run
    /// them at start).
    Migrate(commands::MigrateArgs),
    /// Benchmarks that write JSON.
    Bench(commands::BenchArgs),
    /// Hooks for coding hosts: `prompt-submit` prints cairn's hits for a prompt as untrusted
    /// context (never fails the host).
    Hook(commands::HookArgs),
    /// The MCP server over stdio for local hosts, through a running cairn (token in
    /// `CAIRN_TOKEN`).
    Mcp(commands::McpArgs),
    /// Checks every store against the ledger's receipts (chunk rows, vectors, bytes), through a
    /// running cairn; prints drift as JSON lines. Exit 0 clean, 1 drift, 2 error.
    Verify(commands::VerifyArgs),
    /// Takes a consistent backup while cairn runs (the ledger, then every live generation's
    /// vectors, then a manifest), through a running cairn.
    Backup(commands::BackupArgs),
    /// Restores a backup into the data directory with cairn stopped, and proves it with a
    /// full verify.
    Restore(commands::RestoreArgs),
}

fn init_tracing(format: &str) {
    // qdrant-edge warns at start-up about process-wide flags that only a Qdrant server sets;
    // its real warnings and errors still show.
    let quiet = "qdrant_edge::common::flags=error,qdrant_edge::common::mmap=error";
    let filter = tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
        .map(|filter| {
            quiet
                .split(',')
                .filter_map(|directive| directive.parse().ok())
                .fold(filter, |filter, directive| filter.add_directive(directive))
        })
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("info,{quiet}")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let env: HashMap<String, String> = std::env::vars().collect();
    match cli.command {
        Command::Serve(command) => command.run(&env).await,
        Command::Worker(command) => command.run(&env).await,
        Command::Ingest(command) => command.run(&env).await,
        Command::Search(command) => command.run(&env).await,
        Command::Graph(command) => command.run(&env).await,
        Command::Reconcile(command) => command.run(&env).await,
        Command::Ops(command) => command.run(&env).await,
        Command::Connector(command) => command.run(&env).await,
        Command::Webhook(command) => command.run().await,
        Command::Generation(command) => command.run(&env).await,
        Command::Status(command) => command.run(&env).await,
        Command::Block(command) => command.run(&env).await,
        Command::Access(command) => command.run(&env).await,
        Command::Erase(command) => command.run(&env).await,
        Command::Auth(command) => command.run(&env).await,
        Command::Timeline(command) => command.run(&env).await,
        Command::Token(command) => command.run(&env).await,
        Command::Eval(command) => command.run(&env).await,
        Command::Migrate(command) => command.run(&env).await,
        Command::Bench(command) => command.run(&env).await,
        Command::Hook(command) => command.run(&env).await,
        Command::Mcp(command) => command.run(&env).await,
        Command::Verify(command) => command.run(&env).await,
        Command::Backup(command) => command.run(&env).await,
        Command::Restore(command) => command.run(&env).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(&cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
