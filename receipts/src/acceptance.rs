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
use crate::validity::{self, Applied, Period, Rectangle, Validity};

/// A submission validated and hashed off the writer task.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) dataset: String,
    pub(crate) source_key: String,
    pub(crate) actor: String,
    /// The owner it claims (`connector:<id>`), `None` for API ingest.
    pub(crate) owner: Option<String>,
    /// When it holds, as the submission said.
    pub(crate) validity: Validity,
    pub(crate) change: PreparedChange,
    /// The readers a put names, recorded with its acceptance.
    pub(crate) readers: Option<Vec<String>>,
}

impl Prepared {
    /// The access change an accepted put makes (its readers), if it names any.
    pub(crate) fn access_change(&self) -> Option<crate::access::AccessChange> {
        let readers = self.readers.clone()?;
        matches!(self.change, PreparedChange::Put { .. }).then(|| {
            crate::access::AccessChange::Source {
                dataset: self.dataset.clone(),
                source_key: self.source_key.clone(),
                readers: Some(readers),
                actor: self.actor.clone(),
                reason: "put with access".to_owned(),
            }
        })
    }
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
    let readers = match &submission.readers {
        Some(readers) => Some(
            crate::access::SourceAccess {
                readers: readers.clone(),
            }
            .checked()?,
        ),
        None => None,
    };
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
        validity: submission.validity,
        change,
        readers,
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
    /// The source's assertions so far: the last one's place and record time, and the
    /// rectangles believed now ([`crate::validity`]).
    pub(crate) assertions: Believed,
}

/// What the ledger believes about a source's validity now.
#[derive(Debug, Default, Clone)]
pub(crate) struct Believed {
    /// The place of its last assertion (0: none yet).
    pub(crate) last_seq: i64,
    /// When its last assertion was recorded.
    pub(crate) last_recorded_at: Option<Micros>,
    /// Its rectangles with an open record end.
    pub(crate) rectangles: Vec<Rectangle>,
}

/// The assertion an acceptance writes, and what it changes in the rectangles.
#[derive(Debug, Clone)]
pub(crate) struct AssertionWrite {
    pub(crate) id: Uuid,
    pub(crate) seq: i64,
    pub(crate) revision_id: Uuid,
    pub(crate) period: Period,
    pub(crate) recorded_at: Micros,
    pub(crate) cause: &'static str,
    pub(crate) applied: Applied,
}

impl AssertionWrite {
    /// The assertion of `revision_id` over the submission's period, recorded after the
    /// source's last one; refused when the period is empty or not yet supported.
    fn new(
        item: &Prepared,
        believed: &Believed,
        revision_id: Uuid,
        now: Micros,
        cause: &'static str,
    ) -> Result<AssertionWrite> {
        let recorded_at = validity::record_time(now, believed.last_recorded_at);
        let period = item.validity.period(recorded_at)?;
        let id = ids::new_v7();
        Ok(AssertionWrite {
            id,
            seq: believed.last_seq + 1,
            revision_id,
            period,
            recorded_at,
            cause,
            applied: validity::apply(&believed.rectangles, id, revision_id, period, recorded_at),
        })
    }

    /// Whether it changes nothing that is believed: every believed rectangle it overlaps is
    /// already of its revision, and together they cover its period.
    fn changes_nothing(&self, believed: &Believed) -> bool {
        let mut overlapped: Vec<&Rectangle> = believed
            .rectangles
            .iter()
            .filter(|rectangle| rectangle.valid.overlaps(&self.period))
            .collect();
        if overlapped
            .iter()
            .any(|rectangle| rectangle.revision_id != self.revision_id)
        {
            return false;
        }
        overlapped.sort_by_key(|rectangle| rectangle.valid.from);
        let mut covered_to = self.period.from;
        for rectangle in overlapped {
            if rectangle.valid.from > covered_to {
                return false;
            }
            covered_to = covered_to.max(rectangle.valid.to);
        }
        covered_to >= self.period.to
    }
}

