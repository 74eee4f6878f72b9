//! Acceptance from the caller's side: submissions are validated and hashed off the writer task
//! ([`crate::acceptance::prepare`]), then handed to the writer, which answers once they are
//! committed.

use super::ledger::SqliteLedger;
use super::writer::WriteOp;
use crate::error::Result;
use crate::ledger::Acceptor;
use crate::model::Acceptance;
use crate::model::ContentBlock;
use crate::model::ErasureRequest;
use crate::model::Submission;
use crate::validate;
use async_trait::async_trait;

#[async_trait]
impl Acceptor for SqliteLedger {
    async fn accept(&self, submissions: Vec<Submission>) -> Vec<Result<Acceptance>> {
        crate::acceptance::accept_with(submissions, |prepared| {
            self.submit(|reply| WriteOp::Accept(prepared, reply))
        })
        .await
    }

    async fn block_content(&self, block: ContentBlock) -> Result<()> {
        validate::content_block(&block)?;
        self.submit(|reply| WriteOp::Block(block, reply)).await?
    }

    async fn erase(&self, request: ErasureRequest) -> Result<Acceptance> {
        validate::erasure_request(&request)?;
        // Journalled before it is committed: a restore from an older backup makes it again.
        crate::journal::record(
            self.options.journal.as_deref(),
            Some(crate::journal::JournalEntry::erasure(
                &request,
                self.clock.now_micros(),
            )),
        )?;
        self.submit(|reply| WriteOp::Erase(request, reply)).await?
    }

    async fn change_access(&self, change: crate::access::AccessChange) -> Result<()> {
        let started = std::time::Instant::now();
        let observed = change.clone();
        let result = async {
            // Journalled before it is committed: a restore from an older backup makes it
            // again, so a revoked reader stays revoked.
            if let Some(writer) = &self.journal_writer {
                writer
                    .append(crate::journal::JournalEntry::access(
                        &change,
                        self.clock.now_micros(),
                    ))
                    .await?;
            }
            self.submit(|reply| WriteOp::Access(change, reply)).await?
        }
        .await;
        crate::access::observe(&observed, started, result.is_ok());
        result
    }
}
