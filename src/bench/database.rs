//! The benchmark database: what both sides of a PostgreSQL benchmark do to it between
//! scenarios.

use anyhow::Context;

/// `VACUUM (ANALYZE)` of the whole database at `url`, before a scenario's clock starts (as
/// `pgbench` does before its runs): each scenario, cairn's and apalis's alike, starts without
/// the dead rows and the autovacuum work the previous ones left.
pub(super) async fn vacuum(url: &str) -> anyhow::Result<()> {
    use sqlx::{ConnectOptions as _, Connection as _};
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    let mut connection = options.connect().await?;
    sqlx::query("VACUUM (ANALYZE)")
        .execute(&mut connection)
        .await
        .context("VACUUM before a scenario")?;
    connection.close().await?;
    Ok(())
}
