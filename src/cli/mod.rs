//! The command-line client: the HTTP client and the commands that talk to a running server
//! (`ingest`, `search`, `status`, `ops`), and `cairn token` on a data directory.

pub mod client;
pub mod ops;
pub mod tokens;
