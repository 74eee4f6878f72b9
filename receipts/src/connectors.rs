//! Connector rules shared by every ledger engine: what a new connector may be ([`validate`]),
//! what each change does to its state and its open run ([`plan`]), and who may move a
//! source's head ([`ownership`]). Engines read the current rows, ask these functions, and
//! write what they answer; nothing here touches storage.
//!
//! ## Model
//! - A connector is `active`, `paused` or `removed` (final). It has at most one open run (a
//!   `sync` job that is pending, running or waiting to retry): a unique index holds that.
//! - Scheduling is one rule, applied at every claim: an active connector without an open run
//!   gets one, due one interval after its last run changed state (at once if it never ran, or
//!   if a push-hook delivery arrived after its last run started: that run may have fetched
//!   before the push); a
//!   removed connector whose removal tombstones gets one at once while it still owns a live
//!   source. A run that completed, died or was cancelled is therefore followed by the next
//!   without any special case in the run's ending.
//! - A source's owner is `connector:<id>` or nothing (API ingest). A live head belongs to its
//!   owner; a tombstoned or absent head belongs to nobody. A removed connector owns nothing,
//!   except for its own last run (the stored owner is the submitter).

use uuid::Uuid;

use crate::error::{LedgerError, Result};
use crate::model::{
    Connector, ConnectorChange, ConnectorKind, ConnectorState, Job, JobState, NewConnector, Removal,
};
use crate::validate;

/// Claim priority of a connector's run: above fresh ingest's 0, so that a run starts at its
/// interval even behind a backlog of projection (the run itself only reads and accepts).
pub const SYNC_PRIORITY: i64 = 1;

/// Shortest interval between runs.
pub const MIN_INTERVAL_MS: i64 = 1_000;
/// Longest interval between runs (a year).
pub const MAX_INTERVAL_MS: i64 = 366 * 24 * 3_600 * 1_000;
/// Largest per-file size limit (the ingest limit is smaller; this only bounds the setting).
pub const MAX_FILE_BYTES: i64 = 1 << 30;
/// Most include plus exclude globs.
pub const MAX_GLOBS: usize = 64;
/// Longest location or glob, in characters.
pub const MAX_LOCATION_CHARS: usize = 4_096;

