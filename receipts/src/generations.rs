//! Generation changes, engine-independent: which transitions each state allows, and the
//! refusals both ledgers send (same codes, same words).
//!
//! ## States
//! `building` -> `active` (switch) -> `standby` (another switch) -> `active` (rollback) ...;
//! `building` or `standby` -> `retiring` (retire: no more work, chunk rows deleted) ->
//! `retired` (the caller deleted the vectors and read them back as gone). A retired
//! generation can be created again (it is rebuilt from scratch). The active generation is
//! never retired: switch away first.
//!
//! ## One state machine
//! [`change`] decides every change (create, switch, retire, finish retiring) and the causes
//! history records, once for both ledgers; an engine provides only the reads and writes
//! ([`GenerationWrites`]), inside the transaction it holds for the change.

use async_trait::async_trait;

use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::model::{
    Generation, GenerationChange, GenerationChanged, GenerationCommand, GenerationState,
    GenerationView,
};

/// Most missing heads a forced switch names.
pub const MISSING_SAMPLE: usize = 20;

/// Default priority of rebuild jobs: below fresh ingest (0), so new documents go first.
pub const REBUILD_PRIORITY: i64 = -10;

/// A change `action` that `state` does not allow.
pub(crate) fn refuse_state(id: &str, state: GenerationState, action: &str) -> LedgerError {
    let hint = match (state, action) {
        (GenerationState::Active, "retire") => {
            "; switch to another generation first (`cairn generation switch`)"
        }
        (GenerationState::Active, "switch to") => "; it already is",
        (GenerationState::Building, "create") => {
            "; switch to it when it is built, or retire it to build another"
        }
        (GenerationState::Retired | GenerationState::Retiring, "switch to") => {
            "; create it again to rebuild it"
        }
        (GenerationState::Retiring, "create") => {
            "; finish retiring it first (`cairn generation retire` again)"
        }
        _ => "",
    };
    LedgerError::GenerationRefused {
        code: if action == "create" {
            "generation_exists"
        } else {
            "generation_state"
        },
        message: format!("generation {id} is {state}: cannot {action} it{hint}"),
    }
}

/// Checks that `action` is allowed from `state` (`create` of an existing row, `switch to`,
/// `retire`, `finish retiring`).
pub(crate) fn check(id: &str, state: GenerationState, action: &str) -> Result<()> {
    let allowed = match action {
        "create" => state == GenerationState::Retired,
        "switch to" => matches!(state, GenerationState::Building | GenerationState::Standby),
        "retire" => matches!(
            state,
            GenerationState::Building | GenerationState::Standby | GenerationState::Retiring
        ),
        "finish retiring" => state == GenerationState::Retiring,
        _ => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(refuse_state(id, state, action))
    }
}

/// A second build while one is under way.
pub(crate) fn refuse_second_build(building: &str, requested: &str) -> LedgerError {
    LedgerError::GenerationRefused {
        code: "generation_state",
        message: format!(
            "generation {building} is already building: switch to it or retire it before \
             building {requested}"
        ),
    }
}

/// A switch to a generation that does not yet hold every current head.
pub(crate) fn incomplete(id: &str, missing: i64, sample: &[String]) -> LedgerError {
    LedgerError::GenerationRefused {
        code: "generation_incomplete",
        message: format!(
            "{missing} current head(s) are not verified in generation {id} (for example {}): \
             wait for the build (`cairn generation status`), or switch with --force to serve \
             them from lexical search only until they are projected",
            sample.join(", ")
        ),
    }
}

