//! Drift: how a derived store can differ from what the ledger promises ([`crate::verify`]).

closed_enum! {
    /// How a store differs from what the ledger promises.
    DriftKind {
        /// Fewer points or rows than the receipt promised (none at all included).
        Missing => "missing",
        /// Points or rows the ledger does not account for.
        Extra => "extra",
        /// `is_current` disagrees with the ledger's head.
        StaleCurrent => "stale_current",
        /// Vectors of another dimension than the generation's.
        WrongDims => "wrong_dims",
        /// Bytes or rows whose checksum differs.
        Checksum => "checksum",
        /// A payload that names another dataset or source.
        Payload => "payload",
        /// Replicas of one shard that answer differently (a cluster).
        ReplicaDivergence => "replica_divergence",
    }
}
