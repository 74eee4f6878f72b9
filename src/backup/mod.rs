//! Backups and restores of a whole installation (the embedded default: the SQLite ledger and
//! qdrant-edge shards).
//!
//! ## Model
//! A backup is a folder:
//! - `ledger.db`, a consistent copy of the ledger at one point of its history (`VACUUM INTO`
//!   on a read connection, while acceptance goes on);
//! - `vectors/<generation>/`, each live generation's shard, copied *after* the ledger with
//!   its writes held for the copy only; or, for a Qdrant server (or with `--portable`),
//!   `vectors/<generation>.jsonl`, the portable dump ([`dump`]), which loads into either
//!   store;
//! - `manifest.json`, written last: no manifest, no backup ([`manifest`]).
//!
//! Because the stores are taken after the ledger, a verify of the restored installation can
//! find only extra points and stale flags, which it repairs without embedding. It never finds
//! missing vectors.
//!
//! A restore ([`restore`]) is a sequence of steps, each checked before the next. It runs with
//! the installation stopped. The ledger it replaces is moved aside, never deleted.
//!
//! ## Invariants
//! - A backup never overwrites; a restore never deletes.
//! - Every file of a backup is hashed in the manifest. A restore checks every hash before it
//!   changes anything.
//! - Erasures and revocations made after the backup are made again from the erasure journal
//!   (`receipts::journal`) before anything else runs.
//! - After a restore no lease from before it counts, and the restore ends with a full verify.

pub mod api;
pub mod dump;
pub mod manifest;
pub mod restore;
mod take;

pub use take::{new_id, take};
