//! # worker: leased projection workers
//!
//! Empty until the worker issue lands: it will claim jobs from the ledger under leases
//! (fencing tokens checked on every write), heartbeat, project revisions through `gateways`,
//! read every write back, and retry, cancel and rescue jobs. Like every crate it depends on
//! `receipts` only.