/// Checks a new connector before anything is stored.
pub fn validate(new: &NewConnector) -> Result<()> {
    validate::dataset(&new.dataset)?;
    let location = new.location.as_str();
    if location.trim().is_empty() || location.chars().count() > MAX_LOCATION_CHARS {
        return Err(LedgerError::invalid(
            "invalid_connector",
            format!("location must be 1-{MAX_LOCATION_CHARS} characters"),
        ));
    }
    if location.chars().any(char::is_control) {
        return Err(LedgerError::invalid(
            "invalid_connector",
            "location must not contain control characters",
        ));
    }
    match (new.kind, new.git_ref.as_deref()) {
        (ConnectorKind::Git, None) => {
            return Err(LedgerError::invalid(
                "invalid_connector",
                "a git connector needs a ref (a branch, tag or commit)",
            ))
        }
        (ConnectorKind::Git, Some(reference))
            if reference.is_empty()
                || reference.len() > 255
                || reference
                    .chars()
                    .any(|c| c.is_control() || c.is_whitespace()) =>
        {
            return Err(LedgerError::invalid(
                "invalid_connector",
                "the git ref must be 1-255 characters without spaces or control characters",
            ))
        }
        (ConnectorKind::Folder, Some(_)) => {
            return Err(LedgerError::invalid(
                "invalid_connector",
                "a folder connector takes no git ref",
            ))
        }
        (ConnectorKind::Folder, None) if !location.starts_with('/') => {
            return Err(LedgerError::invalid(
                "invalid_connector",
                "a folder connector's location must be an absolute path (the workers resolve \
                 it on their own machine)",
            ))
        }
        _ => {}
    }
    if new.include.len() + new.exclude.len() > MAX_GLOBS {
        return Err(LedgerError::invalid(
            "invalid_connector",
            format!("at most {MAX_GLOBS} include and exclude globs in all"),
        ));
    }
    if let Some(glob) = new
        .include
        .iter()
        .chain(&new.exclude)
        .find(|glob| glob.is_empty() || glob.chars().count() > MAX_LOCATION_CHARS)
    {
        return Err(LedgerError::invalid(
            "invalid_connector",
            format!(
                "glob `{}` must be 1-{MAX_LOCATION_CHARS} characters",
                glob.chars().take(64).collect::<String>()
            ),
        ));
    }
    validate_access(new)?;
    if let Some(name) = &new.credentials {
        if new.kind != ConnectorKind::Git {
            return Err(LedgerError::invalid(
                "invalid_connector",
                "credentials are for a remote git repository; a folder connector takes none",
            ));
        }
        let plain = !name.is_empty()
            && name.len() <= 255
            && name != "."
            && name != ".."
            && !name.contains(['/', '\\'])
            && !name.chars().any(char::is_control);
        if !plain {
            return Err(LedgerError::invalid(
                "invalid_connector",
                "credentials must name a file in the workers' credentials folder: 1-255 \
                 characters, no `/` and no control characters",
            ));
        }
    }
    if !(1..=MAX_FILE_BYTES).contains(&new.max_file_bytes) {
        return Err(LedgerError::invalid(
            "invalid_connector",
            format!("max_file_bytes must be 1-{MAX_FILE_BYTES}"),
        ));
    }
    if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&new.interval_ms) {
        return Err(LedgerError::invalid(
            "invalid_connector",
            format!(
                "the interval must be between 1 s and 366 days (got {} ms)",
                new.interval_ms
            ),
        ));
    }
    Ok(())
}

/// A connector's access settings: readers checked, `posix` for a folder only, a rules file for
/// git only, named by a relative path inside the repository.
fn validate_access(new: &NewConnector) -> Result<()> {
    let invalid = |message: String| Err(LedgerError::invalid("invalid_connector", message));
    let access = &new.access;
    if let Some(readers) = &access.readers {
        crate::access::SourceAccess {
            readers: readers.clone(),
        }
        .checked()?;
    }
    if access.from.is_some() && new.kind != ConnectorKind::Folder {
        return invalid(format!(
            "`access.from` reads a folder's file system; a {} connector takes `access.file`",
            new.kind
        ));
    }
    if let Some(file) = &access.file {
        if new.kind != ConnectorKind::Git {
            return invalid(
                "`access.file` is a rules file inside a git repository; a folder connector \
                 takes `access.from: posix` or `access.readers`"
                    .to_owned(),
            );
        }
        let parts_fine = file
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
        if crate::validate::source_key(file).is_err() || !parts_fine {
            return invalid(format!(
                "`access.file` must be a relative path inside the repository (got `{}`)",
                crate::filter::printable(file)
            ));
        }
    }
    Ok(())
}

/// How long a push-hook delivery id is remembered (7 days, in microseconds): a replay within
/// it changes nothing; providers redeliver within hours.
pub const DELIVERY_RETENTION_MICROS: i64 = 7 * 24 * 3_600 * 1_000_000;

/// The delivery a change records, checked: at most 200 characters, no control characters.
pub fn delivery(change: &ConnectorChange) -> Result<Option<&str>> {
    let ConnectorChange::RunNow {
        delivery: Some(delivery),
        ..
    } = change
    else {
        return Ok(None);
    };
    if delivery.is_empty() || delivery.len() > 200 || delivery.chars().any(char::is_control) {
        return Err(LedgerError::invalid(
            "invalid_delivery",
            "a delivery id must be 1-200 characters without control characters",
        ));
    }
    Ok(Some(delivery))
}

