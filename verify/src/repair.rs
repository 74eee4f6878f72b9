//! Repairs, through the normal paths only, each recorded on its drift (and so in history):
//!
//! | drift | repair |
//! |---|---|
//! | vector `missing`, chunk rows of any kind | a projection job for the head ([`receipts::Verifications::reproject`]) |
//! | vector `payload`, `wrong_dims`, `checksum` (a damaged vector, or one the model does not embed so), `extra` on the head | the head's points deleted, then a projection job |
//! | vector `extra` of a revision the ledger does not hold | retired, deleted, read back as gone |
//! | `stale_current` on the head | `set_current` again, ordered by the head's time, read back |
//! | `stale_current` on an older revision | retired, read back as not current |
//! | bytes `checksum` | none: corruption, restore the bytes from a backup |
//!
//! Several drifts of one revision share one projection job.

use std::collections::HashMap;

use gateways::vectors::PointSelector;
use gateways::VectorStore;
use receipts::model::{
    stores, DriftKind, DriftRecord, DriftState, LedgerBucket, PassChange, VerifyPass,
};
use receipts::LedgerError;
use uuid::Uuid;

use crate::pass::{Verifier, VerifyError};

/// The actor repairs are recorded under.
pub const ACTOR: &str = "cairn:verify";

/// What a repair did.
enum Done {
    /// Fixed in place and read back.
    Repaired(String),
    /// A projection job will fix it.
    Queued(String),
    /// Not repairable here (corruption), or refused; the reason.
    Left(DriftState, String),
}

/// Repairs `records` (one bucket's confirmed drift) and records each outcome.
pub(crate) async fn repair_all(
    verifier: &Verifier,
    pass: &VerifyPass,
    store: Option<&dyn VectorStore>,
    records: &[DriftRecord],
    ledger: &LedgerBucket,
) -> Result<(), VerifyError> {
    let mut queued: HashMap<Uuid, String> = HashMap::new();
    for drift in records {
        let done = match queued.get(&drift.revision_id) {
            Some(job) if needs_projection(drift) => Done::Queued(job.clone()),
            _ => repair_one(verifier, pass, store, drift, ledger).await?,
        };
        let (state, repair) = match done {
            Done::Repaired(what) => (DriftState::Repaired, what),
            Done::Queued(job) => {
                queued.insert(drift.revision_id, job.clone());
                (DriftState::Repairing, job)
            }
            Done::Left(state, why) => (state, why),
        };
        metrics::counter!("cairn_verify_repairs_total", "outcome" => state.as_str()).increment(1);
        tracing::info!(pass = %pass.id, drift = %drift.id, kind = %drift.kind, store = %drift.store, revision = %drift.revision_id, %state, %repair, "verify repair");
        verifier
            .ledger
            .change_pass(PassChange::Repair {
                drift_id: drift.id,
                state,
                repair,
                actor: ACTOR.to_owned(),
            })
            .await?;
    }
    Ok(())
}

fn needs_projection(drift: &DriftRecord) -> bool {
    drift.store == stores::RELATIONAL
        || matches!(
            drift.kind,
            DriftKind::Missing | DriftKind::Payload | DriftKind::WrongDims | DriftKind::Checksum
        )
        || (drift.kind == DriftKind::Extra && !unknown_revision(drift))
}

/// An `extra` drift about points of a revision the ledger does not hold (not a head with too
/// many points).
fn unknown_revision(drift: &DriftRecord) -> bool {
    drift.evidence.get("reason").is_some()
}

async fn repair_one(
    verifier: &Verifier,
    pass: &VerifyPass,
    store: Option<&dyn VectorStore>,
    drift: &DriftRecord,
    ledger: &LedgerBucket,
) -> Result<Done, VerifyError> {
    if drift.store == stores::BYTES {
        return Ok(Done::Left(
            DriftState::Corrupt,
            format!(
                "corruption: retained bytes do not hash to their content hash; restore them from a backup ({})",
                drift.evidence
            ),
        ));
    }
    let head = ledger
        .heads
        .iter()
        .find(|head| head.revision_id == drift.revision_id);
    if drift.store == stores::VECTOR {
        let Some(store) = store else {
            return Ok(Done::Left(
                DriftState::Failed,
                "no vector store in this process".to_owned(),
            ));
        };
        match drift.kind {
            DriftKind::Extra if unknown_revision(drift) => {
                // Retire first, so search stops answering with it even if the delete fails.
                store.retire_revision(drift.revision_id).await?;
                store
                    .delete_points(PointSelector::Revision(drift.revision_id))
                    .await?;
                let left = store
                    .count_points(PointSelector::Revision(drift.revision_id))
                    .await?;
                return Ok(if left == 0 {
                    Done::Repaired("retired and deleted the points; none read back".to_owned())
                } else {
                    Done::Left(
                        DriftState::Failed,
                        format!("{left} points still read back after the delete"),
                    )
                });
            }
            DriftKind::StaleCurrent => {
                let read_back = match head {
                    Some(head) => {
                        store
                            .set_current(
                                &head.dataset,
                                &head.source_key,
                                Some(head.revision_id),
                                head.head_at,
                            )
                            .await?;
                        let points = store.revision_points(head.revision_id).await?;
                        (points.current == points.count).then(|| {
                            format!(
                                "made current again; {} of {} points current",
                                points.current, points.count
                            )
                        })
                    }
                    None => {
                        store.retire_revision(drift.revision_id).await?;
                        let points = store.revision_points(drift.revision_id).await?;
                        (points.current == 0)
                            .then(|| format!("retired; 0 of {} points current", points.count))
                    }
                };
                return Ok(match read_back {
                    Some(what) => Done::Repaired(what),
                    None => Done::Left(
                        DriftState::Failed,
                        "the current flags did not read back as set".to_owned(),
                    ),
                });
            }
            DriftKind::Payload | DriftKind::WrongDims | DriftKind::Extra | DriftKind::Checksum => {
                // Points that name the wrong source, have another dimension or a damaged or
                // foreign vector, or are too many cannot be trusted for reuse: delete them,
                // then project the head again (which embeds their text anew).
                store
                    .delete_points(PointSelector::Revision(drift.revision_id))
                    .await?;
            }
            _ => {}
        }
    }
    if head.is_none() {
        return Ok(Done::Left(
            DriftState::Failed,
            "the revision is no longer a settled head; the next pass looks again".to_owned(),
        ));
    }
    let reason = format!("{} {} drift ({})", drift.store, drift.kind, drift.evidence);
    match verifier
        .ledger
        .reproject(
            &drift.dataset,
            &drift.source_key,
            drift.revision_id,
            &pass.generation,
            ACTOR,
            &reason.chars().take(400).collect::<String>(),
        )
        .await
    {
        Ok(job) => Ok(Done::Queued(format!("queued projection job {}", job.id))),
        Err(LedgerError::Invalid {
            code: "repair_refused",
            message,
        }) => Ok(Done::Left(DriftState::Failed, message)),
        Err(error) => Err(error.into()),
    }
}
