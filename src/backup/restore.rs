//! `cairn restore`: a backup back into the data directory, with the installation stopped.
//!
//! Each step is checked before the next:
//! 1. `checked`: the manifest and every file's hash are checked. The restore is refused when:
//!    - anything uses the target (the data directory's lock);
//!    - the backup's schema is newer than this build's;
//!    - the clock is behind the backup's newest history entry;
//!    - there is no erasure journal, unless the operator accepts that erasures made after
//!      the backup come back.
//! 2. `set_aside`: the current ledger and vectors are moved into `before-restore-<time>/`.
//!    They are never deleted.
//! 3. `loaded`, `migrated`: the backup's ledger is copied in and opened, which migrates it
//!    forward.
//! 4. `leases_voided`: every running job goes back to pending with its lease cleared, and
//!    the restore is written in history.
//! 5. `journal_replayed`: erasures and revocations newer than the backup are made again
//!    through the normal paths.
//! 6. `stores_loaded`: each generation's shard is copied in. A shard of another store
//!    version is left out, and its generation is projected again.
//! 7. `verified`: a deep verify repairs what a store taken after the ledger can differ by
//!    (extra points, stale flags). A second deep pass must then find nothing: every
//!    verified receipt reads back, and every blob matches its hash.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use receipts::journal::{Journal, JournalKind};
use receipts::model::{PassChange, RestoreRecord, VerifyTier};
use receipts::{auth::TokenChange, ErasureRequest, Ledger, LedgerError};
use serde_json::{json, Value};

use super::manifest::{Manifest, EDGE_STORE};
use crate::config::Config;

/// What the operator asked.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The backup's folder.
    pub from: PathBuf,
    /// Restore even without an erasure journal (erasures after the backup come back).
    pub accept_resurrection: bool,
    /// Who restores.
    pub actor: String,
}

/// Prints one step, as a JSON line on stdout.
fn step(name: &str, detail: Value) {
    println!("{}", json!({"step": name, "detail": detail}));
}

