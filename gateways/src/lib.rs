//! # gateways: adapters to real stores
//!
//! Empty until the projection issue lands: relational chunk rows, the local embedding model,
//! and vector stores, each behind a small capability trait with read-back. Depends on
//! `receipts` only.