/// What acceptance does with one item.
#[derive(Debug)]
pub(crate) enum Outcome {
    Refused(LedgerError),
    /// The revision is the head already; the assertion, when there is one, still changes
    /// what is believed about its validity (a head asserted further back).
    Duplicate(Uuid, Option<AssertionWrite>),
    Write(Write),
}

impl Outcome {
    /// The assertion this outcome writes, if any.
    pub(crate) fn assertion(&self) -> Option<&AssertionWrite> {
        match self {
            Outcome::Duplicate(_, assertion) => assertion.as_ref(),
            Outcome::Write(write) => Some(&write.assertion),
            Outcome::Refused(_) => None,
        }
    }
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
    pub(crate) assertion: AssertionWrite,
    /// Where the assertion leaves the head, and which jobs it queues.
    pub(crate) placement: Placement,
}

/// Where an assertion leaves its source's head, and when its jobs run. Every period is
/// accepted: one that holds now moves the head at once; one that starts later is
/// **scheduled** (its job waits for `valid_from`, and the worker that claims it then moves the
/// head first: [`crate::WorkLedger::cross_boundary`]); one that ended before now is
/// **history** only (policy: only revisions that hold now or later are projected, so its job
/// is superseded at once and temporal searches over its period report partial history). A
/// bounded period that holds now or later also schedules the **return** of the revision that
/// holds after it, at `valid_to`.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// Whether the head moves to the revision now.
    pub(crate) moves_head: bool,
    /// When its job may run: now, or the instant its period starts.
    pub(crate) run_at: Micros,
    /// Whether it holds only in the past: its job is superseded at once.
    pub(crate) historical: bool,
    /// The revision that takes the head back when a bounded period ends.
    pub(crate) returns: Option<Return>,
}

/// A job scheduled at a bounded period's end for the revision that holds from then on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Return {
    pub(crate) job_id: Uuid,
    pub(crate) revision_id: Uuid,
    pub(crate) at: Micros,
}

impl Placement {
    /// Where `assertion` leaves a source whose head is `head` and whose believed rectangles
    /// were `believed` before it, at the ledger's clock `now`. Its revision holds now when its
    /// period contains its record time (its jobs then run from `now`, which a record time
    /// bumped past the source's last one may lead by microseconds). A source needs a head
    /// before anything is scheduled or recorded as history (one whose first revision holds
    /// only later, or only before, would be listed with nothing current), and a bounded period
    /// needs something to hold after it.
    fn of(
        item: &Prepared,
        head: Option<Uuid>,
        believed: &Believed,
        assertion: &AssertionWrite,
        now: Micros,
    ) -> Result<Placement> {
        let period = assertion.period;
        let recorded_at = assertion.recorded_at;
        let moves_head = period.contains(recorded_at);
        let historical = period.to <= recorded_at;
        if head.is_none() && !moves_head {
            return Err(LedgerError::invalid(
                "validity_in_future",
                format!(
                    "{}/{} has no revision yet, and this one holds only over [{}, {}): a \
                     source's first revision must hold now; accept it without a period (or with \
                     one that contains now), then assert the others",
                    item.dataset,
                    item.source_key,
                    validity::format_instant(period.from),
                    end(period.to)
                ),
            ));
        }
        let returns = if period.is_open() || historical {
            None
        } else {
            let after = believed.after(&assertion.applied);
            match validity::held(&after, period.to, recorded_at) {
                None => {
                    return Err(LedgerError::invalid(
                        "validity_gap",
                        format!(
                            "{}/{}: nothing would hold after valid_to {}; leave valid_to out, or \
                             first assert what holds from then on (a deletion with that \
                             valid_from, for one that is gone)",
                            item.dataset,
                            item.source_key,
                            validity::format_instant(period.to)
                        ),
                    ))
                }
                Some(next) if next.revision_id == assertion.revision_id => None,
                Some(next) => Some(Return {
                    job_id: ids::new_v7(),
                    revision_id: next.revision_id,
                    at: period.to,
                }),
            }
        };
        Ok(Placement {
            moves_head,
            run_at: if moves_head || historical {
                now
            } else {
                period.from
            },
            historical,
            returns,
        })
    }
}

