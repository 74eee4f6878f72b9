//! The ledger's error type. Each variant has a stable `code` and an HTTP status, so that every
//! caller maps errors the same way; storage details are logged, never sent to clients.

/// A ledger error.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The submission failed validation; nothing was written.
    #[error("{message}")]
    Invalid {
        /// Stable code, e.g. `invalid_dataset`.
        code: &'static str,
        /// What is wrong, without echoing secrets.
        message: String,
    },
    /// The content is blocked in this dataset by an operator.
    #[error("content {sha256} is blocked in dataset `{dataset}`: {reason}")]
    ContentBlocked {
        /// Dataset.
        dataset: String,
        /// SHA-256 of the refused bytes.
        sha256: String,
        /// The operator's reason.
        reason: String,
    },
    /// The source does not exist.
    #[error("source `{source_key}` not found in dataset `{dataset}`")]
    SourceNotFound {
        /// Dataset.
        dataset: String,
        /// Source key.
        source_key: String,
    },
    /// The lease is no longer valid (expired, rescued, superseded or cancelled): the worker must
    /// stop; its write changed nothing.
    #[error("lease on job {job_id} is lost: {reason}")]
    LeaseLost {
        /// The job.
        job_id: uuid::Uuid,
        /// Why the lease no longer counts.
        reason: String,
    },
    /// The job does not exist.
    #[error("job {0} not found")]
    JobNotFound(uuid::Uuid),
    /// The token does not exist.
    #[error("token {0} not found")]
    TokenNotFound(uuid::Uuid),
    /// The token was already revoked (or rotated away).
    #[error("token {0} is already revoked")]
    TokenRevoked(uuid::Uuid),
    /// The job's state does not allow the action.
    #[error("job {job_id} is {state}; cannot {action}")]
    InvalidTransition {
        /// The job.
        job_id: uuid::Uuid,
        /// Its current state.
        state: String,
        /// What was asked.
        action: &'static str,
    },
    /// A different projection generation is active (model, dimension, chunker or backends
    /// changed under existing data).
    #[error(
        "projection generation {requested} differs from the active generation {active}: the \
         embedding model, dimension, chunker settings or backends changed; start a new \
         generation (rebuild) instead of mixing them"
    )]
    GenerationMismatch {
        /// The active generation.
        active: String,
        /// The one asked for.
        requested: String,
    },
    /// No generation has this id.
    #[error("generation {0} not found")]
    GenerationNotFound(String),
    /// A generation change that its state does not allow (switching to a retired generation,
    /// retiring the active one, switching while heads are missing without `force`, ...).
    #[error("{message}")]
    GenerationRefused {
        /// Stable code: `generation_incomplete`, `generation_state` or `generation_exists`.
        code: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
    /// A named fault point fired (tests only).
    #[error("injected fault at {0}")]
    Injected(crate::faults::FaultPoint),
    /// A bounded read ran out of time (the caller's deadline) and was interrupted.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// The ledger could not be reached (writer stopped, pool closed, disk I/O).
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    /// A storage error that is not the caller's fault.
    #[error("storage error: {0}")]
    Storage(#[from] sqlx::Error),
    /// A storage failure shared by several callers (a failed group write), by its message.
    #[error("storage error: {0}")]
    Internal(String),
    /// Stored data that cairn cannot decode (a bug or a foreign write).
    #[error("corrupt ledger row: {0}")]
    Corrupt(String),
}

impl LedgerError {
    /// Shorthand for a validation error.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        LedgerError::Invalid {
            code,
            message: message.into(),
        }
    }

    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            LedgerError::Invalid { code, .. } => code,
            LedgerError::ContentBlocked { .. } => "content_blocked",
            LedgerError::SourceNotFound { .. } => "source_not_found",
            LedgerError::LeaseLost { .. } => "lease_lost",
            LedgerError::JobNotFound(_) => "job_not_found",
            LedgerError::TokenNotFound(_) => "token_not_found",
            LedgerError::TokenRevoked(_) => "token_revoked",
            LedgerError::InvalidTransition { .. } => "invalid_transition",
            LedgerError::GenerationMismatch { .. } => "generation_mismatch",
            LedgerError::GenerationNotFound(_) => "generation_not_found",
            LedgerError::GenerationRefused { code, .. } => code,
            LedgerError::Injected(_) => "injected_fault",
            LedgerError::DeadlineExceeded(_) => "deadline_exceeded",
            LedgerError::Unavailable(_) => "ledger_unavailable",
            LedgerError::Storage(error) if is_unavailable(error) => "ledger_unavailable",
            LedgerError::Storage(_) | LedgerError::Internal(_) | LedgerError::Corrupt(_) => {
                "internal_error"
            }
        }
    }

    /// The HTTP status that goes with the code.
    pub fn http_status(&self) -> u16 {
        match self.code() {
            "content_blocked"
            | "lease_lost"
            | "invalid_transition"
            | "generation_mismatch"
            | "generation_incomplete"
            | "generation_state"
            | "generation_exists"
            | "token_revoked"
            | "owned_by_connector"
            | "owned_by_another"
            | "connector_state"
            | "verify_state"
            | "repair_refused"
            | "webhook_state" => 409,
            "connector_not_found"
            | "source_not_found"
            | "job_not_found"
            | "token_not_found"
            | "generation_not_found"
            | "verify_pass_not_found"
            | "drift_not_found"
            | "webhook_not_found"
            | "delivery_not_found" => 404,
            "ledger_unavailable" | "extractor_unavailable" => 503,
            "document_too_large" => 413,
            "deadline_exceeded" => 504,
            "internal_error" | "injected_fault" => 500,
            _ => 422,
        }
    }

    /// Whether repeating the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self.http_status(), 500 | 503)
    }

    /// The message to send to a client: internal details (driver messages, SQLite result
    /// codes, paths) stay in the log, and the client gets a stable sentence per code.
    pub fn public_message(&self) -> String {
        match self.code() {
            "ledger_unavailable" => "the ledger is unavailable (storage full, busy or \
                                     unreachable); retry shortly"
                .to_owned(),
            "internal_error" => "internal error in the ledger; see the server log".to_owned(),
            "extractor_unavailable" => "this server cannot read this document format right now \
                                        (its extractor is missing; see the server log); retry \
                                        later"
                .to_owned(),
            _ => self.to_string(),
        }
    }
}

