//! `search`: the arguments checked as `/v1/search` checks a body (scope, allowlist, budget,
//! mode), the search run by the same [`search::Searcher`] under one budget, and its hits
//! quoted inside the envelope, within the answer's bounds.

use std::collections::HashMap;

use receipts::Principal;
use rmcp::model::CallToolResult;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::catalog::MAX_QUERY_CHARS;
use crate::envelope::{self, labelled, ToolError, MAX_ANSWER_CHARS};
use crate::{text, Shared};

/// Hits when none are asked for.
pub(crate) const DEFAULT_TOP_K: usize = 3;
/// Most hits one call returns.
pub(crate) const MAX_TOP_K: usize = 10;
/// Snippet length when none is asked for, in characters.
pub(crate) const DEFAULT_SNIPPET_CHARS: usize = 500;
/// Longest snippet, in characters.
pub(crate) const MAX_SNIPPET_CHARS: usize = 1000;
/// Values listed per facet in an answer.
const MCP_FACET_VALUES: i64 = 10;
/// Characters of snippet text in one answer, all hits together.
pub(crate) const SNIPPET_BUDGET_CHARS: usize = 6000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    datasets: Option<Vec<String>>,
    top_k: Option<i64>,
    mode: Option<String>,
    budget_ms: Option<i64>,
    snippet_chars: Option<i64>,
    valid_at: Option<Value>,
    as_of: Option<Value>,
    filter: Option<Value>,
    facets: Option<Vec<String>>,
}

