//! Events: what happened to the ledger's state that a client may want to hear about, read
//! from the ledger's own outbox.
//!
//! ## Model
//! - An [`Event`] is written by the store itself (triggers on both engines), in the
//!   transaction that makes the change it reports: a receipt verified in one store and then in
//!   all of them, a receipt failed, a job dead, a head that left a revision, a deletion, an
//!   erasure, an access change, a connector's run finished, verify's drift and finished
//!   passes, a generation switched. It names identities (dataset, source key, revision, job)
//!   and never content.
//! - Each event has a sequence number, the feed's cursor: sequence order is commit order on
//!   both engines (SQLite commits one writer at a time; PostgreSQL numbers a transaction's
//!   events at its commit, one committing transaction at a time), so a consumer that reads
//!   `after` its last number misses nothing and sees nothing twice.
//! - Retention removes events older than a configured age; [`EventPage::pruned_through`] is
//!   the highest number removed so far, so a cursor below it has missed events
//!   (`cursor_expired`).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::clock::Micros;
use crate::error::{LedgerError, Result};

/// The version of the events' shape; a change that removes or renames a field bumps it.
pub const EVENTS_VERSION: u32 = 1;

/// The kinds of event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventType {
    /// A receipt turned `verified` in one store (`data.backend`), or, once every receipt of
    /// the job is verified or excluded, in all of them (`data.backend` = `all`).
    #[serde(rename = "receipt.verified")]
    ReceiptVerified,
    /// A receipt turned `failed`.
    #[serde(rename = "receipt.failed")]
    ReceiptFailed,
    /// A job will not run again without an operator (`dead`).
    #[serde(rename = "job.dead")]
    JobDead,
    /// A source's head moved off this revision (`data.superseded_by`).
    #[serde(rename = "source.superseded")]
    SourceSuperseded,
    /// A source was deleted: its head is this tombstone.
    #[serde(rename = "source.tombstoned")]
    SourceTombstoned,
    /// A source's earlier revisions were erased (identities only).
    #[serde(rename = "source.erased")]
    SourceErased,
    /// A source's readers changed (`data.version`).
    #[serde(rename = "access.changed")]
    AccessChanged,
    /// A connector's run ended (`data.outcome`, `data.report` with its counts).
    #[serde(rename = "connector.run.finished")]
    ConnectorRunFinished,
    /// Verify found a store disagreeing with the receipts.
    #[serde(rename = "verify.drift")]
    VerifyDrift,
    /// A verify pass went through every bucket.
    #[serde(rename = "verify.pass.finished")]
    VerifyPassFinished,
    /// A generation became the active one.
    #[serde(rename = "generation.switched")]
    GenerationSwitched,
}

impl EventType {
    /// Every kind, in a stable order.
    pub const ALL: [EventType; 11] = [
        EventType::ReceiptVerified,
        EventType::ReceiptFailed,
        EventType::JobDead,
        EventType::SourceSuperseded,
        EventType::SourceTombstoned,
        EventType::SourceErased,
        EventType::AccessChanged,
        EventType::ConnectorRunFinished,
        EventType::VerifyDrift,
        EventType::VerifyPassFinished,
        EventType::GenerationSwitched,
    ];

    /// Its name on the wire and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ReceiptVerified => "receipt.verified",
            EventType::ReceiptFailed => "receipt.failed",
            EventType::JobDead => "job.dead",
            EventType::SourceSuperseded => "source.superseded",
            EventType::SourceTombstoned => "source.tombstoned",
            EventType::SourceErased => "source.erased",
            EventType::AccessChanged => "access.changed",
            EventType::ConnectorRunFinished => "connector.run.finished",
            EventType::VerifyDrift => "verify.drift",
            EventType::VerifyPassFinished => "verify.pass.finished",
            EventType::GenerationSwitched => "generation.switched",
        }
    }
}

impl std::str::FromStr for EventType {
    type Err = LedgerError;