/// The refusal of a delivery already recorded.
pub fn duplicate_delivery(delivery: &str) -> LedgerError {
    LedgerError::invalid(
        "duplicate_delivery",
        format!(
            "delivery `{}` was received already; nothing was changed",
            crate::filter::printable(delivery)
        ),
    )
}

/// What a change does to a connector's open run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStep {
    /// Nothing.
    Keep,
    /// Queue a run due now (there is no open run).
    Queue,
    /// Make the waiting open run due now.
    MakeDue,
    /// Cancel the open run if it waits; ask it to stop if it runs.
    Stop,
}

/// What a change to an existing connector does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The new state, when it changes.
    pub state: Option<(ConnectorState, Option<Removal>)>,
    /// The open run's step.
    pub run: RunStep,
    /// The cause history records.
    pub cause: String,
}

fn refused(connector: &Connector, action: &str, fix: &str) -> LedgerError {
    LedgerError::invalid(
        "connector_state",
        format!(
            "connector {} is {}; cannot {action}{fix}",
            connector.id, connector.state
        ),
    )
}

/// The connector a change names.
pub fn target(change: &ConnectorChange) -> Option<Uuid> {
    match change {
        ConnectorChange::Create(_) => None,
        ConnectorChange::Pause { id }
        | ConnectorChange::Resume { id }
        | ConnectorChange::RunNow { id, .. }
        | ConnectorChange::Remove { id, .. } => Some(*id),
    }
}

/// Decides a change to `connector`, whose open run is `open`. Asking for the state it already
/// has changes nothing and is not an error (a retried request).
pub fn plan(connector: &Connector, open: Option<&Job>, change: &ConnectorChange) -> Result<Plan> {
    let waiting = open.is_some_and(|run| run.state != JobState::Running);
    let start = if waiting {
        RunStep::MakeDue
    } else if open.is_some() {
        RunStep::Keep
    } else {
        RunStep::Queue
    };
    let plan = |state, run, cause: &str| Plan {
        state,
        run,
        cause: cause.to_owned(),
    };
    use ConnectorState::{Active, Paused, Removed};
    Ok(match (change, connector.state) {
        (ConnectorChange::Create(_), _) => {
            return Err(LedgerError::Internal(
                "a create reached the plan of an existing connector".into(),
            ))
        }
        (_, Removed) => match change {
            ConnectorChange::Remove { removal, .. } if Some(*removal) == connector.removal => {
                plan(None, RunStep::Keep, "already removed")
            }
            _ => {
                return Err(refused(
                    connector,
                    "change it",
                    " (a removed connector is final)",
                ))
            }
        },
        (ConnectorChange::Pause { .. }, Active) => {
            plan(Some((Paused, None)), RunStep::Stop, "paused")
        }
        (ConnectorChange::Pause { .. }, Paused) => plan(None, RunStep::Keep, "already paused"),
        (ConnectorChange::Resume { .. }, Paused) => plan(Some((Active, None)), start, "resumed"),
        (ConnectorChange::Resume { .. }, Active) => plan(None, RunStep::Keep, "already active"),
        (ConnectorChange::RunNow { .. }, Active) => plan(None, start, "run now"),
        (ConnectorChange::RunNow { .. }, Paused) => {
            return Err(refused(connector, "run it", "; resume it first"))
        }
        (ConnectorChange::Remove { removal, .. }, Active | Paused) => match removal {
            Removal::Keep => plan(
                Some((Removed, Some(Removal::Keep))),
                RunStep::Stop,
                "removed",
            ),
            // The last run tombstones what the connector created: the waiting run becomes it,
            // a running one ends first and the scheduler then queues it.
            Removal::Tombstone => plan(
                Some((Removed, Some(Removal::Tombstone))),
                start,
                "removed; its sources are tombstoned by a last run",
            ),
        },
    })
}

