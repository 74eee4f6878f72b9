//! cairn's end-to-end tests: the HTTP API over a real SQLite ledger, and the served binary
//! under SIGKILL.

mod api;
mod chaos;
mod cli;
mod common;
mod crash;
mod eval;
mod projection;
