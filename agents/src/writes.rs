//! Writes: `ingest` (text or Markdown, through the acceptance path the HTTP API uses) and
//! `delete_source` (a tombstone, only when `confirm` repeats the key). Erasure is not offered.

use receipts::{Acceptance, Change, Principal, Scope, Submission};
use rmcp::model::CallToolResult;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::envelope::{self, labelled, ToolError};
use crate::{text, Shared};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IngestArgs {
    dataset: String,
    source_key: String,
    content: String,
    media_type: Option<String>,
    tags: Option<Vec<String>>,
    readers: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteArgs {
    dataset: String,
    source_key: String,
    confirm: String,
    reason: String,
}

/// Submits one change and answers its receipt.
async fn submit(
    shared: &Shared,
    submission: Submission,
    note: &str,
) -> Result<CallToolResult, ToolError> {
    let mut results = shared.ledger.accept(vec![submission]).await;
    let receipt: Acceptance = results.pop().unwrap_or_else(|| {
        Err(receipts::LedgerError::Unavailable(
            "the ledger returned no result".to_owned(),
        ))
    })?;
    let mut fields = Map::new();
    fields.insert(
        "receipt".into(),
        json!({
            "accepted": receipt.accepted,
            "status": receipt.status,
            "dataset": text::line(&receipt.dataset, 128).text,
            "source_key": text::line(&receipt.source_key, 1024).text,
            "revision_id": receipt.source_revision_id.to_string(),
            "job_id": receipt.projection_job_id.to_string(),
            "byte_length": receipt.byte_length,
            "tombstone": receipt.tombstone,
            "previous_revision_id": receipt.previous_revision_id.map(|id| id.to_string()),
            "accepted_at": envelope::rfc3339(receipt.accepted_at),
        }),
    );
    fields.insert("note".into(), json!(note));
    Ok(envelope::success(labelled(fields)))
}

/// `ingest`.
pub(crate) async fn ingest(
    shared: &Shared,
    principal: &Principal,
    arguments: Option<Map<String, Value>>,
) -> Result<CallToolResult, ToolError> {
    let args: IngestArgs = crate::handler::arguments(arguments)?;
    let media_type = args.media_type.unwrap_or_else(|| "text/plain".to_owned());
    if !matches!(media_type.as_str(), "text/plain" | "text/markdown") {
        return Err(ToolError::arguments(
            "`media_type` must be `text/plain` or `text/markdown`; other formats go through \
             POST /v1/sources",
        ));
    }
    // The readers travel with the submission: recorded in the acceptance's transaction.
    let readers = match &args.readers {
        Some(readers) => Some(
            receipts::access::SourceAccess {
                readers: readers.clone(),
            }
            .checked()
            .map_err(receipts::http::ApiError::from)?,
        ),
        None => None,
    };
    let mut submission = acceptor::admit_text(
        principal,
        acceptor::TextDocument {
            dataset: args.dataset,
            source_key: args.source_key,
            content: args.content,
            media_type: Some(media_type),
            tags: args.tags,
        },
    )?;
    submission.readers = readers;
    tracing::info!(dataset = %submission.dataset, actor = %submission.actor, "mcp ingest");
    submit(
        shared,
        submission,
        "The bytes are durable. The document is not searchable until workers project it \
         (receipt status queued_not_confirmed); get_source shows its progress.",
    )
    .await
}

/// `delete_source`.
pub(crate) async fn delete_source(
    shared: &Shared,
    principal: &Principal,
    arguments: Option<Map<String, Value>>,
) -> Result<CallToolResult, ToolError> {
    let args: DeleteArgs = crate::handler::arguments(arguments)?;
    principal.require(Scope::Ingest)?;
    receipts::validate::dataset(&args.dataset).map_err(receipts::http::ApiError::from)?;
    receipts::validate::source_key(&args.source_key).map_err(receipts::http::ApiError::from)?;
    receipts::validate::reason(&args.reason).map_err(receipts::http::ApiError::from)?;
    principal.require_dataset(&args.dataset)?;
    if args.confirm != args.source_key {
        return Err(ToolError::new(
            "confirmation_mismatch",
            "`confirm` must repeat `source_key` exactly; show the user what will be deleted \
             and ask again",
        ));
    }
    let exists = shared
        .ledger
        .source(&args.dataset, &args.source_key)
        .await?
        .is_some();
    if !exists {
        return Err(ToolError::new(
            "not_found",
            "that source does not exist, or this token may not read it",
        ));
    }
    let submission = Submission {
        dataset: args.dataset,
        source_key: args.source_key,
        actor: principal.actor(),
        connector: None,
        validity: Default::default(),
        change: Change::Delete {
            reason: Some(args.reason),
        },
        readers: None,
    };
    tracing::info!(dataset = %submission.dataset, actor = %submission.actor, "mcp delete_source");
    submit(
        shared,
        submission,
        "The source is deleted: its tombstone is its current revision, and search no longer \
         returns it. Its earlier revisions stay in history.",
    )
    .await
}