/// Runs `search`: the answer, the datasets it searched and its hit count (for the log).
pub(crate) async fn search(
    shared: &Shared,
    principal: &Principal,
    arguments: Option<Map<String, Value>>,
    cancelled: &CancellationToken,
) -> Result<(CallToolResult, Vec<String>, usize), ToolError> {
    let args: SearchArgs = crate::handler::arguments(arguments)?;
    let chars = args.query.trim().chars().count();
    if chars == 0 || chars > MAX_QUERY_CHARS {
        return Err(ToolError::arguments(format!(
            "`query` must have 1 to {MAX_QUERY_CHARS} characters (got {chars}); search for a \
             few words, not a whole document"
        )));
    }
    let top_k = args.top_k.unwrap_or(DEFAULT_TOP_K as i64);
    if !(1..=MAX_TOP_K as i64).contains(&top_k) {
        return Err(ToolError::arguments(format!(
            "`top_k` must be between 1 and {MAX_TOP_K} (got {top_k}); to see more of a hit, \
             call read_document with its revision_id"
        )));
    }
    let snippet_chars = args.snippet_chars.unwrap_or(DEFAULT_SNIPPET_CHARS as i64);
    if !(50..=MAX_SNIPPET_CHARS as i64).contains(&snippet_chars) {
        return Err(ToolError::arguments(format!(
            "`snippet_chars` must be between 50 and {MAX_SNIPPET_CHARS} (got {snippet_chars}); \
             call read_document for longer text"
        )));
    }
    let snippet_chars = usize::try_from(snippet_chars).unwrap_or(DEFAULT_SNIPPET_CHARS);
    principal.require(receipts::Scope::Search)?;
    let body = search::api::SearchBody {
        query: args.query,
        datasets: args.datasets,
        top_k: Some(top_k),
        budget_ms: args.budget_ms,
        mode: args.mode,
        group_by_source: Some(true),
        expand: None,
        valid_at: args.valid_at,
        as_of: args.as_of,
        filter: args.filter,
        facet_values: args.facets.as_ref().map(|_| MCP_FACET_VALUES),
        facets: args.facets,
    };
    let query = search::api::parse(body, principal, &shared.searcher).map_err(|error| {
        let mut error = ToolError::from(error);
        if error.code == "invalid_budget" {
            error
                .message
                .push_str("; omit `budget_ms` for the server's default");
        }
        error
    })?;
    let named = query.datasets.clone();
    let asked = query.mode;
    let started = std::time::Instant::now();
    let searching = shared.searcher.search(query);
    let summaries = shared.recent_datasets();
    // A cancelled call (`notifications/cancelled`, or the client hung up) drops the search,
    // and with it its admission slot.
    let (outcome, summaries) = tokio::select! {
        biased;
        () = cancelled.cancelled() => {
            return Err(ToolError::new("cancelled", "the client cancelled the search"));
        }
        both = async { tokio::join!(searching, summaries) } => both,
    };
    search::api::record_metrics(asked, &outcome, started.elapsed());
    let response = outcome.map_err(|error| {
        let overloaded = matches!(error, search::SearchError::Overloaded { .. });
        let mut error = ToolError::from(receipts::http::ApiError::from(error));
        if overloaded {
            error.message = "cairn is running as many searches as it admits; retry after \
                             the given delay, or use mode `lexical`"
                .to_owned();
            error.retry_after_ms = Some(1000);
        }
        error
    })?;
    // The datasets searched, by name: those asked for, or every dataset the token may read.
    let summaries = summaries.unwrap_or_default();
    let summaries = summaries.as_slice();
    let counts: HashMap<&str, i64> = summaries
        .iter()
        .map(|summary| {
            (
                summary.dataset.as_str(),
                summary.sources - summary.deleted_sources,
            )
        })
        .collect();
    let searched: Vec<String> = if named.is_empty() {
        summaries
            .iter()
            .map(|summary| summary.dataset.clone())
            .collect()
    } else {
        named
    };
    let generation = response.generation.clone();
    let mut snippet_left = SNIPPET_BUDGET_CHARS;
    let mut hits: Vec<Value> = response
        .results
        .iter()
        .map(|result| {
            let limit = snippet_chars.min(snippet_left);
            let snippet = text::line(&result.text, limit);
            snippet_left -= snippet.text.chars().count().min(snippet_left);
            json!({
                "rank": result.rank,
                "dataset": text::line(&result.dataset, 128).text,
                "source_key": text::line(&result.source_key, 1024).text,
                "revision_id": result.source_revision_id.to_string(),
                "generation": generation,
                "section": result.section.as_deref().map(|section| text::line(section, 300).text),
                "page": result.page,
                "chunk_index": result.chunk_index,
                "passage_index": result.passage_index,
                "receipt_state": result.projection_state,
                "accepted_at": envelope::rfc3339(result.accepted_at),
                "accepted_by": text::line(&result.accepted_by, 200).text,
                "score": result.score,
                "score_kind": result.score_kind,
                "text": snippet.text,
                "truncated": snippet.truncated,
                "chars": snippet.chars,
            })
        })
        .collect();
    let count = hits.len();
    let note = if hits.is_empty() {
        let empty: Vec<&str> = searched
            .iter()
            .filter(|dataset| counts.get(dataset.as_str()).copied().unwrap_or(0) == 0)
            .map(String::as_str)
            .collect();
        if searched.is_empty() {
            Some("no dataset this token may read holds any source".to_owned())
        } else if !empty.is_empty() {
            Some(format!(
                "no current document matched; these datasets hold no current sources: {} \
                 (list_datasets shows what exists)",
                text::line(&empty.join(", "), 500).text
            ))
        } else {
            Some("no current document matched; try other words, or mode `lexical`".to_owned())
        }
    } else {
        None
    };
    // Counted values, each a line of bounded length: data, like the hits.
    let facets: Value = response
        .facets
        .iter()
        .map(|counts| {
            let values: Vec<Value> = counts
                .values
                .iter()
                .map(|count| {
                    let value = match &count.value {
                        receipts::filter::facets::FacetValue::Text(text) => {
                            json!(text::line(text, 200).text)
                        }
                        other => json!(other),
                    };
                    json!({"value": value, "count": count.count})
                })
                .collect();
            json!({
                "field": counts.field,
                "sources": counts.sources,
                "missing": counts.missing,
                "truncated": counts.truncated,
                "values": values,
            })
        })
        .collect();
    let mut omitted = 0usize;
    let answer = loop {
        let mut fields = Map::new();
        fields.insert(
            "datasets".into(),
            json!(searched
                .iter()
                .map(|dataset| text::line(dataset, 128).text)
                .collect::<Vec<_>>()),
        );
        fields.insert("generation".into(), json!(generation));
        fields.insert("mode".into(), json!(response.mode.as_str()));
        fields.insert("degraded".into(), json!(response.degraded));
        fields.insert("degradations".into(), json!(response.degradations));
        // A search at a point in time says which point, and whether its history is partial.
        if let Some(partial) = response.history_partial {
            fields.insert("valid_at".into(), json!(response.valid_at));
            fields.insert("as_of".into(), json!(response.as_of));
            fields.insert("history_partial".into(), json!(partial));
            fields.insert("history_gaps".into(), json!(response.history_gaps));
        }
        if !response.facets.is_empty() {
            fields.insert("facets".into(), facets.clone());
        }
        if !response.facets_partial.is_empty() {
            fields.insert("facets_partial".into(), json!(response.facets_partial));
        }
        fields.insert("hits".into(), Value::Array(hits.clone()));
        fields.insert("omitted".into(), json!(omitted));
        if let Some(note) = &note {
            fields.insert("note".into(), json!(note));
        }
        fields.insert("took_ms".into(), json!(response.took_ms));
        fields.insert("budget_ms".into(), json!(response.budget_ms));
        let answer = labelled(fields);
        if envelope::chars(&answer) <= MAX_ANSWER_CHARS || hits.is_empty() {
            break answer;
        }
        hits.pop();
        omitted += 1;
    };
    Ok((envelope::success(answer), searched, count - omitted))
}
