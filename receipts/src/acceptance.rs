//! Acceptance decisions shared by every ledger engine: a submission is validated and hashed
//! ([`prepare`]) before any storage sees it, and what happens to it is decided from what the
//! ledger holds for its source ([`classify`]). Engines only read the [`Decision`] and write
//! the [`Outcome`]; the rules (duplicate, revert, tombstone, blocked content) live here once.

use uuid::Uuid;

use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::ids;
use crate::model::{AcceptStatus, Acceptance, Change, Document, Submission};
use crate::passages::{self, Passage};
use crate::validate;

/// A submission validated and hashed off the writer task.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) dataset: String,
    pub(crate) source_key: String,
    pub(crate) actor: String,
    /// The owner it claims (`connector:<id>`), `None` for API ingest.
    pub(crate) owner: Option<String>,
    pub(crate) change: PreparedChange,
}

// A prepared change lives for one acceptance; boxing the large variant would cost an
// allocation per submission for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum PreparedChange {
    Put {
        document: Document,
        sha256: String,
        revision_id: Uuid,
        passages: Vec<Passage>,
        /// The text the passages are cut from when it is not the bytes themselves (formats
        /// that extract, such as HTML): the lexical index holds it, never the markup.
        extracted: Option<String>,
    },
    Delete {
        reason: Option<String>,
    },
}

/// Validates a submission and hashes its content; nothing is stored yet.
pub(crate) fn prepare(submission: Submission) -> Result<Prepared> {
    validate::dataset(&submission.dataset)?;
    validate::source_key(&submission.source_key)?;
    let change = match submission.change {
        Change::Put(document) => {
            validate::content(&document.bytes)?;
            validate::media_type(&document.media_type)?;
            validate::tags(&document.tags)?;
            validate::metadata(&document.metadata)?;
            let sha256 = ids::sha256_hex(&document.bytes);
            let revision_id = ids::revision_id(ids::RevisionIdentity {
                dataset: &submission.dataset,
                source_key: &submission.source_key,
                sha256: &sha256,
                media_type: &document.media_type,
                tags: &document.tags,
                metadata: &document.metadata,
            });
            let format = extract::Format::of(&document.media_type);
            let (passages, extracted) = if format.extracts() {
                // Bounded (HTML by its nesting, a PDF in a child process, a DOCX by capped
                // decompression); the caller runs binary formats off the async runtime
                // ([`accept_with`]).
                let extracted = extract::Extracted::from_bytes(
                    &document.bytes,
                    format,
                    &extract::Limits::default(),
                )
                .map_err(extraction_refused)?;
                // Admission scanned text content itself; a binary document's is its extraction.
                let finding = format
                    .binary()
                    .then(|| crate::secrets::scan(extracted.text.as_bytes()))
                    .flatten();
                if let Some(finding) = finding {
                    return Err(LedgerError::invalid(
                        "secret_detected",
                        format!(
                            "content carries a credential ({}) at byte offset {} of its \
                             extracted text; remove it and resubmit",
                            finding.kind, finding.offset
                        ),
                    ));
                }
                let passages = passages::split_structured(
                    &extracted.text,
                    &extracted.sections,
                    &extracted.pages,
                );
                (passages, Some(extracted.text))
            } else {
                match std::str::from_utf8(&document.bytes) {
                    // Markdown is its own text: only its headings are read.
                    Ok(text) if format == extract::Format::Markdown => {
                        let sections = extract::markdown::sections(text);
                        (passages::split_structured(text, &sections, &[]), None)
                    }
                    Ok(text) => (passages::split(text), None),
                    Err(_) => (Vec::new(), None),
                }
            };
            PreparedChange::Put {
                document,
                sha256,
                revision_id,
                passages,
                extracted,
            }
        }
        Change::Delete { reason } => PreparedChange::Delete { reason },
    };
    Ok(Prepared {
        dataset: submission.dataset,
        source_key: submission.source_key,
        actor: submission.actor,
        owner: submission.connector.map(crate::model::owner_of),
        change,
    })
}

/// An extraction's refusal as the ledger's: every code but `extractor_unavailable` is the
/// document's fault (422, or 413 when it is too large); a missing extractor is this
/// machine's, and answers 503 so that the client retries.
fn extraction_refused(error: extract::ExtractError) -> LedgerError {
    LedgerError::invalid(error.code, error.message)
}

/// Whether preparing `submission` runs an extractor that may take a while (a binary format).
fn extracts_slowly(submission: &Submission) -> bool {
    matches!(&submission.change, Change::Put(document)
        if extract::Format::of(&document.media_type).binary())
}

/// What the ledger holds for one item before its wave is written.
#[derive(Debug)]
pub(crate) struct Decision {
    pub(crate) head: Option<Uuid>,
    pub(crate) head_tombstone: bool,
    pub(crate) blocked_reason: Option<String>,
    pub(crate) existing_accepted_at: Option<Micros>,
    /// The source's stored owner (`connector:<id>`), if any.
    pub(crate) owner: Option<String>,
    /// Whether that owner is a removed connector.
    pub(crate) owner_removed: bool,
}

/// What acceptance does with one item.
#[derive(Debug)]
pub(crate) enum Outcome {
    Refused(LedgerError),
    Duplicate(Uuid),
    Write(Write),
}

#[derive(Debug)]
pub(crate) struct Write {
    pub(crate) revision_id: Uuid,
    pub(crate) job_id: Uuid,
    pub(crate) new_revision: bool,
    pub(crate) tombstone: bool,
    pub(crate) previous: Option<Uuid>,
    pub(crate) accepted_at: Micros,
    pub(crate) cause: &'static str,
}