/// A period's end as people read it.
fn end(to: Micros) -> String {
    if to == validity::OPEN {
        "open".to_owned()
    } else {
        validity::format_instant(to)
    }
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
                return duplicate(item, &decision, *revision_id, now);
            }
            let reverted = decision.existing_accepted_at.is_some();
            let cause = if reverted {
                "reverted_to_earlier_revision"
            } else {
                "accepted"
            };
            let assertion =
                match AssertionWrite::new(item, &decision.assertions, *revision_id, now, cause) {
                    Ok(assertion) => assertion,
                    Err(error) => return Outcome::Refused(error),
                };
            let placement =
                match Placement::of(item, decision.head, &decision.assertions, &assertion, now) {
                    Ok(placement) => placement,
                    Err(error) => return Outcome::Refused(error),
                };
            // A scheduled revision submitted again with the same period: its receipt again.
            if !placement.moves_head && reverted && assertion.changes_nothing(&decision.assertions)
            {
                return Outcome::Duplicate(*revision_id, None);
            }
            Outcome::Write(Write {
                revision_id: *revision_id,
                job_id: ids::new_v7(),
                new_revision: !reverted,
                tombstone: false,
                previous: decision.head,
                accepted_at: decision.existing_accepted_at.unwrap_or(now),
                cause,
                assertion,
                placement,
            })
        }
        PreparedChange::Delete { .. } => match decision.head {
            None => Outcome::Refused(LedgerError::SourceNotFound {
                dataset: item.dataset.clone(),
                source_key: item.source_key.clone(),
            }),
            Some(head) if decision.head_tombstone => duplicate(item, &decision, head, now),
            Some(head) => {
                let revision_id = ids::new_v7();
                let written =
                    AssertionWrite::new(item, &decision.assertions, revision_id, now, "deleted")
                        .and_then(|assertion| {
                            let placement = Placement::of(
                                item,
                                Some(head),
                                &decision.assertions,
                                &assertion,
                                now,
                            )?;
                            Ok(Write {
                                revision_id,
                                job_id: ids::new_v7(),
                                new_revision: true,
                                tombstone: true,
                                previous: Some(head),
                                accepted_at: now,
                                cause: "deleted",
                                assertion,
                                placement,
                            })
                        });
                match written {
                    Ok(write) => Outcome::Write(write),
                    Err(error) => Outcome::Refused(error),
                }
            }
        },
    }
}

/// A submission of the head: nothing is written unless it gives a period that changes what
/// is believed. An open one that holds now (the head asserted further back) is recorded as an
/// assertion of the head alone. Any other (from a later instant, over a revision scheduled
/// before it; bounded, so that another revision returns at its end; in the past only) is
/// placed like any assertion, with a job of its own.
fn duplicate(item: &Prepared, decision: &Decision, head: Uuid, now: Micros) -> Outcome {
    if !item.validity.is_given() {
        return Outcome::Duplicate(head, None);
    }
    let believed = &decision.assertions;
    let assertion = match AssertionWrite::new(item, believed, head, now, "reasserted") {
        Ok(assertion) => assertion,
        Err(error) => return Outcome::Refused(error),
    };
    if assertion.changes_nothing(believed) {
        return Outcome::Duplicate(head, None);
    }
    if assertion.period.contains(assertion.recorded_at) && assertion.period.is_open() {
        return Outcome::Duplicate(head, Some(assertion));
    }
    let mut placement = match Placement::of(item, Some(head), believed, &assertion, now) {
        Ok(placement) => placement,
        Err(error) => return Outcome::Refused(error),
    };
    // The head stays the head until a boundary moves it: its job projects it again at most.
    placement.moves_head = false;
    Outcome::Write(Write {
        revision_id: head,
        job_id: ids::new_v7(),
        new_revision: false,
        tombstone: decision.head_tombstone,
        previous: Some(head),
        accepted_at: decision.existing_accepted_at.unwrap_or(now),
        cause: "reasserted",
        assertion,
        placement,
    })
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
        Outcome::Duplicate(id, _) => duplicates
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

/// One assertion row, as every engine stores it.
#[derive(Debug, serde::Serialize)]
pub(crate) struct AssertionRow {
    pub(crate) id: Uuid,
    pub(crate) dataset: String,
    pub(crate) source_key: String,
    pub(crate) seq: i64,
    pub(crate) revision_id: Uuid,
    pub(crate) valid_from: Micros,
    pub(crate) valid_to: Micros,
    pub(crate) recorded_at: Micros,
    pub(crate) actor: String,
    pub(crate) cause: &'static str,
}

/// One new rectangle row.
#[derive(Debug, serde::Serialize)]
pub(crate) struct RectangleRow {
    pub(crate) id: Uuid,
    pub(crate) dataset: String,
    pub(crate) source_key: String,
    pub(crate) revision_id: Uuid,
    pub(crate) assertion_id: Uuid,
    pub(crate) valid_from: Micros,
    pub(crate) valid_to: Micros,
    pub(crate) recorded_from: Micros,
}

/// A wave's validity writes, which every engine applies in this order in the acceptance's
/// transaction: insert the assertions, close the believed rectangles they override (record
/// end = the assertion's record time), insert the new rectangles.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct ValidityRows {
    pub(crate) assertions: Vec<AssertionRow>,
    /// `(rectangle id, record end)`.
    pub(crate) close: Vec<(Uuid, Micros)>,
    pub(crate) insert: Vec<RectangleRow>,
}

