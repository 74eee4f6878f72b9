//! # search: the query path
//!
//! Empty until the search issue lands: one deadline per request, vector hits bound to current
//! revisions, lexical fallback over the ledger's FTS5 index of current heads. Depends on
//! `receipts` only.
