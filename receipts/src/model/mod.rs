//! Domain types, one file per entity: sources and revisions, jobs and leases, projection
//! receipts, history, erasure, generations, chunks, hits and counts. Every closed set of
//! values (states, kinds, backends) is a `closed_enum!`: the same text form in the ledger,
//! on the wire and in errors.

/// Declares a closed string enum with `Display`, `FromStr` (whose error lists the valid
/// values) and serde in snake_case. One macro so that every state type behaves the same way.
macro_rules! closed_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            ::serde::Serialize, ::serde::Deserialize,
        )]
        #[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The stable text form stored in the ledger and sent over the wire.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::model::UnknownValue;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::model::UnknownValue {
                        kind: stringify!($name),
                        value: text.to_owned(),
                        valid: &[$($text,)+],
                    }),
                }
            }
        }
    };
}

mod chunks;
mod connectors;
mod counts;
mod drift;
mod erasure;
mod generations;
mod history;
mod hits;
mod jobs;
mod projection;
mod sources;

pub use chunks::{ChunkRef, ChunkRow, ChunkSummary};
pub use connectors::{
    owner_of, AccessFrom, Connector, ConnectorAccess, ConnectorChange, ConnectorChanged,
    ConnectorCommand, ConnectorFile, ConnectorKind, ConnectorState, NewConnector, Removal,
    SyncFile, SyncProgress, SyncReport, SyncRun, MAX_REPORTED_FILES,
};
pub use counts::{DatasetSummary, LedgerCounts};
pub use drift::{
    stores, ChunkPromise, DriftKind, DriftRecord, DriftState, LedgerBackup, LedgerBucket,
    PassChange, PassState, RestoreRecord, SettledHead, VerifyPass, VerifyTier,
};
pub use erasure::{Erasure, ErasureRemaining, ErasureRequest};
pub use generations::{
    Generation, GenerationChange, GenerationChanged, GenerationCommand, GenerationProgress,
    GenerationState, GenerationView,
};
pub use history::HistoryEntry;
pub use hits::{BoundHit, HitRef, LexicalHit};
pub use jobs::{Failure, FailureClass, Heartbeat, Job, JobKind, JobState, LeaseToken};
pub use projection::{Backend, ProjectionReceipt, ReceiptState, ReceiptUpdate, UnitWrite};
pub use sources::{
    AcceptStatus, Acceptance, Change, ContentBlock, Document, Revision, RevisionDetail,
    SourceListing, SourceView, Submission, MAX_LISTING_PAGE,
};

/// A text value that is not one of a closed enum's values.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown {kind} `{value}`; valid values: {}", valid.join(", "))]
pub struct UnknownValue {
    /// The enum's name.
    pub kind: &'static str,
    /// The value that was given.
    pub value: String,
    /// The values that would have been accepted.
    pub valid: &'static [&'static str],
}
