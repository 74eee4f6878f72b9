//! Taking a backup while `cairn serve` runs: the ledger first, then each live generation's
//! store, then the manifest.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use gateways::VectorStores;
use receipts::model::{Backend, GenerationState};
use receipts::Ledger;

use super::manifest::{GenerationPart, LedgerPart, Manifest, EDGE_STORE, FORMAT};

/// A new backup's id: `backup-<unix seconds>-<random>`.
pub fn new_id() -> String {
    format!(
        "backup-{}-{}",
        unix_micros() / 1_000_000,
        &uuid::Uuid::now_v7().simple().to_string()[20..]
    )
}

/// Takes the backup `id` into the new folder `root/id`; answers its manifest and folder.
pub async fn take(
    ledger: &Arc<dyn Ledger>,
    stores: Option<&Arc<dyn VectorStores>>,
    root: &Path,
    id: &str,
    portable: bool,
    actor: &str,
    reason: &str,
) -> anyhow::Result<(Manifest, std::path::PathBuf)> {
    let started = Instant::now();
    let created_at = unix_micros();
    let id = id.to_owned();
    let folder = root.join(&id);
    anyhow::ensure!(!folder.exists(), "{} exists already", folder.display());
    std::fs::create_dir_all(&folder)
        .with_context(|| format!("creating the backup folder {}", folder.display()))?;
    tracing::info!(backup = %id, folder = %folder.display(), %actor, "backup started");

    // 1. The ledger, at one point of its history.
    // Each engine's own format, named for it: an SQLite file, or pg_dump's custom format.
    let written = folder.join("ledger.partial");
    let backup = ledger
        .backup_ledger(&written)
        .await
        .context("copying the ledger")?;
    let file_name = if backup.engine == "postgres" {
        "ledger.pgdump"
    } else {
        "ledger.db"
    };
    let ledger_file = folder.join(file_name);
    std::fs::rename(&written, &ledger_file)?;
    std::fs::File::open(&folder)?.sync_all()?;
    let (sha256, bytes) = gateways::vectors::file_sha256(&ledger_file)?;
    let ledger_part = LedgerPart {
        backup,
        file: gateways::vectors::BackupFile {
            path: file_name.to_owned(),
            bytes,
            sha256,
        },
    };

    // 2. Each live generation's store, after the ledger: it can only be ahead of it.
    let mut generations = Vec::new();
    for generation in ledger.generations().await? {
        if generation.state == GenerationState::Retired
            || !generation.backends.contains(&Backend::Vector)
        {
            continue;
        }
        let stores = stores.context(
            "this process holds no vector store (workers.count = 0 on the embedded store): \
             back up from the process that runs the workers",
        )?;
        let store = stores.store(&generation.id).await?;
        let (format, directory, copied) = if store.name() == "qdrant-edge" && !portable {
            let directory = format!("vectors/{}", generation.id);
            let copied = store
                .backup_to(&folder.join(&directory))
                .await
                .with_context(|| format!("copying the vectors of generation {}", generation.id))?;
            ("shard", directory, copied)
        } else {
            // The portable dump: read while the store serves (it can only be ahead of the
            // ledger), loadable into either store.
            std::fs::create_dir_all(folder.join("vectors"))?;
            let name = format!("{}.jsonl", generation.id);
            let path = folder.join("vectors").join(&name);
            let points = super::dump::write(store.as_ref(), &path)
                .await
                .with_context(|| format!("dumping the vectors of generation {}", generation.id))?;
            let (sha256, bytes) = gateways::vectors::file_sha256(&path)?;
            let copied = gateways::vectors::StoreBackup {
                files: vec![gateways::vectors::BackupFile {
                    path: name,
                    bytes,
                    sha256,
                }],
                points: usize::try_from(points).unwrap_or(usize::MAX),
                held_ms: 0.0,
            };
            ("dump", "vectors".to_owned(), copied)
        };
        tracing::info!(backup = %id, generation = %generation.id, format, points = copied.points, held_ms = copied.held_ms, "vector store copied");
        generations.push(GenerationPart {
            id: generation.id,
            model: generation.model,
            dimension: generation.dimension,
            chunker: generation.chunker,
            backends: generation.backends,
            state: generation.state,
            store: if store.name() == "qdrant-edge" {
                format!("qdrant-edge ({EDGE_STORE})")
            } else {
                store.name().to_owned()
            },
            format: format.to_owned(),
            directory,
            backup: copied,
        });
    }

    // 3. The manifest, last.
    let manifest = Manifest {
        format: FORMAT,
        id: id.clone(),
        cairn_version: env!("CARGO_PKG_VERSION").to_owned(),
        created_at,
        created_by: actor.to_owned(),
        reason: reason.to_owned(),
        ledger: ledger_part,
        generations,
        seconds: started.elapsed().as_secs_f64(),
        not_included: vec![
            "the graph: rebuilt after a restore with `cairn reconcile`".to_owned(),
            "the erasure journal: it stays with the data directory, and a restore replays it"
                .to_owned(),
        ],
    };
    manifest.write(&folder)?;
    tracing::info!(backup = %id, seconds = manifest.seconds, "backup written");
    Ok((manifest, folder))
}

pub(crate) fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
