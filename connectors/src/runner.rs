//! A connector's run: the `sync` job's work. It lists the folder or the git tree, hashes only
//! what its index does not vouch for (size and mtime for a file, the blob id for git; a git
//! subtree whose tree id is recorded is not even read), compares with what the connector owns ([`receipts::sync::difference`]),
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
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use cap_std::fs::Dir;
use receipts::access::AccessChange;
use receipts::model::{
    AccessFrom, Change, Connector, ConnectorFile, ConnectorKind, ConnectorState, Document, Failure,
    Job, LeaseToken, Removal, Submission, SyncProgress, SyncReport,
};
use receipts::{LedgerError, SyncLedger};
use worker::{permanent, retryable};

use crate::confine::{Confinement, Roots};
use crate::folder;
use crate::git;
use crate::remote::{self, RemoteError, RemoteSettings};
use crate::{Selection, SkipReason};

/// Most files submitted in one acceptance call.
pub const BATCH_FILES: usize = 64;
/// Most bytes submitted in one acceptance call.
pub const BATCH_BYTES: usize = 16 << 20;

/// Runs `sync` jobs.
#[derive(Debug)]
pub struct Runner {
    ledger: Arc<dyn SyncLedger>,
    roots: Roots,
    remote: Arc<RemoteSettings>,
}