    fn from_str(text: &str) -> Result<EventType> {
        EventType::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| {
                LedgerError::invalid(
                    "invalid_event_type",
                    format!(
                        "unknown event type `{}`; one of {}",
                        text.chars().take(64).collect::<String>(),
                        EventType::ALL.map(EventType::as_str).join(", ")
                    ),
                )
            })
    }
}

/// One event from the outbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Its position in the outbox (the feed's cursor).
    pub seq: i64,
    /// Its stable id (`evt_<seq>`), the same in the feed and in every delivery.
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// When (epoch microseconds).
    pub at: Micros,
    /// The dataset, when the event is about one.
    pub dataset: Option<String>,
    /// The source key, when the event is about a source.
    pub source_key: Option<String>,
    /// The revision, when the event is about one.
    pub revision_id: Option<String>,
    /// The type's own fields (never content).
    pub data: serde_json::Value,
}

impl Event {
    /// The id of the event at `seq`.
    pub fn id_of(seq: i64) -> String {
        format!("evt_{seq}")
    }

    /// An event as an engine read it: its type's name is checked, its id derived.
    pub fn read(
        seq: i64,
        kind: &str,
        at: Micros,
        about: [Option<String>; 3],
        data: serde_json::Value,
    ) -> Result<Event> {
        let [dataset, source_key, revision_id] = about;
        Ok(Event {
            seq,
            id: Event::id_of(seq),
            event_type: kind.parse()?,
            at,
            dataset,
            source_key,
            revision_id,
            data,
        })
    }
}

/// Which events to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    /// Events after this sequence number.
    pub after: i64,
    /// Only these datasets (events about no dataset are left out when this is set).
    pub datasets: Option<Vec<String>>,
    /// Only these types.
    pub types: Option<Vec<EventType>>,
    /// At most this many.
    pub limit: u32,
}

/// The most events one read returns.
pub const MAX_EVENTS_PER_PAGE: u32 = 1000;

/// A page of events.
#[derive(Debug, Clone, PartialEq)]
pub struct EventPage {
    /// The events, in sequence order.
    pub events: Vec<Event>,
    /// Where the next read starts: the last event returned, or, when fewer than the limit
    /// matched, the newest event the read looked at (so a filtered consumer does not rescan).
    pub next_after: i64,
    /// The highest sequence number retention has removed; a cursor below it missed events.
    pub pruned_through: i64,
}

impl EventPage {
    /// A page read with `query` from a snapshot whose newest event is `newest`: the cursor
    /// moves to the last event when the page is full, else to the newest event looked at.
    pub fn of(
        events: Vec<Event>,
        query: &EventQuery,
        newest: i64,
        pruned_through: i64,
    ) -> EventPage {
        let next_after = match events.last() {
            Some(last) if events.len() as i64 >= page_limit(query.limit) => last.seq,
            _ => newest.max(query.after),
        };
        EventPage {
            events,
            next_after,
            pruned_through,
        }
    }
}

/// The outbox, read and pruned.
#[async_trait]
pub trait Events: Send + Sync {
    /// Events after `query.after`, in sequence order.
    async fn events(&self, query: &EventQuery) -> Result<EventPage>;

    /// Removes events that happened before `before`; how many went.
    async fn prune_events(&self, before: Micros) -> Result<u64>;

    /// The newest event's sequence number (0 when none): a read that matches no dataset,
    /// whose cursor moves to the newest event it looked at.
    async fn newest_event(&self) -> Result<i64> {
        Ok(self
            .events(&EventQuery {
                after: 0,
                datasets: Some(Vec::new()),
                types: None,
                limit: 1,
            })
            .await?
            .next_after)
    }
}

/// The limit a query asks for, bounded.
pub fn page_limit(limit: u32) -> i64 {
    i64::from(limit.clamp(1, MAX_EVENTS_PER_PAGE))
}
