//! The SQLite ledger.
//!
//! One writer task owns the only write connection. Callers hand it operations over a channel;
//! it drains whatever is queued (up to [`SqliteOptions::max_group`] submissions), runs them in
//! one `BEGIN IMMEDIATE` transaction, each inside its own `SAVEPOINT` so that a refused or
//! failed item rolls back alone, commits once (WAL, `synchronous=FULL`: the commit is on disk
//! when `COMMIT` returns) and only then answers every caller. Concurrent acceptances therefore
//! share one fsync (group commit). Reads use a separate pool and never block the writer (WAL).
//!
//! One file per role, and no circle of imports: `ledger` opens the ledger (migrations,
//! connections, the checkpointer) and implements the traits that go through the writer;
//! `writer` runs the writer task, group commit and acceptance waves; `leases`, `projection`,
//! `tokens`, `generations`, `erasure`, `connectors` and `verify` hold what the writer executes; `acceptance`, `reads`
//! and `operations` implement their traits; `options` and `rows` are shared by all.

mod acceptance;
mod access;
mod connectors;
mod erasure;
mod events;
mod generations;
mod leases;
mod ledger;
mod operations;
mod options;
mod outbox;
mod projection;
mod reads;
mod rows;
mod tokens;
mod validity;
mod verify;
mod webhooks;
mod writer;

pub use ledger::{connect_options, migrate, SqliteLedger};
pub use options::SqliteOptions;