impl Runner {
    /// A runner that reads and writes through `ledger`, reads folders and local repositories
    /// only inside `roots` (this machine's `connectors.folder_roots`), checked at every read,
    /// and fetches remote repositories as `remote` allows.
    pub fn new(ledger: Arc<dyn SyncLedger>, roots: Roots, remote: RemoteSettings) -> Runner {
        Runner {
            ledger,
            roots,
            remote: Arc::new(remote),
        }
    }
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

/// Where a file's bytes are.
#[derive(Debug, Clone)]
enum Origin {
    /// A file of the folder, by its key (opened beneath the folder when it is read).
    File(String),
    /// A blob of the repository.
    Blob(gix::ObjectId),
}

/// One file as the copy holds it: where to read it and what the index knows of it.
#[derive(Debug, Clone)]
struct CopyFile {
    key: String,
    origin: Origin,
    media_type: &'static str,
    fingerprint: String,
    sha256: String,
    /// Its size in bytes as listed (0 when the index vouched for it unread: such a file is
    /// unchanged and never submitted).
    size: u64,
    /// Its owner, group, mode and ACL (a folder connector reading POSIX access).
    posix: Option<crate::access::Posix>,
}

/// The commit a git run reads, named in its report, its revisions and its tombstones.
#[derive(Debug, Clone)]
struct Commit {
    id: String,
    time: i64,
    author: String,
}

/// An index row that records a folder's tree id (git), not a file: its key ends with `/`
/// (`/` alone for the root), which no file's key does.
fn tree_key(folder: &str) -> String {
    format!("{folder}/")
}

/// The fingerprint of a git file: its blob id.
fn blob_fingerprint(blob: &gix::ObjectId) -> String {
    format!("blob:{blob}")
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
    roots: &'a Roots,
    remote: &'a Arc<RemoteSettings>,
    /// The folder a folder run reads, opened beneath its root once.
    folder: Option<Arc<Dir>>,
    token: LeaseToken,
    connector: Connector,
    report: SyncReport,
    started: Instant,
    /// The repository a git run reads.
    repository: Option<gix::ThreadSafeRepository>,
    /// The commit a git run reads.
    commit: Option<Commit>,
    /// The tree ids a git run saw, recorded once it ends.
    trees: Vec<ConnectorFile>,
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

    /// The largest file read, in bytes.
    fn limit(&self) -> u64 {
        self.connector.max_file_bytes.max(0) as u64
    }

    /// A location that resolves outside every root: the report says so, the run fails
    /// for good (the next interval's run tries again) and nothing is changed.
    async fn refuse(&mut self, message: String) -> Failure {
        tracing::warn!(connector = %self.connector.id, location = %self.connector.location, %message, "connector location refused");
        metrics::counter!("cairn_sync_refusals_total").increment(1);
        self.report.stage = "location_refused".to_owned();
        let location = self.connector.location.clone();
        self.report
            .note(&location, "refused", "location_refused", &message);
        let message = format!("{message}; nothing was changed");
        match self.record(Vec::new(), Vec::new()).await {
            Ok(()) => permanent("location_refused", message),
            Err(failure) => failure,
        }
    }

    /// Which files of the copy the connector reads: its globs and size limit.
    fn selection(&self) -> Result<Selection, Failure> {
        let connector = &self.connector;
        Selection::new(
            &connector.include,
            &connector.exclude,
            connector.max_file_bytes.max(0) as u64,
        )
        .map_err(|error| permanent("invalid_connector", error.to_string()))
    }

    /// Fetches a remote repository's ref into its mirror, on a thread of its own (the fetch
    /// blocks), within the configured time and size limits. A failure is recorded in the report
    /// and fails the run before anything is listed, so nothing is removed.
    async fn fetch(
        &mut self,
        location: &str,
        reference: &str,
    ) -> Result<std::path::PathBuf, Failure> {
        self.stage("fetching").await?;
        let settings = self.remote.clone();
        let id = self.connector.id;
        let (owned_location, owned_reference) = (location.to_owned(), reference.to_owned());
        let credentials = self.connector.credentials.clone();
        let (sender, receiver) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("cairn-fetch".to_owned())
            .spawn(move || {
                let fetched = remote::fetch(
                    &settings,
                    id,
                    &owned_location,
                    &owned_reference,
                    credentials.as_deref(),
                );
                let _ = sender.send(fetched);
            })
            .map_err(|error| retryable("fetch_failed", format!("cannot start a fetch: {error}")))?;
        // The fetch watches its own limit; this one only guards against a transport that
        // blocks past it.
        let guard = self.remote.fetch_timeout + std::time::Duration::from_secs(30);
        let answer = match tokio::time::timeout(guard, receiver).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(RemoteError::Unavailable {
                location: location.to_owned(),
                message: "the fetch ended without an answer".to_owned(),
            }),
            Err(_) => Err(RemoteError::Timeout {
                location: location.to_owned(),
                seconds: self.remote.fetch_timeout.as_secs(),
            }),
        };
        match answer {
            Ok(fetched) => {
                self.report.fetched_bytes = fetched.bytes;
                self.report.fetch_ms = fetched.elapsed.as_millis() as u64;
                metrics::counter!("cairn_sync_fetch_bytes_total").increment(fetched.bytes);
                metrics::histogram!("cairn_sync_fetch_seconds")
                    .record(fetched.elapsed.as_secs_f64());
                tracing::info!(
                    connector = %self.connector.id,
                    location,
                    commit = %fetched.commit,
                    changed = fetched.changed,
                    bytes = fetched.bytes,
                    elapsed_ms = fetched.elapsed.as_millis() as u64,
                    "remote fetched"
                );
                Ok(fetched.mirror)
            }
            Err(RemoteError::Refused(message)) => Err(self.refuse(message).await),
            Err(error) => {
                let (code, message) = (error.code(), error.to_string());
                metrics::counter!("cairn_sync_fetch_failures_total", "code" => code).increment(1);
                tracing::warn!(connector = %self.connector.id, location, code, %message, "fetch failed");
                self.report.stage = code.to_owned();
                let shown = self.connector.location.clone();
                self.report.note(&shown, "failed", code, &message);
                self.record(Vec::new(), Vec::new()).await?;
                Err(if error.is_retryable() {
                    retryable(code, message)
                } else {
                    permanent(code, message)
                })
            }
        }
    }

