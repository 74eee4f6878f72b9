//! What every job shares, the projection job and the graph job alike: failures classified by
//! type (never by message text), the revision's bytes and text, receipts recorded with their
//! evidence, and the stages a run reports in its fenced heartbeats.

use std::time::Instant;

use gateways::GatewayError;
use receipts::{
    Failure, FailureClass, Job, JobKind, LeaseToken, LedgerError, ReceiptUpdate, WorkLedger,
};

/// A retryable failure with `code`.
pub fn retryable(code: &str, message: impl Into<String>) -> Failure {
    Failure {
        class: FailureClass::Retryable {
            retry_after_micros: None,
        },
        code: code.to_owned(),
        message: message.into(),
    }
}

/// A permanent failure with `code`: retrying cannot help.
pub fn permanent(code: &str, message: impl Into<String>) -> Failure {
    Failure {
        class: FailureClass::Permanent,
        code: code.to_owned(),
        message: message.into(),
    }
}

/// A store error as a job failure, by its type.
pub(crate) fn store_failure(error: GatewayError) -> Failure {
    backend_failure("vector", error)
}

/// A store error as a job failure, by its type; `backend` prefixes the codes of store
/// outages (`vector_unavailable`, `graph_timeout`, ...). An error of the remote embedder
/// names it instead (`embedder_unavailable`, `embedder_rate_limited`, ...), whichever stage
/// called it.
pub(crate) fn backend_failure(backend: &str, error: GatewayError) -> Failure {
    let message = error.to_string();
    let prefix = |store: &str| match store {
        "embedder" => "embedder".to_owned(),
        _ => backend.to_owned(),
    };
    match error {
        GatewayError::ModelMissing(_) => retryable("model_unavailable", message),
        GatewayError::Embedder(_) => retryable("embed_error", message),
        GatewayError::Unavailable { store, .. } => {
            retryable(&format!("{}_unavailable", prefix(store)), message)
        }
        GatewayError::Timeout { store, .. } => {
            retryable(&format!("{}_timeout", prefix(store)), message)
        }
        GatewayError::RateLimited {
            store, retry_after, ..
        } => Failure {
            class: FailureClass::Retryable {
                retry_after_micros: Some(
                    i64::try_from(retry_after.as_micros()).unwrap_or(i64::MAX),
                ),
            },
            code: format!("{}_rate_limited", prefix(store)),
            message,
        },
        GatewayError::Rejected { store, .. } => {
            permanent(&format!("{}_rejected", prefix(store)), message)
        }
        GatewayError::ReadbackMismatch { .. } => retryable("readback_mismatch", message),
        GatewayError::Config(_) => permanent("config_error", message),
    }
}

/// A ledger error as a job failure, by its type.
pub(crate) fn ledger_failure(error: LedgerError) -> Failure {
    let message = error.to_string();
    match error {
        LedgerError::LeaseLost { .. } => retryable("lease_lost", message),
        LedgerError::GenerationMismatch { .. } => permanent("generation_mismatch", message),
        LedgerError::Invalid { code, .. } => permanent(code, message),
        error if error.is_retryable() => retryable("relational_unavailable", message),
        _ => permanent("ledger_error", message),
    }
}

/// The job's revision as the ledger holds it (a permanent failure when it is not there).
pub(crate) async fn revision_detail(
    ledger: &dyn WorkLedger,
    revision_id: uuid::Uuid,
) -> Result<receipts::RevisionDetail, Failure> {
    ledger
        .revision(revision_id)
        .await
        .map_err(ledger_failure)?
        .ok_or_else(|| {
            permanent(
                "revision_missing",
                "the job's revision is not in the ledger",
            )
        })
}

/// A revision and its retained bytes (a permanent failure when they are not there).
pub(crate) async fn revision_bytes(
    ledger: &dyn WorkLedger,
    revision_id: uuid::Uuid,
) -> Result<(receipts::Revision, Vec<u8>), Failure> {
    let detail = revision_detail(ledger, revision_id).await?;
    let sha256 = detail
        .revision
        .content_sha256
        .clone()
        .ok_or_else(|| permanent("no_content", "the revision has no retained content"))?;
    let bytes = ledger
        .content(&sha256)
        .await
        .map_err(ledger_failure)?
        .ok_or_else(|| {
            permanent(
                "content_missing",
                format!("content {sha256} is not retained"),
            )
        })?;
    Ok((detail.revision, bytes))
}

/// Text documents up to this size are read and chunked on the job's own task: that takes
/// well under a millisecond, less than handing it to the blocking pool and back (two thread
/// wake-ups per job, which on one-line documents cost more than the work).
pub(crate) const INLINE_BYTES: usize = 16 * 1024;