/// Runs the restore; answers its report.
pub async fn restore(config: &Config, options: &RestoreOptions) -> anyhow::Result<Value> {
    // 1. checked
    crate::datadir::prepare(&config.data_dir)?;
    let _exclusive = crate::datadir::hold_exclusively(&config.data_dir)?;
    let manifest = Manifest::read(&options.from)?;
    let bytes = manifest.check_files(&options.from)?;
    let (engine, newest_schema) = match &config.ledger.url {
        Some(_) => ("postgres", receipts::postgres_schema_version()),
        None => ("sqlite", receipts::sqlite_schema_version()),
    };
    anyhow::ensure!(
        manifest.ledger.backup.engine == engine,
        "the backup's ledger is {} and this configuration's is {engine}: restore it with the \
         same engine (ledger.url)",
        manifest.ledger.backup.engine
    );
    if let Some(url) = &config.ledger.url {
        // Into a fresh database only: a restore never overwrites a ledger.
        use sqlx::{ConnectOptions, Connection};
        let mut connection = url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .context("the ledger URL")?
            .disable_statement_logging()
            .connect()
            .await
            .with_context(|| format!("connecting to {}", config.ledger_description()))?;
        let (tables, database_now): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = 'public'), \
               (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
        )
        .fetch_one(&mut connection)
        .await?;
        let _ = connection.close().await;
        anyhow::ensure!(
            tables == 0,
            "the database {} already holds {tables} tables: a restore loads into a fresh, \
             empty database (createdb), never over a ledger",
            config.ledger_description()
        );
        anyhow::ensure!(
            database_now >= manifest.ledger.backup.newest_at,
            "the database server's clock ({database_now}) is behind the backup's newest \
             history entry ({}): fix its clock first",
            manifest.ledger.backup.newest_at
        );
    }
    anyhow::ensure!(
        manifest.ledger.backup.schema_version <= newest_schema,
        "the backup's ledger has schema {} and this cairn knows up to {newest_schema}: restore \
         it with the cairn that wrote it ({})",
        manifest.ledger.backup.schema_version,
        manifest.cairn_version
    );
    let now = super::take::unix_micros();
    anyhow::ensure!(
        now >= manifest.ledger.backup.newest_at,
        "this machine's clock ({now}) is behind the backup's newest history entry ({}): a \
         restored ledger would order new changes before old ones; fix the clock first",
        manifest.ledger.backup.newest_at
    );
    let journal_path = config.journal_path();
    let journal = Journal::read(&journal_path)
        .with_context(|| format!("reading the erasure journal {}", journal_path.display()))?;
    if journal.is_none() && !options.accept_resurrection {
        anyhow::bail!(
            "there is no erasure journal at {}: erasures and token revocations made after the \
             backup would come back. Put the journal back, or pass --accept-resurrection to \
             restore anyway",
            journal_path.display()
        );
    }
    let later: Vec<_> = journal
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| entry.at > manifest.ledger.backup.newest_at)
        .collect();
    // A Qdrant server's collections must be empty: a restore never overwrites vectors.
    let stores = Arc::new(RestoredStores::new(config, &manifest));
    if config.vectors.is_some() {
        for generation in &manifest.generations {
            let store = gateways::VectorStores::store(stores.as_ref(), &generation.id).await?;
            let (points, _) = store.scroll_all(None, 1).await?;
            anyhow::ensure!(
                points.is_empty(),
                "the Qdrant collection {} already holds points: a restore never overwrites \
                 vectors; delete it, or restore under another vectors.collection_prefix",
                store.location()
            );
        }
    }
    step(
        "checked",
        json!({"backup": manifest.id, "bytes": bytes, "schema": manifest.ledger.backup.schema_version,
               "history_seq": manifest.ledger.backup.history_seq, "journal_entries_after": later.len()}),
    );

    // 2. set_aside
    let aside = config
        .data_dir
        .join(format!("before-restore-{}", now / 1_000_000));
    std::fs::create_dir_all(&aside)?;
    let mut moved = Vec::new();
    for name in ["ledger.db", "ledger.db-wal", "ledger.db-shm", "vectors"] {
        let path = config.data_dir.join(name);
        if path.exists() {
            std::fs::rename(&path, aside.join(name))
                .with_context(|| format!("moving {} aside", path.display()))?;
            moved.push(name);
        }
    }
    std::fs::File::open(&config.data_dir)?.sync_all()?;
    step(
        "set_aside",
        json!({"folder": aside.display().to_string(), "moved": moved,
               "undo": format!("stop cairn, then move {}/* back into {}", aside.display(), config.data_dir.display())}),
    );

    // 3. loaded, migrated (the journal's entries are replayed below, not journalled again)
    let ledger: Arc<dyn Ledger> = match &config.ledger.url {
        None => {
            let ledger_path = config.ledger_path();
            std::fs::copy(options.from.join(&manifest.ledger.file.path), &ledger_path)?;
            std::fs::File::open(&ledger_path)?.sync_all()?;
            let mut ledger_options = config.ledger_options();
            ledger_options.journal = None;
            Arc::new(
                receipts::SqliteLedger::open(ledger_options, Arc::new(receipts::SystemClock))
                    .await
                    .context("opening the restored ledger")?,
            )
        }
        Some(url) => {
            let program = config
                .pg_bin
                .as_ref()
                .map_or_else(|| PathBuf::from("pg_restore"), |bin| bin.join("pg_restore"));
            let output = tokio::process::Command::new(&program)
                .args([
                    "--no-owner",
                    "--no-privileges",
                    "--exit-on-error",
                    "--dbname",
                ])
                .arg(url)
                .arg(options.from.join(&manifest.ledger.file.path))
                .output()
                .await
                .with_context(|| format!("running {}", program.display()))?;
            anyhow::ensure!(
                output.status.success(),
                "pg_restore failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            let mut ledger_options = config.postgres_options(url);
            ledger_options.journal = None;
            Arc::new(
                receipts::PostgresLedger::open(ledger_options)
                    .await
                    .context("opening the restored ledger")?,
            )
        }
    };
    step(
        "migrated",
        json!({"ledger": config.ledger_description(), "to_schema": newest_schema}),
    );

    // 4. leases_voided
    let voided = ledger
        .record_restore(&RestoreRecord {
            backup_id: manifest.id.clone(),
            actor: options.actor.clone(),
            cause: format!(
                "restored from {} (taken {} by {}: {}); the ledger it replaced is in {}",
                options.from.display(),
                manifest.created_at,
                manifest.created_by,
                manifest.reason,
                aside.display()
            ),
        })
        .await?;
    step("leases_voided", json!({"voided": voided}));

    // 5. journal_replayed
    let (mut erased, mut revoked, mut access) = (0, 0, 0);
    for entry in &later {
        match entry.kind {
            JournalKind::Erase => {
                let (Some(dataset), Some(source_key)) = (&entry.dataset, &entry.source_key) else {
                    continue;
                };
                let request = ErasureRequest {
                    dataset: dataset.clone(),
                    source_key: source_key.clone(),
                    actor: entry.actor.clone(),
                    reason: format!(
                        "{} (replayed by the restore of {})",
                        entry.reason, manifest.id
                    ),
                };
                match ledger.erase(request).await {
                    Ok(_) => erased += 1,
                    Err(LedgerError::SourceNotFound { .. }) => {}
                    Err(error) => return Err(error).context("replaying an erasure"),
                }
            }
            JournalKind::Revoke => {
                let Some(id) = entry.token_id else { continue };
                let change = TokenChange::Revoke {
                    id,
                    actor: entry.actor.clone(),
                    reason: Some(format!(
                        "{} (replayed by the restore of {})",
                        entry.reason, manifest.id
                    )),
                };
                match ledger.change_token(change).await {
                    Ok(_) => revoked += 1,
                    Err(LedgerError::TokenNotFound(_) | LedgerError::TokenRevoked(_)) => {}
                    Err(error) => return Err(error).context("replaying a revocation"),
                }
            }
            JournalKind::Access => {
                let note = format!("replayed by the restore of {}", manifest.id);
                let Some(change) = entry.access_change(&note) else {
                    continue;
                };
                ledger
                    .change_access(change)
                    .await
                    .context("replaying an access change")?;
                access += 1;
            }
        }
    }
    step(
        "journal_replayed",
        json!({"erasures": erased, "revocations": revoked, "access_changes": access}),
    );

    // 6. stores_loaded
    let mut loaded = Vec::new();
    for generation in &manifest.generations {
        let from = options.from.join(&generation.directory);
        let points = match (generation.format.as_str(), config.vectors.is_some()) {
            ("shard", false) if generation.store.contains(EDGE_STORE) => {
                copy_folder(&from, &config.data_dir.join("vectors").join(&generation.id))?;
                generation.backup.points as u64
            }
            ("shard", _) if !generation.store.contains(EDGE_STORE) => {
                loaded.push(json!({"generation": generation.id, "loaded": false,
                    "why": format!("written by {}, this build runs {EDGE_STORE}: projected again", generation.store)}));
                continue;
            }
            ("shard", true) => {
                // Embedded to a server: the shard is opened from a scratch copy and streamed.
                let scratch = config
                    .data_dir
                    .join(format!("restore-scratch-{}", generation.id));
                copy_folder(&from, &scratch)?;
                let dimension = usize::try_from(generation.dimension).unwrap_or(0);
                let shard = gateways::EdgeVectorStore::open(&scratch, dimension)?;
                let target = gateways::VectorStores::store(stores.as_ref(), &generation.id).await?;
                let copied = stream(&shard, target.as_ref()).await?;
                drop(shard);
                std::fs::remove_dir_all(&scratch)?;
                copied
            }
            _ => {
                let file = generation
                    .backup
                    .files
                    .first()
                    .context("a dump generation names its file")?;
                let target = gateways::VectorStores::store(stores.as_ref(), &generation.id).await?;
                super::dump::load(&from.join(&file.path), target.as_ref()).await?
            }
        };
        loaded.push(json!({"generation": generation.id, "format": generation.format, "loaded": true, "points": points}));
    }
    step("stores_loaded", json!({"generations": loaded}));

    // 7. verified: repair what a later store differs by, then prove it.
    let verifier = verify::Verifier::new(
        ledger.clone(),
        Some(stores.clone() as Arc<dyn gateways::VectorStores>),
        verify::VerifySettings {
            interval: None,
            points_per_second: u32::MAX,
            ..verify::VerifySettings::default()
        },
    );
    let mut passes = Vec::new();
    for generation in ledger.generations().await? {
        if generation.state == receipts::GenerationState::Retired {
            continue;
        }
        for repair in [true, false] {
            let pass = ledger
                .change_pass(PassChange::Start {
                    tier: VerifyTier::Deep,
                    generation: generation.id.clone(),
                    repair,
                    actor: options.actor.clone(),
                    reason: format!("restore of {}", manifest.id),
                })
                .await?;
            let ended = verifier.run(pass).await?;
            let drift = ledger.pass_drift(ended.id).await?;
            passes.push(
                json!({"generation": generation.id, "repair": repair, "pass": ended.id,
                "drift": ended.drift}),
            );
            if !repair && !drift.is_empty() {
                for record in &drift {
                    println!("{}", serde_json::to_string(record)?);
                }
                let _ = stores.close().await;
                anyhow::bail!(
                    "the restored installation still has {} drift after repair (listed above): \
                     start cairn so its workers project what is missing, then run `cairn \
                     verify --tier deep`; the ledger it replaced is in {}",
                    drift.len(),
                    aside.display()
                );
            }
        }
    }
    stores.close().await?;
    step("verified", json!({"passes": passes}));
    Ok(
        json!({"restored": manifest.id, "set_aside": aside.display().to_string(),
              "leases_voided": voided, "erasures_replayed": erased, "revocations_replayed": revoked}),
    )
}