pub(crate) fn classify(item: &Prepared, decision: Decision, now: Micros) -> Outcome {
    let held = crate::connectors::Ownership {
        owner: decision.owner.clone(),
        owner_removed: decision.owner_removed,
        live: decision.head.is_some() && !decision.head_tombstone,
    };
    let source = format!("{}/{}", item.dataset, item.source_key);
    if let Err(error) = crate::connectors::ownership(item.owner.as_deref(), &held, &source) {
        return Outcome::Refused(error);
    }
    match &item.change {
        PreparedChange::Put {
            sha256,
            revision_id,
            ..
        } => {
            if let Some(reason) = decision.blocked_reason {
                return Outcome::Refused(LedgerError::ContentBlocked {
                    dataset: item.dataset.clone(),
                    sha256: sha256.clone(),
                    reason,
                });
            }
            if decision.head == Some(*revision_id) {
                return Outcome::Duplicate(*revision_id);
            }
            let reverted = decision.existing_accepted_at.is_some();
            Outcome::Write(Write {
                revision_id: *revision_id,
                job_id: ids::new_v7(),
                new_revision: !reverted,
                tombstone: false,
                previous: decision.head,
                accepted_at: decision.existing_accepted_at.unwrap_or(now),
                cause: if reverted {
                    "reverted_to_earlier_revision"
                } else {
                    "accepted"
                },
            })
        }
        PreparedChange::Delete { .. } => match decision.head {
            None => Outcome::Refused(LedgerError::SourceNotFound {
                dataset: item.dataset.clone(),
                source_key: item.source_key.clone(),
            }),
            Some(head) if decision.head_tombstone => Outcome::Duplicate(head),
            Some(head) => Outcome::Write(Write {
                revision_id: ids::new_v7(),
                job_id: ids::new_v7(),
                new_revision: true,
                tombstone: true,
                previous: Some(head),
                accepted_at: now,
                cause: "deleted",
            }),
        },
    }
}

/// The results of items answered slot by slot, in item order; a slot left unanswered (a bug)
/// is an internal error for that item, never a panic.
pub(crate) fn filled(slots: Vec<Option<Result<Acceptance>>>) -> Vec<Result<Acceptance>> {
    slots
        .into_iter()
        .map(|slot| {
            slot.unwrap_or_else(|| {
                Err(LedgerError::Internal(
                    "an item was left unanswered in acceptance".to_owned(),
                ))
            })
        })
        .collect()
}

/// Acceptance as every engine runs it: each submission is prepared on the caller's task, the
/// valid ones go to the engine's `write` together, and the answers come back in submission
/// order (a refused item does not fail the others; an engine that cannot answer at all
/// answers every item with its error).
pub(crate) async fn accept_with<F, Fut>(
    submissions: Vec<Submission>,
    write: F,
) -> Vec<Result<Acceptance>>
where
    F: FnOnce(Vec<Prepared>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Result<Acceptance>>>>,
{
    let count = submissions.len();
    let mut results: Vec<Option<Result<Acceptance>>> = Vec::with_capacity(count);
    let mut prepared = Vec::with_capacity(count);
    let mut slots = Vec::with_capacity(count);
    // Binary documents are extracted on the blocking pool, side by side (the PDF extractor
    // bounds how many children run at once); everything else is prepared here.
    let mut pending = Vec::with_capacity(count);
    for submission in submissions {
        pending.push(if extracts_slowly(&submission) {
            Err(tokio::task::spawn_blocking(move || prepare(submission)))
        } else {
            Ok(prepare(submission))
        });
    }
    for item in pending {
        let item = match item {
            Ok(item) => item,
            Err(handle) => handle.await.unwrap_or_else(|error| {
                tracing::error!(%error, "preparing a submission failed");
                Err(LedgerError::Internal(
                    "preparing the submission failed".to_owned(),
                ))
            }),
        };
        match item {
            Ok(item) => {
                slots.push(results.len());
                results.push(None);
                prepared.push(item);
            }
            Err(error) => results.push(Some(Err(error))),
        }
    }
    if !prepared.is_empty() {
        let written = match write(prepared).await {
            Ok(written) => written,
            Err(error) => slots.iter().map(|_| Err(error.replicate())).collect(),
        };
        for (slot, result) in slots.into_iter().zip(written) {
            results[slot] = Some(result);
        }
    }
    filled(results)
}

/// The answer to one item of a wave once its writes are done: the refusal, the receipt of
/// the revision it duplicates (looked up by the engine), or the receipt of what it wrote.
pub(crate) fn answer(
    item: &Prepared,
    outcome: Outcome,
    duplicates: &std::collections::HashMap<Uuid, Acceptance>,
) -> Result<Acceptance> {
    match outcome {
        Outcome::Refused(error) => Err(error),
        Outcome::Duplicate(id) => duplicates
            .get(&id)
            .cloned()
            .ok_or_else(|| LedgerError::Corrupt(format!("revision {id} has no job"))),
        Outcome::Write(write) => Ok(Acceptance {
            accepted: true,
            status: AcceptStatus::QueuedNotConfirmed,
            dataset: item.dataset.clone(),
            source_key: item.source_key.clone(),
            source_revision_id: write.revision_id,
            projection_job_id: write.job_id,
            content_sha256: match &item.change {
                PreparedChange::Put { sha256, .. } => Some(sha256.clone()),
                PreparedChange::Delete { .. } => None,
            },
            byte_length: match &item.change {
                PreparedChange::Put { document, .. } => document.bytes.len() as i64,
                PreparedChange::Delete { .. } => 0,
            },
            accepted_at: write.accepted_at,
            previous_revision_id: write.previous,
            tombstone: write.tombstone,
        }),
    }
}
