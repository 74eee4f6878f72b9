//! `cairn token`: create, list, rotate and revoke API tokens, on the data directory or the
//! configured ledger directly.

use std::collections::HashMap;
use std::process::ExitCode;

use clap::Subcommand;

use super::whoami;
use super::StoreArgs;

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token and print its secret (shown once).
    Create {
        /// Name, recorded as the actor `token:<name>`.
        #[arg(long)]
        name: String,
        /// Scopes: ingest, search, ops:read, ops:write, admin.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// Limit the token to these datasets (repeatable).
        #[arg(long = "dataset")]
        datasets: Vec<String>,
        /// Lifetime: 90d, 12h, 30m, 45s (default: no expiry).
        #[arg(long)]
        expires_in: Option<String>,
        /// The identity it reads as, `user:<name>` or `service:<name>`: it then sees only
        /// the documents that name it or its groups as readers (default: every document of
        /// its datasets).
        #[arg(long)]
        principal: Option<String>,
        /// A group of the principal (`eng` or `group:eng`; repeatable).
        #[arg(long = "group", requires = "principal")]
        groups: Vec<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List tokens: id, name, state, scopes, datasets, expiry (never a secret).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Revoke a token: it stops working at once, in every process.
    Revoke {
        /// Token id (`cairn token list`).
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Replace a token's secret (same name, scopes, datasets); print the new one (shown once).
    Rotate {
        /// Token id (`cairn token list`).
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
        /// The new token's lifetime (default: the old one's, counted from now).
        #[arg(long)]
        expires_in: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
}

impl TokenCommand {
    fn store(&self) -> &StoreArgs {
        match self {
            TokenCommand::Create { store, .. }
            | TokenCommand::List { store, .. }
            | TokenCommand::Revoke { store, .. }
            | TokenCommand::Rotate { store, .. } => store,
        }
    }
}

/// Manage API tokens (works on the data directory directly).
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

impl TokenArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let TokenArgs { command } = self;
        let config = command.store().load(env)?;
        let ledger = crate::open_ledger(&config).await?;
        let actor = format!("cli:{}", whoami());
        match command {
            TokenCommand::Create {
                name,
                scopes,
                datasets,
                expires_in,
                principal,
                groups,
                ..
            } => {
                let identity = principal
                    .map(|principal| receipts::access::Identity::new(&principal, &groups))
                    .transpose()?;
                crate::cli::tokens::create(
                    ledger.as_ref(),
                    actor,
                    name,
                    &scopes,
                    datasets,
                    identity,
                    expires_in.as_deref(),
                )
                .await?
            }
            TokenCommand::List { json, .. } => {
                crate::cli::tokens::list(ledger.as_ref(), json).await?
            }
            TokenCommand::Revoke { id, reason, .. } => {
                crate::cli::tokens::revoke(ledger.as_ref(), actor, &id, reason).await?
            }
            TokenCommand::Rotate {
                id,
                reason,
                expires_in,
                ..
            } => {
                crate::cli::tokens::rotate(
                    ledger.as_ref(),
                    actor,
                    &id,
                    reason,
                    expires_in.as_deref(),
                )
                .await?
            }
        }

        Ok(ExitCode::SUCCESS)
    }
}