/// Every point of `from`, page by page, into `to`.
async fn stream(
    from: &dyn gateways::VectorStore,
    to: &dyn gateways::VectorStore,
) -> anyhow::Result<u64> {
    let mut after = None;
    let mut points = 0;
    loop {
        let (page, next) = from.scroll_all(after, 1000).await?;
        points += page.len() as u64;
        to.put_points(page).await?;
        match next {
            Some(next) => after = Some(next),
            None => return Ok(points),
        }
    }
}

/// The restored installation's stores, each opened with its generation's dimension
/// (whatever model this build's configuration names): shards under the data directory, or
/// collections on the configured Qdrant server.
struct RestoredStores {
    root: PathBuf,
    server: Option<gateways::ServerOptions>,
    dimensions: std::collections::HashMap<String, usize>,
    opened: tokio::sync::Mutex<std::collections::HashMap<String, Arc<dyn gateways::VectorStore>>>,
}

impl RestoredStores {
    fn new(config: &Config, manifest: &Manifest) -> RestoredStores {
        RestoredStores {
            root: config.data_dir.join("vectors"),
            server: config.vectors.clone(),
            dimensions: manifest
                .generations
                .iter()
                .map(|g| (g.id.clone(), usize::try_from(g.dimension).unwrap_or(0)))
                .collect(),
            opened: tokio::sync::Mutex::default(),
        }
    }

