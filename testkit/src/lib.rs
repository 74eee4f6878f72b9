//! # testkit: what cairn's tests share, and nothing the product links
//!
//! A dev-only crate: every crate names it under `[dev-dependencies]` and none under
//! `[dependencies]`, so `cairn serve` and `cairn worker` contain neither the test servers nor
//! the conformance suite.
//!
//! ## Model
//! - **Test servers** are the real programs `scripts/setup` installs, each started on free
//!   loopback ports ([`ports::free_ports`]) with a temporary directory, ready only when it
//!   answers on its own port, and stopped by PID ([`ports::stop_child`]):
//!   [`postgres::PostgresServer`] (Debian's PostgreSQL 15, run as an unprivileged user when
//!   the tests run as root), [`qdrant::QdrantServer`] (the official Qdrant v1.18.3 build) and
//!   [`graph::GraphServer`] (ArcadeDB with its Bolt 4.4 plugin) and
//!   [`embedding::EmbeddingServer`] (llama.cpp's OpenAI-compatible embedding server, from
//!   PyPI) and [`oauth_server::AuthorizationServer`] (Debian's glewlwyd, an OAuth 2.1/OIDC
//!   authorization server). The one fake, [`embedding::FaultyEmbeddingProxy`], only injects 429s, error
//!   statuses and malformed answers in front of the real embedding server.
//! - **Git repositories** for the connectors' tests are made with the `git` binary, with one
//!   identity and one clock ([`git::git`], [`git::commit`]), and served on loopback by Debian's
//!   `git daemon` and `git http-backend` ([`git_servers`]).
//! - **The ledger conformance suite** ([`conformance`], one file per topic) is the behaviour
//!   every [`receipts::Ledger`] implementation must show; [`ledger_conformance!`] expands to one
//!   test per check for a factory of fresh ledgers.
//!
//! ## Invariants
//! - A server that lost its port to another process before it bound it starts again on new
//!   ports; dropping a server stops it and removes its files.
//! - A conformance check names only the ledger traits, never an engine's internals, so a
//!   check that passes on one engine and fails on another is a difference of semantics.

pub mod conformance;
pub mod embedding;
pub mod git;
pub mod git_servers;
pub mod graph;
pub mod netns;
pub mod oauth_server;
pub mod ports;
pub mod postgres;
pub mod qdrant;
