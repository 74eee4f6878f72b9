//! Generation changes, engine-independent: which transitions each state allows, and the
//! refusals both ledgers send (same codes, same words).
//!
//! ## States
//! `building` -> `active` (switch) -> `standby` (another switch) -> `active` (rollback) ...;
//! `building` or `standby` -> `retiring` (retire: no more work, chunk rows deleted) ->
//! `retired` (the caller deleted the vectors and read them back as gone). A retired
//! generation can be created again (it is rebuilt from scratch). The active generation is
//! never retired: switch away first.

use crate::error::LedgerError;
use crate::model::GenerationState;

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
pub(crate) fn check(id: &str, state: GenerationState, action: &str) -> Result<(), LedgerError> {
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
