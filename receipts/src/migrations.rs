//! The engines' migrations, embedded in the binary at build time (`build.rs` lists
//! `migrations/<engine>/`), handed to sqlx's migrator. A migration is identified as sqlx's own
//! `migrate!` identified it (version from the file name's prefix, description from the rest,
//! checksum over the SQL), so ledgers migrated by earlier builds stay valid.
use std::{borrow::Cow, future::Future, pin::Pin};

use sqlx::{
    error::BoxDynError,
    migrate::{MigrateError, Migration, MigrationSource, MigrationType, Migrator},
};

include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// One engine's embedded migrations: (file name, SQL).
#[derive(Debug, Clone, Copy)]
struct Embedded(&'static [(&'static str, &'static str)]);

impl<'s> MigrationSource<'s> for Embedded {
    fn resolve(
        self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send + 's>> {
        Box::pin(async move {
            let mut migrations = self
                .0
                .iter()
                .map(|(name, sql)| migration(name, sql))
                .collect::<Result<Vec<_>, _>>()?;
            migrations.sort_by_key(|migration| migration.version);
            Ok(migrations)
        })
    }
}

/// `0007_graph_jobs.sql` is version 7, "graph jobs".
fn migration(name: &str, sql: &'static str) -> Result<Migration, BoxDynError> {
    let (version, rest) = name
        .split_once('_')
        .ok_or_else(|| format!("migration {name:?} is not named <version>_<description>.sql"))?;
    let version: i64 = version
        .parse()
        .map_err(|_| format!("migration {name:?} does not start with an integer version"))?;
    let migration_type = MigrationType::from_filename(rest);
    let description = rest
        .trim_end_matches(migration_type.suffix())
        .replace('_', " ");
    Ok(Migration::new(
        version,
        Cow::Owned(description),
        migration_type,
        Cow::Borrowed(sql),
        sql.starts_with("-- no-transaction"),
    ))
}

/// The SQLite ledger's migrator.
pub(crate) async fn sqlite() -> Result<Migrator, MigrateError> {
    Migrator::new(Embedded(SQLITE)).await
}

/// The PostgreSQL ledger's migrator.
pub(crate) async fn postgres() -> Result<Migrator, MigrateError> {
    Migrator::new(Embedded(POSTGRES)).await
}

/// The newest schema version this build's SQLite migrations reach (a restore refuses a
/// newer backup).
pub fn sqlite_schema_version() -> i64 {
    newest(SQLITE)
}

/// The newest schema version this build's PostgreSQL migrations reach.
pub fn postgres_schema_version() -> i64 {
    newest(POSTGRES)
}

fn newest(migrations: &[(&str, &str)]) -> i64 {
    migrations
        .iter()
        .filter_map(|(name, _)| name.split_once('_')?.0.parse::<i64>().ok())
        .max()
        .unwrap_or(0)
}
