//! Reads: `read_document` (a revision's text in windows, with its sections and pages),
//! `get_source` (the head, its job and receipts), `list_datasets`, and the two resource
//! templates, which answer as `read_document` does at offset 0.
//!
//! A `search` token reads current revisions in its allowlist; a revision that is no longer
//! its source's head needs `ingest` or `ops:read`, as `GET /v1/revisions/{id}` does. A
//! revision outside the allowlist is answered as absent, so ids do not tell what exists.

use receipts::{Principal, Revision, Scope};
use rmcp::model::{CallToolResult, ReadResourceResult, ResourceContents};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::catalog::{DEFAULT_WINDOW_CHARS, MAX_WINDOW_CHARS};
use crate::envelope::{self, labelled, ToolError, MAX_ANSWER_CHARS};
use crate::{text, Shared};

/// The resource template of a revision.
pub(crate) const REVISION_TEMPLATE: &str = "cairn://revision/{revision_id}";
/// The resource template of a source's current revision (the key percent-encoded).
pub(crate) const SOURCE_TEMPLATE: &str = "cairn://source/{dataset}/{+source_key}";

/// Most sections or pages listed with one window.
const MAX_SPANS: usize = 50;

/// Which document.
enum Target {
    /// A revision, with the point in time it was found at (a search at `valid_at`/`as_of`).
    Revision(Uuid, Option<receipts::validity::At>),
    Head {
        dataset: String,
        source_key: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    revision_id: Option<String>,
    dataset: Option<String>,
    source_key: Option<String>,
    offset: Option<i64>,
    max_chars: Option<i64>,
    valid_at: Option<Value>,
    as_of: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceArgs {
    dataset: String,
    source_key: String,
}

fn not_found(what: &str) -> ToolError {
    ToolError::new(
        "not_found",
        format!("{what} does not exist, or this token may not read it"),
    )
}

/// A source named by dataset and key, checked like `/v1/sources` checks them.
fn source_names(dataset: &str, source_key: &str, principal: &Principal) -> Result<(), ToolError> {
    receipts::validate::dataset(dataset).map_err(receipts::http::ApiError::from)?;
    receipts::validate::source_key(source_key).map_err(receipts::http::ApiError::from)?;
    principal
        .require_dataset(dataset)
        .map_err(|_| not_found("that source"))
}

/// Answers a source the principal may not read ([`receipts::access`]) like one that does not
/// exist.
async fn may_read(
    shared: &Shared,
    principal: &Principal,
    dataset: &str,
    source_key: &str,
    what: &str,
) -> Result<(), ToolError> {
    let reads_as = principal.reads_as();
    if shared
        .ledger
        .may_read(reads_as.as_deref(), dataset, source_key)
        .await?
    {
        Ok(())
    } else {
        Err(not_found(what))
    }
}

/// `read_document`.
pub(crate) async fn read_document(
    shared: &Shared,
    principal: &Principal,
    arguments: Option<Map<String, Value>>,
) -> Result<CallToolResult, ToolError> {
    let args: ReadArgs = crate::handler::arguments(arguments)?;
    let at = point_in_time(args.valid_at.as_ref(), args.as_of.as_ref())?;
    let target = match (args.revision_id, args.dataset, args.source_key) {
        (Some(id), None, None) => Target::Revision(
            Uuid::parse_str(id.trim()).map_err(|_| {
                ToolError::arguments(
                    "`revision_id` is not a revision id (a UUID from a search hit)",
                )
            })?,
            at,
        ),
        (None, Some(dataset), Some(source_key)) => Target::Head {
            dataset,
            source_key,
        },
        _ => {
            return Err(ToolError::arguments(
                "give `revision_id`, or `dataset` and `source_key` (not both)",
            ))
        }
    };
    let offset = args.offset.unwrap_or(0);
    let offset = usize::try_from(offset)
        .map_err(|_| ToolError::arguments(format!("`offset` must be 0 or more (got {offset})")))?;
    let max_chars = args.max_chars.unwrap_or(DEFAULT_WINDOW_CHARS as i64);
    if !(1..=MAX_WINDOW_CHARS as i64).contains(&max_chars) {
        return Err(ToolError::arguments(format!(
            "`max_chars` must be between 1 and {MAX_WINDOW_CHARS} (got {max_chars}); read on \
             from `next_offset`"
        )));
    }
    let max_chars = usize::try_from(max_chars).unwrap_or(DEFAULT_WINDOW_CHARS);
    let answer = read(shared, principal, target, offset, max_chars).await?;
    Ok(envelope::success(answer))
}

/// The revision a target names, if the principal may read it.
async fn resolve(
    shared: &Shared,
    principal: &Principal,
    target: Target,
) -> Result<(Revision, bool), ToolError> {
    match target {
        Target::Revision(id, at) => {
            let detail = shared
                .ledger
                .revision(id)
                .await?
                .ok_or_else(|| not_found("that revision"))?;
            principal
                .require_dataset(&detail.revision.dataset)
                .map_err(|_| not_found("that revision"))?;
            may_read(
                shared,
                principal,
                &detail.revision.dataset,
                &detail.revision.source_key,
                "that revision",
            )
            .await?;
            // A revision a search at a point in time returned may be read at that point: it
            // held then, as the ledger believed then.
            let held_then = match at {
                Some(at) => shared
                    .ledger
                    .held_at(
                        &detail.revision.dataset,
                        &detail.revision.source_key,
                        at.valid_at,
                        at.as_of,
                    )
                    .await?
                    .is_some_and(|held| !held.tombstone && held.rectangle.revision_id == id),
                None => false,
            };
            if !detail.is_head
                && !held_then
                && !principal.has(Scope::Ingest)
                && !principal.has(Scope::OpsRead)
            {
                return Err(ToolError::new(
                    "revision_not_current",
                    "that revision is not its source's current revision; this token reads \
                     current revisions, and a past one at the `valid_at`/`as_of` its search \
                     found it at (others need the `ingest` or `ops:read` scope). Read the \
                     current one with `dataset` and `source_key`.",
                ));
            }
            Ok((detail.revision, detail.is_head))
        }
        Target::Head {
            dataset,
            source_key,
        } => {
            source_names(&dataset, &source_key, principal)?;
            may_read(shared, principal, &dataset, &source_key, "that source").await?;
            let view = shared
                .ledger
                .source(&dataset, &source_key)
                .await?
                .ok_or_else(|| not_found("that source"))?;
            Ok((view.head, true))
        }
    }
}

/// Character offsets of `bytes` (sorted byte offsets into `text`), in one pass.
fn char_offsets(text: &str, bytes: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut wanted = bytes.iter().peekable();
    for (chars, (byte, _)) in text.char_indices().enumerate() {
        while wanted.peek().is_some_and(|next| **next <= byte) {
            wanted.next();
            out.push(chars);
        }
    }
    let total = text.chars().count();
    out.extend(wanted.map(|_| total));
    out
}

async fn read(
    shared: &Shared,
    principal: &Principal,
    target: Target,
    offset: usize,
    max_chars: usize,
) -> Result<Value, ToolError> {
    let (revision, is_head) = resolve(shared, principal, target).await?;
    let Some(sha256) = revision.content_sha256.clone() else {
        return Err(ToolError::new(
            "source_deleted",
            "that revision deletes its source and has no text",
        ));
    };
    let bytes = shared.ledger.content(&sha256).await?.ok_or_else(|| {
        ToolError::from(receipts::LedgerError::Corrupt(format!(
            "content {sha256} missing"
        )))
    })?;
    let format = extract::Format::of(&revision.media_type);
    let extracted = tokio::task::spawn_blocking(move || {
        extract::Extracted::from_bytes(&bytes, format, &extract::Limits::default())
    })
    .await
    .map_err(|error| {
        ToolError::from(receipts::LedgerError::Internal(format!(
            "extraction task: {error}"
        )))
    })?
    .map_err(|error| {
        ToolError::new(
            "unreadable",
            format!("cairn cannot read this document's text ({})", error.code),
        )
    })?;
    let document = &extracted.text;
    // Every structural offset, with the window's, converted to characters in one pass.
    let section_bytes: Vec<usize> = extracted.sections.iter().map(|s| s.start).collect();
    let section_chars = char_offsets(document, &section_bytes);
    let page_chars = char_offsets(document, &extracted.pages);
    let total_chars = document.chars().count();
    if offset > total_chars {
        return Err(ToolError::arguments(format!(
            "`offset` {offset} is past the end of the document ({total_chars} characters)"
        )));
    }
    let mut window = max_chars;
    loop {
        let end = (offset + window).min(total_chars);
        let quoted: String = document.chars().skip(offset).take(end - offset).collect();
        let clean = text::block(&quoted, window);
        let spans = |starts: &[usize], label: &dyn Fn(usize) -> Value| {
            let mut spans = Vec::new();
            for (index, start) in starts.iter().enumerate() {
                let stop = starts.get(index + 1).copied().unwrap_or(total_chars);
                if *start < end && stop > offset && spans.len() < MAX_SPANS {
                    let mut span = Map::new();
                    if let Value::Object(fields) = label(index) {
                        span.extend(fields);
                    }
                    span.insert("start".into(), json!(start));
                    span.insert("end".into(), json!(stop));
                    spans.push(Value::Object(span));
                }
            }
            spans
        };
        let sections = spans(
            &section_chars,
            &|index| json!({"path": extracted.sections.get(index).map(|s| text::line(&s.path, 300).text)}),
        );
        let pages = spans(&page_chars, &|index| json!({"page": index + 1}));
        let mut fields = Map::new();
        fields.insert(
            "dataset".into(),
            json!(text::line(&revision.dataset, 128).text),
        );
        fields.insert(
            "source_key".into(),
            json!(text::line(&revision.source_key, 1024).text),
        );
        fields.insert("revision_id".into(), json!(revision.id.to_string()));
        fields.insert("is_head".into(), json!(is_head));
        fields.insert(
            "media_type".into(),
            json!(text::line(&revision.media_type, 255).text),
        );
        fields.insert(
            "accepted_at".into(),
            json!(envelope::rfc3339(revision.accepted_at)),
        );
        fields.insert(
            "accepted_by".into(),
            json!(text::line(&revision.actor, 200).text),
        );
        fields.insert("total_chars".into(), json!(total_chars));
        fields.insert("offset".into(), json!(offset));
        fields.insert(
            "next_offset".into(),
            json!((end < total_chars).then_some(end)),
        );
        fields.insert("truncated".into(), json!(end < total_chars));
        fields.insert("text".into(), json!(clean.text));
        fields.insert("sections".into(), Value::Array(sections));
        fields.insert("pages".into(), Value::Array(pages));
        let answer = labelled(fields);
        // Text that escapes heavily (quotes, newlines) can pass the bound at full width:
        // narrow the window until the answer fits.
        if envelope::chars(&answer) <= MAX_ANSWER_CHARS || window <= 100 {
            return Ok(answer);
        }
        window = window * 3 / 4;
    }
}

/// `get_source`.
pub(crate) async fn get_source(
    shared: &Shared,
    principal: &Principal,
    arguments: Option<Map<String, Value>>,
) -> Result<CallToolResult, ToolError> {
    let args: SourceArgs = crate::handler::arguments(arguments)?;
    source_names(&args.dataset, &args.source_key, principal)?;
    may_read(
        shared,
        principal,
        &args.dataset,
        &args.source_key,
        "that source",
    )
    .await?;
    let view = shared
        .ledger
        .source(&args.dataset, &args.source_key)
        .await?
        .ok_or_else(|| not_found("that source"))?;
    let detail = shared.ledger.revision(view.head.id).await?;
    let head = &view.head;
    let job = detail
        .as_ref()
        .and_then(|detail| detail.job.as_ref())
        .map(|job| {
            json!({
                "id": job.id.to_string(),
                "kind": job.kind.as_str(),
                "state": job.state.as_str(),
                "attempt": job.attempt,
                "max_attempts": job.max_attempts,
                "stage": job.stage,
            })
        });
    let receipts: Vec<Value> = detail
        .as_ref()
        .map(|detail| {
            detail
                .receipts
                .iter()
                .map(|receipt| {
                    json!({
                        "backend": receipt.backend.as_str(),
                        "state": receipt.state.as_str(),
                        "updated_at": envelope::rfc3339(receipt.updated_at),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let mut fields = Map::new();
    fields.insert("dataset".into(), json!(text::line(&view.dataset, 128).text));
    fields.insert(
        "source_key".into(),
        json!(text::line(&view.source_key, 1024).text),
    );
    fields.insert("deleted".into(), json!(view.deleted));
    fields.insert(
        "head".into(),
        json!({
            "revision_id": head.id.to_string(),
            "tombstone": head.tombstone,
            "media_type": text::line(&head.media_type, 255).text,
            "byte_length": head.byte_length,
            "accepted_at": envelope::rfc3339(head.accepted_at),
            "accepted_by": text::line(&head.actor, 200).text,
            "reason": head.reason.as_deref().map(|reason| text::line(reason, 500).text),
        }),
    );
    fields.insert("job".into(), job.unwrap_or(Value::Null));
    fields.insert("receipts".into(), Value::Array(receipts));
    Ok(envelope::success(labelled(fields)))
}

/// Most datasets one `list_datasets` answer names.
const MAX_DATASETS: usize = 200;

/// `list_datasets`.
pub(crate) async fn list_datasets(
    shared: &Shared,
    principal: &Principal,
) -> Result<CallToolResult, ToolError> {
    let summaries = shared.ledger.datasets().await?;
    let mut listed: Vec<Value> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for summary in &summaries {
        if principal.require_dataset(&summary.dataset).is_err() {
            continue;
        }
        seen.insert(summary.dataset.as_str());
        listed.push(json!({
            "dataset": text::line(&summary.dataset, 128).text,
            "sources": summary.sources - summary.deleted_sources,
            "deleted_sources": summary.deleted_sources,
            "last_accepted_at": envelope::rfc3339(summary.last_accepted_at),
        }));
    }
    // Datasets the allowlist names that hold nothing yet: listed, with nothing in them.
    for dataset in principal.datasets.iter().flatten() {
        if !seen.contains(dataset.as_str()) {
            listed.push(json!({
                "dataset": text::line(dataset, 128).text,
                "sources": 0,
                "deleted_sources": 0,
                "last_accepted_at": null,
            }));
        }
    }
    let omitted = listed.len().saturating_sub(MAX_DATASETS);
    listed.truncate(MAX_DATASETS);
    let mut fields = Map::new();
    fields.insert("allowlist".into(), json!(principal.datasets));
    fields.insert("datasets".into(), Value::Array(listed));
    fields.insert("omitted".into(), json!(omitted));
    Ok(envelope::success(labelled(fields)))
}

/// `%XX` escapes decoded; `None` when one is malformed or the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The dataset and source key a `cairn://source/{dataset}/{+source_key}` URI names.
pub(crate) fn source_of(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix("cairn://source/")?;
    let (dataset, key) = rest.split_once('/')?;
    Some((percent_decode(dataset)?, percent_decode(key)?))
}

/// `resources/read` of `cairn://revision/{id}` or `cairn://source/{dataset}/{+source_key}`.
pub(crate) async fn read_resource(
    shared: &Shared,
    principal: &Principal,
    uri: &str,
) -> Result<ReadResourceResult, ToolError> {
    let unknown = || {
        ToolError::new(
            "resource_not_found",
            "cairn serves cairn://revision/{revision_id} and \
             cairn://source/{dataset}/{source_key} only",
        )
    };
    let target = if let Some(id) = uri.strip_prefix("cairn://revision/") {
        Target::Revision(Uuid::parse_str(id).map_err(|_| unknown())?, None)
    } else if uri.starts_with("cairn://source/") {
        let (dataset, source_key) = source_of(uri).ok_or_else(unknown)?;
        Target::Head {
            dataset,
            source_key,
        }
    } else {
        return Err(unknown());
    };
    let answer = read(shared, principal, target, 0, DEFAULT_WINDOW_CHARS).await?;
    let text = serde_json::to_string(&answer).unwrap_or_default();
    Ok(ReadResourceResult::new(vec![
        ResourceContents::TextResourceContents {
            uri: uri.to_owned(),
            mime_type: Some("application/json".to_owned()),
            text,
            meta: None,
        },
    ]))
}

/// The point in time a read names (`valid_at`, `as_of`, as search takes them), if any.
fn point_in_time(
    valid_at: Option<&Value>,
    as_of: Option<&Value>,
) -> Result<Option<receipts::validity::At>, ToolError> {
    let now = receipts::Clock::now_micros(&receipts::SystemClock);
    receipts::validity::point_in_time(valid_at, as_of, now)
        .map_err(|error| ToolError::arguments(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_offsets_become_character_offsets() {
        let text = "aé中b";
        assert_eq!(
            char_offsets(text, &[0, 1, 3, 6, 7, 99]),
            vec![0, 1, 2, 3, 4, 4]
        );
        assert_eq!(char_offsets("", &[0]), vec![0]);
    }

    #[test]
    fn percent_escapes_decode() {
        assert_eq!(percent_decode("a%2Fb%20c").as_deref(), Some("a/b c"));
        assert_eq!(percent_decode("plain/key").as_deref(), Some("plain/key"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("%ff"), None);
    }
}
