//! cairn's end-to-end tests: the HTTP API over a real SQLite ledger, the served binary under
//! SIGKILL, the ops dashboard in headless Chromium.

mod access;
mod api;
mod backup;
mod browser;
mod changes;
mod chaos;
mod cli;
mod clients;
mod common;
mod confinement;
mod connectors;
mod contract;
mod crash;
mod embedding;
mod erasure;
mod eval;
mod filterable;
mod generations;
mod hook;
mod hosts;
mod mcp;
mod ops;
mod postgres;
mod projection;
mod prometheus;
mod server;
mod sign_in;
mod tokens;
mod topology;
mod validity;
mod verify;
mod webhooks;
