//! Acceptance from the caller's side: submissions are validated and hashed off the writer task
//! ([`prepare`]), then handed to the writer, which answers once they are committed.

use super::*;

pub(super) fn prepare(submission: Submission) -> Result<Prepared> {
    validate::dataset(&submission.dataset)?;
    validate::source_key(&submission.source_key)?;
    let change = match submission.change {
        Change::Put(document) => {
            validate::content(&document.bytes)?;
            validate::media_type(&document.media_type)?;
            validate::tags(&document.tags)?;
            validate::metadata(&document.metadata)?;
            let sha256 = ids::sha256_hex(&document.bytes);
            let revision_id = ids::revision_id(
                &submission.dataset,
                &submission.source_key,
                &sha256,
                &document,
            );
            let passages = match std::str::from_utf8(&document.bytes) {
                Ok(text) => passages::split(text),
                Err(_) => Vec::new(),
            };
            PreparedChange::Put {
                document,
                sha256,
                revision_id,
                passages,
            }
        }
        Change::Delete { reason } => PreparedChange::Delete { reason },
    };
    Ok(Prepared {
        dataset: submission.dataset,
        source_key: submission.source_key,
        actor: submission.actor,
        change,
    })
}

#[async_trait]
impl Acceptor for SqliteLedger {
    async fn accept(&self, submissions: Vec<Submission>) -> Vec<Result<Acceptance>> {
        let count = submissions.len();
        let mut results: Vec<Option<Result<Acceptance>>> = Vec::with_capacity(count);
        let mut prepared = Vec::with_capacity(count);
        let mut slots = Vec::with_capacity(count);
        for submission in submissions {
            match prepare(submission) {
                Ok(item) => {
                    slots.push(results.len());
                    results.push(None);
                    prepared.push(item);
                }
                Err(error) => results.push(Some(Err(error))),
            }
        }
        if !prepared.is_empty() {
            let written = match self.submit(|reply| WriteOp::Accept(prepared, reply)).await {
                Ok(written) => written,
                Err(error) => {
                    let message = error.to_string();
                    slots
                        .iter()
                        .map(|_| Err(LedgerError::Unavailable(message.clone())))
                        .collect()
                }
            };
            for (slot, result) in slots.into_iter().zip(written) {
                results[slot] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| Err(LedgerError::Unavailable("no answer".to_owned())))
            })
            .collect()
    }

    async fn block_content(&self, block: ContentBlock) -> Result<()> {
        validate::dataset(&block.dataset)?;
        validate::sha256_hex(&block.sha256)?;
        validate::reason(&block.reason)?;
        self.submit(|reply| WriteOp::Block(block, reply)).await?
    }
}
