//! The command-line client: the HTTP client and the commands that talk to a running server
//! (`ingest`, `search`, `status`, `ops`), and `cairn token` on a data directory.

pub mod client;
pub mod commands;
pub mod generations;
pub mod ops;
pub mod tokens;

/// `cairn migrate`: applies the configured ledger's migrations and says what it did.
pub async fn migrate(config: &crate::config::Config) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let report = match &config.ledger.url {
        Some(url) => receipts::postgres::migrate(url).await,
        None => receipts::sqlite::migrate(&config.ledger_path()).await,
    }
    .with_context(|| format!("migrating the ledger ({})", config.ledger_description()))?;
    println!("ledger: {}", config.ledger_description());
    if report.applied.is_empty() {
        println!(
            "up to date: {} migration(s) already applied",
            report.already
        );
    } else {
        for migration in &report.applied {
            println!("applied {migration}");
        }
        println!(
            "{} applied now, {} already in place",
            report.applied.len(),
            report.already
        );
    }
    Ok(())
}