    /// Lists the folder and hashes what the index does not vouch for.
    async fn list_folder(&mut self) -> Result<Vec<CopyFile>, Failure> {
        let selection = self.selection()?;
        let location = self.connector.location.clone();
        let roots = self.roots.clone();
        // The folder is opened beneath its root now, and every file beneath it when read. A
        // missing or unreadable folder fails the run: an empty listing would remove every
        // source the connector owns.
        let posix = self.connector.access.from == Some(AccessFrom::Posix);
        let opened = tokio::task::spawn_blocking(move || {
            let folder = roots.open(&location)?;
            let listing = folder::list_with_access(&folder, &selection, posix)
                .map_err(|error| Confinement::Unavailable(format!("{location}: {error}")))?;
            Ok::<_, Confinement>((folder, listing))
        })
        .await
        .map_err(|error| retryable("listing_failed", error.to_string()))?;
        let (folder, listing) = match opened {
            Ok(opened) => opened,
            Err(Confinement::Refused(message)) => return Err(self.refuse(message).await),
            Err(Confinement::Unavailable(message)) => {
                return Err(retryable(
                    "location_unavailable",
                    format!("the folder cannot be read ({message}); nothing was changed"),
                ))
            }
        };
        let folder = Arc::new(folder);
        self.folder = Some(folder.clone());
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
                    let (folder, key, limit) = (folder.clone(), entry.key.clone(), self.limit());
                    let hashed = tokio::task::spawn_blocking(move || {
                        folder::read(&folder, &key, limit)
                            .map(|bytes| receipts::ids::sha256_hex(&bytes))
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
                origin: Origin::File(entry.key.clone()),
                key: entry.key,
                media_type: entry.media_type,
                fingerprint: print,
                sha256,
                size: entry.size,
                posix: entry.posix,
            });
        }
        Ok(copy)
    }

    /// Lists the tree at the connector's ref; reads only subtrees and blobs the index does not
    /// vouch for. The index's tree rows are dropped first and written back only when the run
    /// ends, so a run that dies midway leaves none to trust.
    async fn list_git(&mut self) -> Result<Vec<CopyFile>, Failure> {
        let connector = &self.connector;
        let selection = self.selection()?;
        let reference = connector
            .git_ref
            .clone()
            .ok_or_else(|| permanent("invalid_connector", "a git connector names no ref"))?;
        let location = connector.location.clone();
        let index = self
            .ledger
            .connector_files(connector.id)
            .await
            .map_err(ledger_failure)?;
        let mut recorded = git::Recorded::default();
        let mut stale_trees = Vec::new();
        for row in index {
            if let Some(folder) = row.source_key.strip_suffix('/') {
                if let Some(tree) = row.fingerprint.strip_prefix("tree:") {
                    recorded.trees.insert(folder.to_owned(), tree.to_owned());
                }
                stale_trees.push(row.source_key);
            } else if let Some(blob) = row.fingerprint.strip_prefix("blob:") {
                recorded
                    .files
                    .insert(row.source_key, (blob.to_owned(), row.sha256));
            }
        }
        if !stale_trees.is_empty() {
            self.record(Vec::new(), stale_trees).await?;
        }
        let roots = self.roots.clone();
        let mirror = if remote::is_remote(&location) {
            Some(self.fetch(&location, &reference).await?)
        } else {
            None
        };
        let opened = tokio::task::spawn_blocking(move || {
            let (repository, reference) = match mirror {
                Some(mirror) => (
                    remote::open_fetched(&mirror).map_err(|error| git::GitError::Unavailable {
                        location: location.clone(),
                        message: error.to_string(),
                    })?,
                    remote::MIRROR_REF.to_owned(),
                ),
                None => (git::open(&roots, &location)?, reference),
            };
            let listing = git::list(&repository, &location, &reference, &selection, &recorded)?;
            Ok::<_, git::GitError>((repository, listing))
        })
        .await
        .map_err(|error| retryable("listing_failed", error.to_string()))?;
        let opened = match opened {
            Err(error @ git::GitError::Refused { .. }) => {
                return Err(self.refuse(error.to_string()).await)
            }
            other => other,
        };
        let (repository, listing) = opened.map_err(|error| match error {
            git::GitError::Refused { .. } => permanent("location_refused", error.to_string()),
            git::GitError::Unavailable { .. } => retryable(
                "location_unavailable",
                format!("{error}; nothing was changed"),
            ),
            git::GitError::UnknownRef { .. } => {
                retryable("unknown_ref", format!("{error}; nothing was changed"))
            }
            git::GitError::Read(_) => retryable("repository_unreadable", error.to_string()),
        })?;
        self.report.commit = Some(listing.commit.clone());
        self.report.trees_read = listing.trees_read;
        self.report.location = format!("{}@{}", self.connector.location, listing.commit);
        self.commit = Some(Commit {
            id: listing.commit.clone(),
            time: listing.commit_time,
            author: listing.author.clone(),
        });
        for skipped in &listing.skipped {
            self.report.note(
                &skipped.path,
                "skipped",
                skipped.reason.as_str(),
                &skipped.detail,
            );
        }
        self.trees = listing
            .trees
            .iter()
            .map(|(folder, tree)| ConnectorFile {
                source_key: tree_key(folder),
                fingerprint: format!("tree:{tree}"),
                sha256: receipts::ids::sha256_hex(tree.as_bytes()),
            })
            .collect();
        let mut copy = Vec::with_capacity(listing.entries.len());
        for entry in listing.entries {
            let sha256 = match entry.sha256 {
                Some(sha256) => sha256,
                None => {
                    let (shared, blob, media_type) =
                        (repository.clone(), entry.blob, entry.media_type);
                    let read = tokio::task::spawn_blocking(move || {
                        let bytes = git::read_blob(&shared, blob)?;
                        Ok::<_, git::GitError>(
                            folder::admit_head(&bytes, media_type)
                                .map(|()| receipts::ids::sha256_hex(&bytes)),
                        )
                    })
                    .await
                    .map_err(|error| retryable("hashing_failed", error.to_string()))?
                    .map_err(|error| retryable("repository_unreadable", error.to_string()))?;
                    self.report.hashed += 1;
                    match read {
                        Ok(sha256) => sha256,
                        Err(detail) => {
                            self.report.note(
                                &entry.key,
                                "skipped",
                                SkipReason::UnsupportedFormat.as_str(),
                                &detail,
                            );
                            continue;
                        }
                    }
                }
            };
            copy.push(CopyFile {
                fingerprint: blob_fingerprint(&entry.blob),
                key: entry.key,
                origin: Origin::Blob(entry.blob),
                media_type: entry.media_type,
                sha256,
                size: entry.size.unwrap_or(0),
                posix: None,
            });
        }
        self.repository = Some(repository);
        Ok(copy)
    }

    /// The bytes of a file of the copy.
    async fn read(&self, origin: &Origin) -> Result<std::io::Result<Vec<u8>>, Failure> {
        match origin {
            Origin::File(key) => {
                let folder = self.folder.clone().ok_or_else(|| {
                    permanent("internal_error", "a file to read without its folder")
                })?;
                let (key, limit) = (key.clone(), self.limit());
                tokio::task::spawn_blocking(move || folder::read(&folder, &key, limit))
                    .await
                    .map_err(|error| retryable("reading_failed", error.to_string()))
            }
            Origin::Blob(blob) => {
                let repository = self.repository.clone().ok_or_else(|| {
                    permanent("internal_error", "a blob to read without its repository")
                })?;
                let blob = *blob;
                tokio::task::spawn_blocking(move || git::read_blob(&repository, blob))
                    .await
                    .map_err(|error| retryable("reading_failed", error.to_string()))?
                    .map(Ok)
                    .map_err(|error| retryable("repository_unreadable", error.to_string()))
            }
        }
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
            validity: Default::default(),
            change,
            readers: None,
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
                let size = usize::try_from(file.size).unwrap_or(usize::MAX);
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
                let bytes = match self.read(&file.origin).await? {
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
                if let Some(commit) = &self.commit {
                    metadata.insert("commit".into(), commit.id.clone().into());
                    metadata.insert("commit_time".into(), commit.time.into());
                    metadata.insert("author".into(), commit.author.clone().into());
                }
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

    /// The readers the connector's access settings give each file of the copy (`None`: the
    /// dataset's default). A rules file that is missing or does not parse fails the run
    /// before anything changes.
    async fn wanted_access(
        &mut self,
        copy: &[CopyFile],
    ) -> Result<Vec<(String, Option<Vec<String>>)>, Failure> {
        let access = self.connector.access.clone();
        let fallback = match &access.readers {
            Some(readers) => Some(
                receipts::access::SourceAccess {
                    readers: readers.clone(),
                }
                .checked()
                .map_err(|error| permanent("invalid_connector", error.public_message()))?,
            ),
            None => None,
        };
        let rules = match &access.file {
            Some(path) => Some(self.rules(path).await?),
            None => None,
        };
        let mut names = crate::access::SystemNames::default();
        let mut wanted = Vec::with_capacity(copy.len());
        for file in copy {
            let readers = match (&rules, &file.posix) {
                (Some(rules), _) => rules.readers(&file.key).unwrap_or_else(|| fallback.clone()),
                (None, Some(posix)) => {
                    crate::access::posix_readers(posix, &mut names).or_else(|| fallback.clone())
                }
                (None, None) => fallback.clone(),
            };
            wanted.push((file.key.clone(), readers));
        }
        Ok(wanted)
    }

    /// The rules file at the run's commit.
    async fn rules(&mut self, path: &str) -> Result<crate::access::Rules, Failure> {
        let (Some(repository), Some(commit)) = (self.repository.clone(), self.commit.clone())
        else {
            return Err(permanent(
                "invalid_connector",
                "an access rules file is read from a git repository",
            ));
        };
        let owned = path.to_owned();
        let read = tokio::task::spawn_blocking(move || {
            git::read_path(&repository, &commit.id, &owned, git::MAX_ACCESS_FILE_BYTES)
        })
        .await
        .map_err(|error| retryable("reading_failed", error.to_string()))?;
        let refused = |run: &mut Self, code: &'static str, message: String| {
            run.report.note(path, "failed", code, &message);
            permanent(code, format!("{message}; nothing was changed"))
        };
        let bytes = match read {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                let message = format!("the access rules file {path} is not in the tree");
                let failure = refused(self, "access_file_missing", message);
                self.record(Vec::new(), Vec::new()).await?;
                return Err(failure);
            }
            Err(error) => return Err(retryable("repository_unreadable", error.to_string())),
        };
        let parsed = std::str::from_utf8(&bytes)
            .map_err(|_| "it is not UTF-8".to_owned())
            .and_then(crate::access::Rules::parse);
        match parsed {
            Ok(rules) => Ok(rules),
            Err(message) => {
                let message = format!("the access rules file {path}: {message}");
                let failure = refused(self, "invalid_access_file", message);
                self.record(Vec::new(), Vec::new()).await?;
                Err(failure)
            }
        }
    }

    /// Records an access change for every file whose readers differ from what the ledger
    /// holds, among the sources the connector owns and the keys nobody holds yet (before
    /// their first revision is accepted, so that no revision is ever readable by more than
    /// its file). A source another owner holds is left alone: its conflict is reported by
    /// the submission.
    async fn keep_access(
        &mut self,
        wanted: Vec<(String, Option<Vec<String>>)>,
        owned: &[receipts::SourceListing],
    ) -> Result<(), Failure> {
        // What the ledger holds: the sources that name their readers, paged by key.
        let mut named: HashMap<String, Vec<String>> = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .ledger
                .named_readers(
                    &self.connector.dataset,
                    after.as_deref(),
                    receipts::MAX_LISTING_PAGE,
                )
                .await
                .map_err(ledger_failure)?;
            let full = page.len() as u32 == receipts::MAX_LISTING_PAGE;
            after = page.last().map(|(key, _)| key.clone());
            named.extend(page);
            if !full {
                break;
            }
        }
        let owned: std::collections::HashSet<&str> =
            owned.iter().map(|head| head.source_key.as_str()).collect();
        let mut changes = Vec::new();
        for (key, readers) in wanted {
            // A key another owner holds is left alone; one nobody holds gets its readers
            // before its first revision.
            if !owned.contains(key.as_str())
                && self
                    .ledger
                    .source(&self.connector.dataset, &key)
                    .await
                    .map_err(ledger_failure)?
                    .is_some()
            {
                continue;
            }
            if named.get(&key) != readers.as_ref() {
                changes.push((key, readers));
            }
        }
        if changes.is_empty() {
            return Ok(());
        }
        self.stage(&format!("recording {} access changes", changes.len()))
            .await?;
        let why = match (&self.connector.access.file, &self.commit) {
            (Some(file), Some(commit)) => format!("readers from {file} at {}", commit.id),
            _ if self.connector.access.from.is_some() => {
                format!(
                    "readers from the file system at {}",
                    self.connector.location
                )
            }
            _ => format!("readers of connector {}", self.connector.id),
        };
        for batch in changes.chunks(BATCH_FILES) {
            // Concurrent changes share the ledger's transactions.
            let results = futures::future::join_all(batch.iter().map(|(key, readers)| {
                self.ledger.change_access(AccessChange::Source {
                    dataset: self.connector.dataset.clone(),
                    source_key: key.clone(),
                    readers: readers.clone(),
                    actor: self.connector.owner(),
                    reason: why.clone(),
                })
            }))
            .await;
            for ((key, _), result) in batch.iter().zip(results) {
                match result {
                    Ok(()) => self.report.access_changed += 1,
                    Err(error) if error.is_retryable() => {
                        self.record(Vec::new(), Vec::new()).await?;
                        return Err(ledger_failure(error));
                    }
                    Err(error) => {
                        self.report
                            .note(key, "failed", error.code(), &error.public_message())
                    }
                }
            }
            self.record(Vec::new(), Vec::new()).await?;
        }
        Ok(())
    }

    /// Tombstones the keys whose files are gone.
    async fn tombstone(&mut self, keys: Vec<String>) -> Result<(), Failure> {
        if keys.is_empty() {
            return Ok(());
        }
        self.stage("tombstoning").await?;
        let reason = match &self.commit {
            Some(commit) => format!("removed from {} at {}", self.connector.location, commit.id),
            None => format!("removed from {}", self.connector.location),
        };
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
                ConnectorKind::Git => self.list_git().await?,
            }
        };
        self.stage("comparing").await?;
        let owned = self.owned_heads().await?;
        if self.connector.access.is_set() && !last {
            let wanted = self.wanted_access(&copy).await?;
            self.keep_access(wanted, &owned).await?;
        }
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
        // The tree ids the run saw: the next run reads no subtree that kept its id.
        let trees = std::mem::take(&mut self.trees);
        let report = &self.report;
        for (outcome, count) in [
            ("added", report.added),
            ("changed", report.changed),
            ("unchanged", report.unchanged),
            ("removed", report.removed),
            ("skipped", report.skipped),
            ("failed", report.failed),
            ("conflict", report.conflicts),
            ("access_changed", report.access_changed),
        ] {
            metrics::counter!("cairn_sync_files_total", "outcome" => outcome).increment(count);
        }
        self.record(trees, Vec::new()).await
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
            roots: &self.roots,
            remote: &self.remote,
            folder: None,
            repository: None,
            commit: None,
            trees: Vec::new(),
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
