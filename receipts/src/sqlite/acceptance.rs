//! Acceptance from the caller's side: submissions are validated and hashed off the writer task
//! ([`crate::acceptance::prepare`]), then handed to the writer, which answers once they are
//! committed.

use super::*;

#[async_trait]
impl Acceptor for SqliteLedger {
    async fn accept(&self, submissions: Vec<Submission>) -> Vec<Result<Acceptance>> {
        crate::acceptance::accept_with(submissions, |prepared| {
            self.submit(|reply| WriteOp::Accept(prepared, reply))
        })
        .await
    }

    async fn block_content(&self, block: ContentBlock) -> Result<()> {
        validate::dataset(&block.dataset)?;
        validate::sha256_hex(&block.sha256)?;
        validate::reason(&block.reason)?;
        self.submit(|reply| WriteOp::Block(block, reply)).await?
    }

    async fn erase(&self, request: ErasureRequest) -> Result<Acceptance> {
        erasure::check(&request)?;
        self.submit(|reply| WriteOp::Erase(request, reply)).await?
    }
}