impl ValidityRows {
    /// The validity writes of a wave's outcomes.
    pub(crate) fn of(wave: &[Prepared], outcomes: &[Outcome]) -> ValidityRows {
        let mut rows = ValidityRows::default();
        for (item, outcome) in wave.iter().zip(outcomes) {
            if let Some(assertion) = outcome.assertion() {
                rows.add(item, assertion);
            }
        }
        rows
    }

    fn add(&mut self, item: &Prepared, assertion: &AssertionWrite) {
        self.assertions.push(AssertionRow {
            id: assertion.id,
            dataset: item.dataset.clone(),
            source_key: item.source_key.clone(),
            seq: assertion.seq,
            revision_id: assertion.revision_id,
            valid_from: assertion.period.from,
            valid_to: assertion.period.to,
            recorded_at: assertion.recorded_at,
            actor: item.actor.clone(),
            cause: assertion.cause,
        });
        self.close.extend(
            assertion
                .applied
                .close
                .iter()
                .map(|id| (*id, assertion.recorded_at)),
        );
        self.insert.extend(
            assertion
                .applied
                .insert
                .iter()
                .map(|rectangle| RectangleRow {
                    id: rectangle.id,
                    dataset: item.dataset.clone(),
                    source_key: item.source_key.clone(),
                    revision_id: rectangle.revision_id,
                    assertion_id: rectangle.assertion_id,
                    valid_from: rectangle.valid.from,
                    valid_to: rectangle.valid.to,
                    recorded_from: rectangle.recorded_from,
                }),
        );
    }

    /// Whether there is nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.assertions.is_empty()
    }
}

/// A believed rectangle as an engine reads it: `(id, assertion id, revision id, valid_from,
/// valid_to, recorded_from)`.
pub(crate) type BelievedRow = (Uuid, Uuid, Uuid, Micros, Micros, Micros);

impl Believed {
    /// The rectangles believed once `applied` is: these without the ones it closes, and the
    /// ones it adds.
    fn after(&self, applied: &validity::Applied) -> Vec<Rectangle> {
        self.rectangles
            .iter()
            .filter(|rectangle| !applied.close.contains(&rectangle.id))
            .cloned()
            .chain(applied.insert.iter().cloned())
            .collect()
    }

    /// What an engine read for one source.
    pub(crate) fn from_rows(
        last_seq: Option<i64>,
        last_recorded_at: Option<Micros>,
        rows: Vec<BelievedRow>,
    ) -> Believed {
        Believed {
            last_seq: last_seq.unwrap_or(0),
            last_recorded_at,
            rectangles: rows
                .into_iter()
                .map(
                    |(id, assertion_id, revision_id, from, to, recorded_from)| Rectangle {
                        id,
                        assertion_id,
                        revision_id,
                        valid: Period { from, to },
                        recorded_from,
                        recorded_to: validity::OPEN,
                    },
                )
                .collect(),
        }
    }
}
