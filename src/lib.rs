//! # cairn
//!
//! The `cairn` binary's library half: configuration (`config`), the assembled HTTP application
//! and its contract (`openapi`), the server loop (`server`), the data directory (`datadir`),
//! projection assembly (`projection`), the command-line client and its commands (`cli/`),
//! the benchmarks (`bench/`), the evaluation (`eval`), the coding-host hooks (`hook`) and the
//! MCP stdio bridge (`mcp_stdio`). `main.rs` only parses flags, sets
//! up logging and calls into here, so tests drive the same code without a socket ([`app`]) or
//! with one ([`serve`]).
//!
//! ## Invariants
//! - The application is the union of each crate's router over one shared
//!   `Arc<dyn receipts::Ledger>`; no crate reaches into another's internals.
//! - On first start with no token in the ledger, an admin token is created and written to
//!   `<data-dir>/admin.token` (mode 0600) before the API accepts requests.
//! - Shutdown (SIGTERM/SIGINT) stops accepting connections, lets in-flight requests finish and
//!   then closes the ledger; every receipt already sent is durable.

mod app;
pub mod backup;
pub mod bench;
pub mod cli;
pub mod config;
pub mod datadir;
pub mod eval;
pub mod filterable;
pub mod hook;
pub mod mcp_stdio;
pub mod openapi;
mod process;
pub mod projection;
pub mod server;

pub use app::{app, app_with_graph};
pub use config::Config;
pub use process::{
    ensure_admin_token, open_ledger, serve, shutdown_signal, work, worker_owner, write_secret_file,
    SimulatedWork, WorkOptions,
};
