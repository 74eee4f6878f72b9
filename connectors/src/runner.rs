//! A connector's run: the `sync` job's work. It lists the folder, hashes only what its index
//! does not vouch for, compares with what the connector owns ([`receipts::sync::difference`]),
//! submits new and changed files through the same acceptance as the API, tombstones what is
//! gone, and records its index and report after every batch, fenced by its lease.
//!
//! ## Invariants
//! - Nothing is lost to a crash: every step is idempotent (acceptance by content, tombstones
//!   of live heads only), and the index only vouches for what a committed batch accepted, so
//!   the next lease finishes the work.
//! - A folder that is missing or unreadable fails the run (retryable), never empties the
//!   dataset: only a listing that succeeded can remove anything.
//! - A key another owner holds is a recorded conflict, never overwritten (acceptance refuses
//!   it; [`receipts::connectors::ownership`]).
//! - Memory is bounded by one batch: [`BATCH_FILES`] files or [`BATCH_BYTES`] bytes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use receipts::model::{
    Change, Connector, ConnectorFile, ConnectorKind, ConnectorState, Document, Failure,
    FailureClass, Job, LeaseToken, Removal, Submission, SyncProgress, SyncReport,
};
use receipts::{LedgerError, SyncLedger};

use crate::folder;
use crate::Selection;

/// Most files submitted in one acceptance call.
pub const BATCH_FILES: usize = 64;
/// Most bytes submitted in one acceptance call.
pub const BATCH_BYTES: usize = 16 << 20;

/// Runs `sync` jobs.
#[derive(Debug)]
pub struct Runner {
    ledger: Arc<dyn SyncLedger>,
}

impl Runner {
    /// A runner that reads and writes through `ledger`.
    pub fn new(ledger: Arc<dyn SyncLedger>) -> Runner {
        Runner { ledger }
    }
}

fn failure(class: FailureClass, code: &str, message: impl Into<String>) -> Failure {
    Failure {
        class,
        code: code.to_owned(),
        message: message.into(),
    }
}

fn retryable(code: &str, message: impl Into<String>) -> Failure {
    failure(
        FailureClass::Retryable {
            retry_after_micros: None,
        },
        code,
        message,
    )
}

fn permanent(code: &str, message: impl Into<String>) -> Failure {
    failure(FailureClass::Permanent, code, message)
}

/// A ledger error as the run's failure, by its type.
fn ledger_failure(error: LedgerError) -> Failure {
    let message = error.to_string();
    match error {
        LedgerError::LeaseLost { .. } => retryable("lease_lost", message),
        error if error.is_retryable() => retryable("ledger_unavailable", message),
        error => permanent(error.code(), message),
    }
}

/// One file as the copy holds it: where to read it and what the index knows of it.
#[derive(Debug, Clone)]
struct CopyFile {
    key: String,
    path: PathBuf,
    media_type: &'static str,
    fingerprint: String,
    sha256: String,
}

/// A folder entry's fingerprint: size and modification time in nanoseconds (0 when the file
/// system keeps none, so such a file is always hashed again).
fn fingerprint(entry: &folder::Entry) -> String {
    let nanos = entry
        .modified
        .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |since| since.as_nanos());
    format!("{}:{nanos}", entry.size)
}

/// What one run does, with the report it keeps.
struct Run<'a> {
    ledger: &'a dyn SyncLedger,
    token: LeaseToken,
    connector: Connector,
    report: SyncReport,
    started: Instant,
}