    async fn close(&self) -> anyhow::Result<()> {
        let opened = std::mem::take(&mut *self.opened.lock().await);
        for (generation, store) in opened {
            store
                .close()
                .await
                .with_context(|| format!("closing the shard of generation {generation}"))?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl gateways::VectorStores for RestoredStores {
    async fn store(
        &self,
        generation: &str,
    ) -> Result<Arc<dyn gateways::VectorStore>, gateways::GatewayError> {
        let mut opened = self.opened.lock().await;
        if let Some(store) = opened.get(generation) {
            return Ok(store.clone());
        }
        let dimension = self.dimensions.get(generation).copied().ok_or_else(|| {
            gateways::GatewayError::Config(format!(
                "generation {generation} has no vectors in the backup"
            ))
        })?;
        let store: Arc<dyn gateways::VectorStore> = match &self.server {
            Some(options) => {
                Arc::new(gateways::ServerVectorStore::open(options, generation, dimension).await?)
            }
            None => {
                let path = self.root.join(generation);
                Arc::new(
                    tokio::task::spawn_blocking(move || {
                        gateways::EdgeVectorStore::open(&path, dimension)
                    })
                    .await
                    .map_err(|error| gateways::GatewayError::Config(error.to_string()))??,
                )
            }
        };
        opened.insert(generation.to_owned(), store.clone());
        Ok(store)
    }
}

/// Copies a folder recursively, fsyncing each file.
fn copy_folder(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_folder(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
            std::fs::File::open(&target)?.sync_all()?;
        }
    }
    std::fs::File::open(to)?.sync_all()?;
    Ok(())
}