/// What an engine reads and writes for a generation change, inside the one transaction that
/// holds the change (and the jobs it queues or cancels). No method decides anything.
#[async_trait]
pub(crate) trait GenerationWrites: Send {
    /// The generation's state, if it exists.
    async fn state_of(&mut self, id: &str) -> Result<Option<GenerationState>>;
    /// The generation in `state`, if one is (`active` and `building` hold at most one).
    async fn in_state(&mut self, state: GenerationState) -> Result<Option<String>>;
    /// Current heads not verified in `id`: their count and a sample of at most
    /// [`MISSING_SAMPLE`] names.
    async fn missing_heads(&mut self, id: &str) -> Result<(i64, Vec<String>)>;
    /// Moves the generation to `state`, recording who and why.
    async fn set_state(
        &mut self,
        id: &str,
        state: GenerationState,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<()>;
    /// Records a new generation row in `state`.
    async fn insert(
        &mut self,
        generation: &Generation,
        state: GenerationState,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<()>;
    /// Forgets the evidence of an earlier retirement (the generation is built again).
    async fn clear_retired_evidence(&mut self, id: &str) -> Result<()>;
    /// Queues a `project` job (with pending receipts) in the generation for every current,
    /// non-deleted head, at `priority`, and wakes workers; returns how many were queued.
    async fn queue_rebuild(
        &mut self,
        generation: &Generation,
        priority: i64,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<i64>;
    /// Ends a retiring generation's work: its open receipts `superseded` and its unfinished
    /// jobs `cancelled` (with `cause`), its chunk rows and searchable answers deleted. Returns
    /// (jobs cancelled, chunk rows deleted).
    async fn stop_work(
        &mut self,
        id: &str,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<(i64, i64)>;
    /// The generation's chunk rows.
    async fn chunk_rows(&mut self, id: &str) -> Result<i64>;
    /// Records what the caller read back when it finished retiring the generation.
    async fn record_retired(&mut self, id: &str, evidence: &serde_json::Value) -> Result<()>;
    /// The generation as operators see it, with its progress.
    async fn view(&mut self, id: &str, now: Micros) -> Result<GenerationView>;
}

/// The state of `id`, or `generation_not_found`.
async fn existing<W: GenerationWrites + ?Sized>(
    writes: &mut W,
    id: &str,
) -> Result<GenerationState> {
    writes
        .state_of(id)
        .await?
        .ok_or_else(|| LedgerError::GenerationNotFound(id.to_owned()))
}

/// Applies one generation change through an engine's writes: the one path for every
/// generation change, on every ledger.
pub(crate) async fn change<W: GenerationWrites + ?Sized>(
    writes: &mut W,
    command: GenerationCommand,
    now: Micros,
) -> Result<GenerationChanged> {
    let GenerationCommand {
        change,
        actor,
        reason,
    } = command;
    let mut jobs = 0;
    let mut chunk_rows_deleted = 0;
    let mut previous = None;
    let mut missing = (0, Vec::new());
    let id = match change {
        GenerationChange::Create {
            generation,
            priority,
        } => {
            let state = writes.state_of(&generation.id).await?;
            if let Some(state) = state {
                check(&generation.id, state, "create")?;
            }
            let building = writes.in_state(GenerationState::Building).await?;
            if let Some(building) = building.filter(|building| *building != generation.id) {
                return Err(refuse_second_build(&building, &generation.id));
            }
            let cause = format!("create: {reason}");
            if state.is_some() {
                writes.clear_retired_evidence(&generation.id).await?;
                writes
                    .set_state(
                        &generation.id,
                        GenerationState::Building,
                        &actor,
                        &cause,
                        now,
                    )
                    .await?;
            } else {
                writes
                    .insert(&generation, GenerationState::Building, &actor, &cause, now)
                    .await?;
            }
            let rebuild = format!("rebuild:{}", generation.id);
            jobs = writes
                .queue_rebuild(&generation, priority, &actor, &rebuild, now)
                .await?;
            generation.id
        }
        GenerationChange::Switch { id, force } => {
            check(&id, existing(writes, &id).await?, "switch to")?;
            missing = writes.missing_heads(&id).await?;
            if missing.0 > 0 && !force {
                return Err(incomplete(&id, missing.0, &missing.1));
            }
            previous = writes.in_state(GenerationState::Active).await?;
            if let Some(previous) = &previous {
                let cause = format!("switch to {id}: {reason}");
                writes
                    .set_state(previous, GenerationState::Standby, &actor, &cause, now)
                    .await?;
            }
            let cause = match missing.0 {
                0 => format!("switch: {reason}"),
                count => format!("forced switch with {count} head(s) missing: {reason}"),
            };
            writes
                .set_state(&id, GenerationState::Active, &actor, &cause, now)
                .await?;
            id
        }
        GenerationChange::Retire { id } => {
            check(&id, existing(writes, &id).await?, "retire")?;
            let cause = format!("retire: {reason}");
            writes
                .set_state(&id, GenerationState::Retiring, &actor, &cause, now)
                .await?;
            let gone = format!("generation_retired:{id}");
            (jobs, chunk_rows_deleted) = writes.stop_work(&id, &actor, &gone, now).await?;
            id
        }
        GenerationChange::Retired { id, evidence } => {
            check(&id, existing(writes, &id).await?, "finish retiring")?;
            let rows = writes.chunk_rows(&id).await?;
            if rows != 0 {
                return Err(LedgerError::Internal(format!(
                    "generation {id} still has {rows} chunk rows after retiring"
                )));
            }
            let mut evidence = evidence;
            if let Some(object) = evidence.as_object_mut() {
                object.insert("chunk_rows".to_owned(), rows.into());
            }
            writes.record_retired(&id, &evidence).await?;
            let cause = format!("retired: {reason}");
            writes
                .set_state(&id, GenerationState::Retired, &actor, &cause, now)
                .await?;
            id
        }
    };
    Ok(GenerationChanged {
        generation: writes.view(&id, now).await?,
        jobs,
        chunk_rows_deleted,
        previous,
        missing: missing.0,
        missing_sample: missing.1,
    })
}