/// A run an engine queues, beyond its connector: why it is due when it is, who queued it and
/// why, and its attempts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueuedRun<'a> {
    pub(crate) rule: &'a str,
    pub(crate) actor: &'a str,
    pub(crate) cause: &'a str,
    pub(crate) max_attempts: i64,
}

/// Who owns a source, as acceptance reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    /// The stored owner (`connector:<id>`), if any.
    pub owner: Option<String>,
    /// Whether the owning connector is removed (it then owns nothing).
    pub owner_removed: bool,
    /// Whether the head is live (exists and is not a tombstone).
    pub live: bool,
}

/// Whether `submitter` (`connector:<id>`, or `None` for API ingest) may move the head of a
/// source owned as `ownership` says. A refusal names the owner and the fix.
pub fn ownership(submitter: Option<&str>, ownership: &Ownership, source: &str) -> Result<()> {
    if !ownership.live || submitter == ownership.owner.as_deref() {
        return Ok(());
    }
    let holder = ownership
        .owner
        .as_deref()
        .filter(|_| !ownership.owner_removed);
    match (submitter, holder) {
        (None, Some(owner)) => Err(LedgerError::invalid(
            "owned_by_connector",
            format!(
                "source {source} is kept by {owner}: change the file where the connector reads \
                 it, or remove the connector (keeping its sources) first"
            ),
        )),
        (Some(_), Some(owner)) => Err(LedgerError::invalid(
            "owned_by_another",
            format!("source {source} is kept by {owner}; it is left as it is"),
        )),
        (Some(_), None) => Err(LedgerError::invalid(
            "owned_by_another",
            format!(
                "source {source} was created through the API, not by this connector; it is \
                 left as it is"
            ),
        )),
        (None, None) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AccessFrom, ConnectorAccess};

    fn connector(state: ConnectorState, removal: Option<Removal>) -> Connector {
        Connector {
            id: Uuid::nil(),
            dataset: "docs".into(),
            kind: ConnectorKind::Folder,
            location: "/srv/docs".into(),
            git_ref: None,
            include: vec![],
            exclude: vec![],
            max_file_bytes: 1 << 20,
            interval_ms: 60_000,
            access: ConnectorAccess::default(),
            credentials: None,
            state,
            removal,
            created_by: "t".into(),
            reason: "r".into(),
            created_at: 0,
            changed_by: "t".into(),
            change_cause: "created".into(),
            changed_at: 0,
        }
    }

    #[test]
    fn pause_stops_resume_queues_and_a_removed_connector_is_final() {
        let id = Uuid::nil();
        let active = connector(ConnectorState::Active, None);
        let paused = plan(&active, None, &ConnectorChange::Pause { id }).expect("pause");
        assert_eq!(paused.state, Some((ConnectorState::Paused, None)));
        assert_eq!(paused.run, RunStep::Stop);
        let stopped = connector(ConnectorState::Paused, None);
        let resumed = plan(&stopped, None, &ConnectorChange::Resume { id }).expect("resume");
        assert_eq!(resumed.run, RunStep::Queue);
        let refused = plan(
            &stopped,
            None,
            &ConnectorChange::RunNow { id, delivery: None },
        );
        assert!(refused.is_err_and(|error| error.code() == "connector_state"));
        let removed = connector(ConnectorState::Removed, Some(Removal::Keep));
        assert!(plan(&removed, None, &ConnectorChange::Resume { id }).is_err());
        let again = plan(
            &removed,
            None,
            &ConnectorChange::Remove {
                id,
                removal: Removal::Keep,
            },
        )
        .expect("idempotent");
        assert_eq!((again.state, again.run), (None, RunStep::Keep));
    }

    #[test]
    fn a_live_head_belongs_to_its_owner_only() {
        let mine = "connector:a";
        let held = |owner: Option<&str>, removed, live| Ownership {
            owner: owner.map(str::to_owned),
            owner_removed: removed,
            live,
        };
        assert!(ownership(Some(mine), &held(Some(mine), false, true), "k").is_ok());
        assert!(ownership(Some(mine), &held(None, false, false), "k").is_ok());
        assert!(ownership(None, &held(Some(mine), false, false), "k").is_ok());
        let api = ownership(None, &held(Some(mine), false, true), "k");
        assert!(api.is_err_and(|error| error.code() == "owned_by_connector"));
        let other = ownership(Some("connector:b"), &held(Some(mine), false, true), "k");
        assert!(other.is_err_and(|error| error.code() == "owned_by_another"));
        let api_source = ownership(Some(mine), &held(None, false, true), "k");
        assert!(api_source.is_err_and(|error| error.code() == "owned_by_another"));
        // A removed connector's kept sources are free for the API, and its own last run.
        assert!(ownership(None, &held(Some(mine), true, true), "k").is_ok());
        assert!(ownership(Some(mine), &held(Some(mine), true, true), "k").is_ok());
    }

    #[test]
    fn a_bad_connector_is_refused_with_its_reason() {
        let good = NewConnector {
            dataset: "docs".into(),
            kind: ConnectorKind::Folder,
            location: "/srv/docs".into(),
            git_ref: None,
            include: vec![],
            exclude: vec![],
            max_file_bytes: 1 << 20,
            interval_ms: 60_000,
            access: Default::default(),
            credentials: None,
        };
        assert!(validate(&good).is_ok());
        let posix = NewConnector {
            access: ConnectorAccess {
                from: Some(AccessFrom::Posix),
                readers: Some(vec!["group:staff".into()]),
                file: None,
            },
            ..good.clone()
        };
        assert!(validate(&posix).is_ok());
        let git = |file: &str| NewConnector {
            kind: ConnectorKind::Git,
            location: "/srv/repo".into(),
            git_ref: Some("main".into()),
            access: ConnectorAccess {
                file: Some(file.into()),
                ..Default::default()
            },
            ..good.clone()
        };
        assert!(validate(&git(".cairn/access")).is_ok());
        let named = |credentials: &str| NewConnector {
            credentials: Some(credentials.into()),
            ..git(".cairn/access")
        };
        assert!(validate(&named("github.toml")).is_ok());
        for name in ["", "..", "a/b", "../x", "a\\b", "x\ny"] {
            let error = validate(&named(name)).expect_err("a credentials name with a path");
            assert_eq!(error.code(), "invalid_connector", "{name:?}");
        }
        let folder_with_credentials = NewConnector {
            credentials: Some("github.toml".into()),
            ..good.clone()
        };
        assert!(validate(&folder_with_credentials).is_err());
        for refused in [
            NewConnector {
                access: ConnectorAccess {
                    readers: Some(vec!["alice".into()]),
                    ..Default::default()
                },
                ..good.clone()
            },
            NewConnector {
                access: ConnectorAccess {
                    file: Some("access".into()),
                    ..Default::default()
                },
                ..good.clone()
            },
            NewConnector {
                access: ConnectorAccess {
                    from: Some(AccessFrom::Posix),
                    ..Default::default()
                },
                ..git("access")
            },
            git("../access"),
            git("/etc/access"),
            git("a//b"),
        ] {
            let error = validate(&refused).expect_err("refused");
            let code = if refused.access.readers.is_some() {
                "invalid_access"
            } else {
                "invalid_connector"
            };
            assert_eq!(error.code(), code, "{refused:?}");
        }
        let relative = NewConnector {
            location: "docs".into(),
            ..good.clone()
        };
        assert!(validate(&relative).is_err());
        let git_without_ref = NewConnector {
            kind: ConnectorKind::Git,
            ..good.clone()
        };
        assert!(validate(&git_without_ref).is_err());
        let too_often = NewConnector {
            interval_ms: 10,
            ..good
        };
        assert!(validate(&too_often).is_err());
    }
}