/// A revision's bytes read as its format: on the blocking pool (a PDF runs a bounded child
/// process), or inline for a text document of at most [`INLINE_BYTES`]. A document that
/// cannot be read fails for good under its extraction code; a machine without the extractor
/// fails for now (`extractor_unavailable`), so the job is retried once the extractor is
/// installed.
pub(crate) async fn extract(
    revision: &receipts::Revision,
    bytes: Vec<u8>,
) -> Result<extract::Extracted, Failure> {
    let format = extract::Format::of(&revision.media_type);
    let read = move || extract::Extracted::from_bytes(&bytes, format, &extract::Limits::default());
    let extracted = if inline(format, revision.byte_length) {
        read()
    } else {
        tokio::task::spawn_blocking(read)
            .await
            .map_err(|error| permanent("unextractable", format!("extraction failed: {error}")))?
    };
    extracted.map_err(|error| {
        if error.permanent() {
            permanent(error.code, error.message)
        } else {
            retryable(error.code, error.message)
        }
    })
}

/// Whether a document of `format` and `bytes` is read and chunked inline (see
/// [`INLINE_BYTES`]).
pub(crate) fn inline(format: extract::Format, bytes: i64) -> bool {
    !format.binary() && usize::try_from(bytes).is_ok_and(|bytes| bytes <= INLINE_BYTES)
}

/// A revision's text as the link extractors read it: the bytes themselves for text formats
/// (HTML keeps its `href`s), the extracted text for binary ones.
pub(crate) async fn revision_text(
    ledger: &dyn WorkLedger,
    revision_id: uuid::Uuid,
) -> Result<(receipts::Revision, String), Failure> {
    let (revision, bytes) = revision_bytes(ledger, revision_id).await?;
    if extract::Format::of(&revision.media_type).binary() {
        let extracted = extract(&revision, bytes).await?;
        return Ok((revision, extracted.text));
    }
    let text = String::from_utf8(bytes).map_err(|error| {
        permanent(
            "not_text",
            format!(
                "the content is not UTF-8 text (byte {})",
                error.utf8_error().valid_up_to()
            ),
        )
    })?;
    Ok((revision, text))
}

/// Records a receipt under the lease (the one fenced path for every backend's receipt).
pub(crate) async fn record_receipt(
    ledger: &dyn WorkLedger,
    token: &LeaseToken,
    update: ReceiptUpdate,
) -> Result<(), Failure> {
    ledger
        .record_receipt(token, update)
        .await
        .map_err(ledger_failure)
}

tokio::task_local! {
    /// The stage the run in this task has reached: the run's periodic heartbeat reports it.
    pub(crate) static STAGE: std::cell::Cell<Option<&'static str>>;
}

/// The stages of one run, each recorded with how long the previous one took
/// (`cairn_projection_stage_seconds`) and shown on the dashboard. A stage that comes before a
/// write the ledger cannot fence (a vector- or graph-store write) is entered with
/// [`Stages::enter`]: a fenced heartbeat that names it, so a lost lease or a cancel request
/// stops the run before that write. Any other stage is [`Stages::note`]d: the run's periodic
/// heartbeat (or the next fenced one) reports it, and the run costs no ledger write for it.
pub(crate) struct Stages<'a> {
    ledger: &'a dyn WorkLedger,
    token: &'a LeaseToken,
    kind: JobKind,
    current: Option<(&'static str, Instant)>,
}

impl<'a> Stages<'a> {
    pub(crate) fn new(ledger: &'a dyn WorkLedger, token: &'a LeaseToken, kind: JobKind) -> Self {
        Self {
            ledger,
            token,
            kind,
            current: None,
        }
    }

    /// Enters `stage`, to be reported with the next heartbeat.
    pub(crate) fn note(&mut self, stage: &'static str) {
        self.finish();
        self.current = Some((stage, Instant::now()));
        let _ = STAGE.try_with(|current| current.set(Some(stage)));
    }

    /// Enters `stage` with a fenced heartbeat that names it (before an unfenced write).
    pub(crate) async fn enter(&mut self, stage: &'static str) -> Result<(), Failure> {
        self.note(stage);
        let beat = self
            .ledger
            .progress(self.token, stage)
            .await
            .map_err(ledger_failure)?;
        if beat.cancel_requested {
            return Err(Failure {
                class: FailureClass::Cancelled,
                code: "cancelled".to_owned(),
                message: format!("an operator cancelled the job while it ran (stage {stage})"),
            });
        }
        Ok(())
    }

    /// Records the current stage's duration.
    fn finish(&mut self) {
        if let Some((stage, started)) = self.current.take() {
            metrics::histogram!(
                "cairn_projection_stage_seconds",
                "stage" => stage,
                "kind" => self.kind.as_str(),
            )
            .record(started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Stages<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Milliseconds since `started`, to a tenth.
pub(crate) fn millis(started: Instant) -> f64 {
    (started.elapsed().as_secs_f64() * 1000.0 * 10.0).round() / 10.0
}

/// The revision of a `project`, `tombstone` or `graph` job (a sync run has none: asking for it
/// is a permanent `ledger_error`, never a panic).
pub(crate) fn revision_of(job: &Job) -> Result<uuid::Uuid, Failure> {
    job.revision().map_err(ledger_failure)
}