impl LedgerError {
    /// A copy of this error for every caller that shared the failed write.
    pub(crate) fn replicate(&self) -> LedgerError {
        match self {
            LedgerError::Invalid { code, message } => LedgerError::Invalid {
                code,
                message: message.clone(),
            },
            LedgerError::ContentBlocked {
                dataset,
                sha256,
                reason,
            } => LedgerError::ContentBlocked {
                dataset: dataset.clone(),
                sha256: sha256.clone(),
                reason: reason.clone(),
            },
            LedgerError::SourceNotFound {
                dataset,
                source_key,
            } => LedgerError::SourceNotFound {
                dataset: dataset.clone(),
                source_key: source_key.clone(),
            },
            LedgerError::LeaseLost { job_id, reason } => LedgerError::LeaseLost {
                job_id: *job_id,
                reason: reason.clone(),
            },
            LedgerError::JobNotFound(id) => LedgerError::JobNotFound(*id),
            LedgerError::TokenNotFound(id) => LedgerError::TokenNotFound(*id),
            LedgerError::TokenRevoked(id) => LedgerError::TokenRevoked(*id),
            LedgerError::InvalidTransition {
                job_id,
                state,
                action,
            } => LedgerError::InvalidTransition {
                job_id: *job_id,
                state: state.clone(),
                action,
            },
            LedgerError::GenerationMismatch { active, requested } => {
                LedgerError::GenerationMismatch {
                    active: active.clone(),
                    requested: requested.clone(),
                }
            }
            LedgerError::GenerationNotFound(id) => LedgerError::GenerationNotFound(id.clone()),
            LedgerError::GenerationRefused { code, message } => LedgerError::GenerationRefused {
                code,
                message: message.clone(),
            },
            LedgerError::Injected(point) => LedgerError::Injected(*point),
            LedgerError::Unavailable(message) => LedgerError::Unavailable(message.clone()),
            LedgerError::DeadlineExceeded(message) => {
                LedgerError::DeadlineExceeded(message.clone())
            }
            LedgerError::Storage(error) if is_unavailable(error) => {
                LedgerError::Unavailable(error.to_string())
            }
            LedgerError::Storage(error) => LedgerError::Internal(error.to_string()),
            LedgerError::Internal(message) => LedgerError::Internal(message.clone()),
            LedgerError::Corrupt(message) => LedgerError::Corrupt(message.clone()),
        }
    }
}

fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(database) => {
            if let Some(postgres) = database.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                // Connection exceptions (08), insufficient resources (53), operator
                // intervention such as a shutdown (57P), and serialization or deadlock
                // failures (40001, 40P01): the same call may succeed later.
                let code = postgres.code();
                return code.starts_with("08")
                    || code.starts_with("53")
                    || code.starts_with("57P")
                    || code == "40001"
                    || code == "40P01";
            }
            // SQLITE_BUSY (5), SQLITE_LOCKED (6), SQLITE_IOERR (10), SQLITE_FULL (13),
            // SQLITE_CANTOPEN (14): primary result code in the low byte.
            let primary = database
                .code()
                .and_then(|code| code.parse::<i64>().ok())
                .map(|c| c & 0xff);
            matches!(primary, Some(5 | 6 | 10 | 13 | 14))
        }
        _ => false,
    }
}

/// The crate's result type.
pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction_codes_map_to_their_status_and_keep_the_machine_out_of_the_message() {
        let missing = LedgerError::invalid(
            "extractor_unavailable",
            "cannot start pdftotext (No such file or directory); install poppler-utils",
        );
        assert_eq!(missing.http_status(), 503);
        assert!(missing.is_retryable());
        assert!(!missing.public_message().contains("pdftotext"));
        let large = LedgerError::invalid("document_too_large", "too large");
        assert_eq!(large.http_status(), 413);
        assert!(!large.is_retryable());
        for code in [
            "encrypted",
            "no_text_layer",
            "unextractable",
            "extraction_limit",
        ] {
            let refused = LedgerError::invalid(code, "why");
            assert_eq!(refused.http_status(), 422, "{code}");
            assert_eq!(refused.public_message(), "why");
        }
    }
}