impl Run<'_> {
    async fn stage(&mut self, stage: &str) -> Result<(), Failure> {
        self.report.stage = stage.to_owned();
        self.ledger
            .progress(&self.token, stage)
            .await
            .map(|_| ())
            .map_err(ledger_failure)
    }

    /// Records index rows, dropped keys and the report so far, fenced by the lease.
    async fn record(
        &mut self,
        files: Vec<ConnectorFile>,
        forgotten: Vec<String>,
    ) -> Result<(), Failure> {
        self.report.elapsed_ms = self.started.elapsed().as_millis() as u64;
        self.ledger
            .record_sync(
                &self.token,
                SyncProgress {
                    files,
                    forgotten,
                    report: self.report.clone(),
                },
            )
            .await
            .map_err(ledger_failure)
    }

    /// Lists the folder and hashes what the index does not vouch for.
    async fn list_folder(&mut self) -> Result<Vec<CopyFile>, Failure> {
        let connector = &self.connector;
        let selection = Selection::new(
            &connector.include,
            &connector.exclude,
            connector.max_file_bytes.max(0) as u64,
        )
        .map_err(|error| permanent("invalid_connector", error.to_string()))?;
        let root = PathBuf::from(&connector.location);
        // A missing or unreadable folder fails the run: an empty listing would remove
        // every source the connector owns.
        let listing = tokio::task::spawn_blocking(move || {
            match std::fs::metadata(&root) {
                Ok(metadata) if metadata.is_dir() => {}
                Ok(_) => {
                    return Err(format!("{} is not a folder", root.display()));
                }
                Err(error) => return Err(format!("{}: {error}", root.display())),
            }
            folder::list(&root, &selection).map_err(|error| format!("{}: {error}", root.display()))
        })
        .await
        .map_err(|error| retryable("listing_failed", error.to_string()))?
        .map_err(|message| {
            retryable(
                "location_unavailable",
                format!("the folder cannot be read ({message}); nothing was changed"),
            )
        })?;
        for skipped in &listing.skipped {
            self.report.note(
                &skipped.path,
                "skipped",
                skipped.reason.as_str(),
                &skipped.detail,
            );
        }
        let index: HashMap<String, ConnectorFile> = self
            .ledger
            .connector_files(self.connector.id)
            .await
            .map_err(ledger_failure)?
            .into_iter()
            .map(|file| (file.source_key.clone(), file))
            .collect();
        let mut copy = Vec::with_capacity(listing.entries.len());
        for entry in listing.entries {
            let print = fingerprint(&entry);
            let known = index
                .get(&entry.key)
                .filter(|file| file.fingerprint == print && !print.ends_with(":0"));
            let sha256 = match known {
                Some(file) => file.sha256.clone(),
                None => {
                    let path = entry.path.clone();
                    let hashed = tokio::task::spawn_blocking(move || {
                        std::fs::read(&path).map(|bytes| receipts::ids::sha256_hex(&bytes))
                    })
                    .await
                    .map_err(|error| retryable("hashing_failed", error.to_string()))?;
                    match hashed {
                        Ok(sha256) => {
                            self.report.hashed += 1;
                            sha256
                        }
                        Err(error) => {
                            self.report.note(
                                &entry.key,
                                "skipped",
                                "unreadable",
                                &error.to_string(),
                            );
                            continue;
                        }
                    }
                }
            };
            copy.push(CopyFile {
                key: entry.key,
                path: entry.path,
                media_type: entry.media_type,
                fingerprint: print,
                sha256,
            });
        }
        Ok(copy)
    }

    /// The heads of the dataset this connector owns, by key.
    async fn owned_heads(&self) -> Result<Vec<receipts::SourceListing>, Failure> {
        let owner = self.connector.owner();
        let mut owned = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .ledger
                .list_sources(
                    &self.connector.dataset,
                    "",
                    after.as_deref(),
                    receipts::MAX_LISTING_PAGE,
                )
                .await
                .map_err(ledger_failure)?;
            let full = page.len() as u32 == receipts::MAX_LISTING_PAGE;
            after = page.last().map(|head| head.source_key.clone());
            owned.extend(
                page.into_iter()
                    .filter(|head| head.owner.as_deref() == Some(owner.as_str())),
            );
            if !full {
                return Ok(owned);
            }
        }
    }

    fn submission(&self, key: &str, change: Change) -> Submission {
        Submission {
            dataset: self.connector.dataset.clone(),
            source_key: key.to_owned(),
            actor: self.connector.owner(),
            connector: Some(self.connector.id),
            change,
        }
    }

    /// Submits files in bounded batches; records each batch's outcome.
    async fn submit(&mut self, files: Vec<(CopyFile, bool)>) -> Result<(), Failure> {
        let total = files.len();
        let mut done = 0;
        let mut pending = files.into_iter().peekable();
        while pending.peek().is_some() {
            let mut batch = Vec::new();
            let mut bytes = 0usize;
            while let Some((file, _)) = pending.peek() {
                let size = std::fs::metadata(&file.path).map_or(0, |m| m.len() as usize);
                if !batch.is_empty() && (batch.len() >= BATCH_FILES || bytes + size > BATCH_BYTES) {
                    break;
                }
                bytes += size;
                if let Some(next) = pending.next() {
                    batch.push(next);
                }
            }
            done += batch.len();
            self.stage(&format!("submitting {done} of {total}")).await?;
            let mut submissions = Vec::with_capacity(batch.len());
            let mut sent = Vec::with_capacity(batch.len());
            for (file, changed) in batch {
                let path = file.path.clone();
                let read = tokio::task::spawn_blocking(move || std::fs::read(path))
                    .await
                    .map_err(|error| retryable("reading_failed", error.to_string()))?;
                let bytes = match read {
                    Ok(bytes) => bytes,
                    Err(error) => {
                        self.report
                            .note(&file.key, "skipped", "unreadable", &error.to_string());
                        continue;
                    }
                };
                let mut metadata = serde_json::Map::new();
                metadata.insert("connector".into(), self.connector.id.to_string().into());
                metadata.insert("path".into(), file.key.clone().into());
                submissions.push(self.submission(
                    &file.key,
                    Change::Put(Document {
                        bytes,
                        media_type: file.media_type.to_owned(),
                        tags: Vec::new(),
                        metadata,
                    }),
                ));
                sent.push((file, changed));
            }
            let results = self.ledger.accept(submissions).await;
            let mut indexed = Vec::new();
            for ((file, changed), result) in sent.into_iter().zip(results) {
                match result {
                    Ok(acceptance) => {
                        if changed {
                            self.report.changed += 1;
                        } else {
                            self.report.added += 1;
                        }
                        indexed.push(ConnectorFile {
                            source_key: file.key,
                            fingerprint: file.fingerprint,
                            // The bytes accepted, which may be newer than the ones hashed.
                            sha256: acceptance.content_sha256.unwrap_or(file.sha256),
                        });
                    }
                    Err(error) if error.is_retryable() => {
                        self.record(indexed, Vec::new()).await?;
                        return Err(ledger_failure(error));
                    }
                    Err(error) => {
                        let outcome = match error.code() {
                            "owned_by_connector" | "owned_by_another" => "conflict",
                            _ => "failed",
                        };
                        self.report
                            .note(&file.key, outcome, error.code(), &error.public_message());
                    }
                }
            }
            self.record(indexed, Vec::new()).await?;
        }
        Ok(())
    }

    /// Tombstones the keys whose files are gone.
    async fn tombstone(&mut self, keys: Vec<String>) -> Result<(), Failure> {
        if keys.is_empty() {
            return Ok(());
        }
        self.stage("tombstoning").await?;
        let reason = format!("removed from {}", self.connector.location);
        for chunk in keys.chunks(BATCH_FILES) {
            let submissions = chunk
                .iter()
                .map(|key| {
                    self.submission(
                        key,
                        Change::Delete {
                            reason: Some(reason.clone()),
                        },
                    )
                })
                .collect();
            let results = self.ledger.accept(submissions).await;
            let mut forgotten = Vec::new();
            for (key, result) in chunk.iter().zip(results) {
                match result {
                    Ok(_) => {
                        self.report.removed += 1;
                        forgotten.push(key.clone());
                    }
                    Err(error) if error.is_retryable() => {
                        self.record(Vec::new(), forgotten).await?;
                        return Err(ledger_failure(error));
                    }
                    Err(error) => {
                        self.report
                            .note(key, "failed", error.code(), &error.public_message());
                    }
                }
            }
            self.record(Vec::new(), forgotten).await?;
        }
        Ok(())
    }

    async fn run(mut self) -> Result<(), Failure> {
        let last = self.connector.state == ConnectorState::Removed
            && self.connector.removal == Some(Removal::Tombstone);
        if !last && self.connector.state != ConnectorState::Active {
            // Paused or removed keeping its sources since it was queued: nothing to do.
            self.report.stage = format!("skipped: the connector is {}", self.connector.state);
            return self.record(Vec::new(), Vec::new()).await;
        }
        self.stage("listing").await?;
        let copy = if last {
            Vec::new()
        } else {
            match self.connector.kind {
                ConnectorKind::Folder => self.list_folder().await?,
                ConnectorKind::Git => {
                    return Err(permanent(
                        "git_unsupported",
                        "git connectors are not read by this build yet; remove the connector \
                         or point a folder connector at a checkout",
                    ))
                }
            }
        };
        self.stage("comparing").await?;
        let owned = self.owned_heads().await?;
        let difference = receipts::sync::difference(
            copy.iter()
                .map(|file| (file.key.as_str(), file.sha256.as_str())),
            &owned,
        );
        self.report.unchanged = difference.unchanged.len() as u64;
        let mut by_key: HashMap<String, CopyFile> = copy
            .into_iter()
            .map(|file| (file.key.clone(), file))
            .collect();
        // Unchanged files: the index learns their fingerprints, so the next run reads none.
        let vouched: Vec<ConnectorFile> = difference
            .unchanged
            .iter()
            .filter_map(|key| by_key.get(key))
            .map(|file| ConnectorFile {
                source_key: file.key.clone(),
                fingerprint: file.fingerprint.clone(),
                sha256: file.sha256.clone(),
            })
            .collect();
        if !vouched.is_empty() {
            self.record(vouched, Vec::new()).await?;
        }
        let mut submit = Vec::new();
        for (keys, changed) in [(&difference.added, false), (&difference.changed, true)] {
            for key in keys {
                if let Some(file) = by_key.remove(key) {
                    submit.push((file, changed));
                }
            }
        }
        submit.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        self.submit(submit).await?;
        self.tombstone(difference.removed).await?;
        self.report.stage = "done".to_owned();
        let report = &self.report;
        for (outcome, count) in [
            ("added", report.added),
            ("changed", report.changed),
            ("unchanged", report.unchanged),
            ("removed", report.removed),
            ("skipped", report.skipped),
            ("failed", report.failed),
            ("conflict", report.conflicts),
        ] {
            metrics::counter!("cairn_sync_files_total", "outcome" => outcome).increment(count);
        }
        self.record(Vec::new(), Vec::new()).await
    }
}

