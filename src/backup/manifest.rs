//! The manifest: what a backup holds, with every file's hash, written last.

use std::path::{Path, PathBuf};

use anyhow::Context;
use gateways::vectors::{BackupFile, StoreBackup};
use receipts::model::{Backend, GenerationState, LedgerBackup};
use serde::{Deserialize, Serialize};

/// The manifest's format; a restore refuses another.
pub const FORMAT: u32 = 1;

/// The manifest's file name.
pub const FILE: &str = "manifest.json";

/// What a backup holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The backup's id (its folder's name).
    pub id: String,
    /// The cairn that wrote it.
    pub cairn_version: String,
    /// When it started (epoch microseconds).
    pub created_at: i64,
    /// Who asked.
    pub created_by: String,
    /// Why.
    pub reason: String,
    /// The ledger copy.
    pub ledger: LedgerPart,
    /// Each live generation with a vector store.
    pub generations: Vec<GenerationPart>,
    /// Seconds the backup took.
    pub seconds: f64,
    /// What is not in the backup, and how it comes back.
    pub not_included: Vec<String>,
}

/// The ledger copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerPart {
    /// Engine, schema, position in history, counts.
    #[serde(flatten)]
    pub backup: LedgerBackup,
    /// The file.
    pub file: BackupFile,
}

/// One generation's store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationPart {
    /// The generation.
    pub id: String,
    /// Its embedding model.
    pub model: String,
    /// Its dimension.
    pub dimension: i64,
    /// Its chunker settings.
    pub chunker: String,
    /// Its backends.
    pub backends: Vec<Backend>,
    /// Its state when the backup was taken.
    pub state: GenerationState,
    /// The store (`qdrant-edge`, `qdrant-server`) and the version of its engine.
    pub store: String,
    /// `shard` (qdrant-edge's files, copied) or `dump` (the portable dump, any store).
    pub format: String,
    /// The folder its files are in, inside the backup (`vectors/<generation>` for a shard,
    /// `vectors` for a dump).
    pub directory: String,
    /// Its files and points, and how long its writes were held.
    #[serde(flatten)]
    pub backup: StoreBackup,
}

/// The engine version the embedded store's files belong to: a restore copies shards only
/// into the same.
pub const EDGE_STORE: &str = "qdrant-edge 0.7.0";

impl Manifest {
    /// Reads the manifest of the backup at `folder`.
    pub fn read(folder: &Path) -> anyhow::Result<Manifest> {
        let path = folder.join(FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{} has no readable {FILE}: it is not a complete backup (the manifest is \
                 written last)",
                folder.display()
            )
        })?;
        let manifest: Manifest = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a cairn backup manifest", path.display()))?;
        anyhow::ensure!(
            manifest.format == FORMAT,
            "{} has format {}; this cairn reads format {FORMAT}",
            path.display(),
            manifest.format
        );
        Ok(manifest)
    }

    /// Writes the manifest into `folder` durably: a temporary file, fsynced, renamed, and the
    /// folder fsynced.
    pub fn write(&self, folder: &Path) -> anyhow::Result<PathBuf> {
        let path = folder.join(FILE);
        let temporary = folder.join(format!("{FILE}.tmp"));
        std::fs::write(&temporary, serde_json::to_vec_pretty(self)?)?;
        std::fs::File::open(&temporary)?.sync_all()?;
        std::fs::rename(&temporary, &path)?;
        std::fs::File::open(folder)?.sync_all()?;
        Ok(path)
    }

    /// Checks every file the manifest names against its size and hash; answers the bytes
    /// checked.
    pub fn check_files(&self, folder: &Path) -> anyhow::Result<u64> {
        let mut files: Vec<(PathBuf, &BackupFile)> = vec![(folder.to_owned(), &self.ledger.file)];
        for generation in &self.generations {
            let base = folder.join(&generation.directory);
            files.extend(
                generation
                    .backup
                    .files
                    .iter()
                    .map(|file| (base.clone(), file)),
            );
        }
        let mut bytes = 0;
        for (base, file) in files {
            anyhow::ensure!(
                !file
                    .path
                    .split('/')
                    .any(|part| part == ".." || part.is_empty()),
                "the manifest names a file outside the backup: {}",
                file.path
            );
            let path = base.join(&file.path);
            let (sha256, size) = gateways::vectors::file_sha256(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            anyhow::ensure!(
                size == file.bytes && sha256 == file.sha256,
                "{} does not match the manifest (expected {} bytes, sha256 {}; found {size} \
                 bytes, sha256 {sha256}): the backup is damaged",
                path.display(),
                file.bytes,
                file.sha256
            );
            bytes += size;
        }
        Ok(bytes)
    }
}