#[async_trait]
impl worker::Work for Runner {
    async fn run(&self, job: &Job) -> Result<(), Failure> {
        let token = LeaseToken::of(job)
            .ok_or_else(|| permanent("not_leased", "the run was handed over without a lease"))?;
        let id = job
            .connector_id
            .ok_or_else(|| permanent("not_a_sync_run", "the job names no connector"))?;
        let connector = self
            .ledger
            .connector(id)
            .await
            .map_err(ledger_failure)?
            .ok_or_else(|| permanent("connector_not_found", format!("connector {id} is gone")))?;
        let started = Instant::now();
        let report = SyncReport {
            location: connector.location.clone(),
            commit: None,
            ..SyncReport::default()
        };
        let result = Run {
            ledger: self.ledger.as_ref(),
            token,
            connector,
            report,
            started,
        }
        .run()
        .await;
        let outcome = if result.is_ok() { "done" } else { "failed" };
        metrics::counter!("cairn_sync_runs_total", "outcome" => outcome).increment(1);
        metrics::histogram!("cairn_sync_run_seconds").record(started.elapsed().as_secs_f64());
        if result.is_ok() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64());
            metrics::gauge!("cairn_sync_last_success_timestamp_seconds", "connector" => id.to_string())
                .set(now);
        }
        match &result {
            Ok(()) => tracing::info!(
                connector = %id,
                job = %job.id,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "sync run done"
            ),
            Err(failure) => tracing::warn!(
                connector = %id,
                job = %job.id,
                code = %failure.code,
                message = %failure.message,
                "sync run failed"
            ),
        }
        result
    }
}
