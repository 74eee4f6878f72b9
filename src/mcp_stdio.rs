//! `cairn mcp`: the MCP server for local hosts, over stdio. It is a bridge, not a second
//! server: each JSON-RPC line from the host is posted to a running cairn's `/mcp` with the
//! token from `CAIRN_TOKEN`, and the answers are written back as lines. So the stdio server
//! and the HTTP one are the same handler, with the same checks, bounds and labels.
//!
//! ## Model
//! - Requests run concurrently (at most [`MAX_IN_FLIGHT`]); answers are written whole, one
//!   per line, in the order they finish.
//! - `notifications/cancelled` aborts the request it names: its HTTP exchange is dropped, and
//!   the server drops the call and frees what it held (a search's admission slot).
//! - The protocol version comes from each request's `_meta` (2026-07-28) or from the
//!   `initialize` answer (legacy), and travels as `MCP-Protocol-Version` with the method and
//!   name headers the current protocol requires.
//!
//! ## Invariants
//! - An admin token is refused at start unless `--allow-admin` is given: an agent needs
//!   `search`, and `ingest` to store.
//! - A line longer than [`MAX_LINE_BYTES`] or one that is not JSON gets a JSON-RPC parse
//!   error; nothing the host sends ends the bridge but the end of its input.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

/// Longest line read from the host (a message), in bytes.
pub const MAX_LINE_BYTES: usize = 4 << 20;
/// Requests forwarded at once.
pub const MAX_IN_FLIGHT: usize = 16;

/// How the bridge reaches cairn.
#[derive(Debug, Clone)]
pub struct Bridge {
    /// Base URL of the cairn server.
    pub server: String,
    /// The bearer token.
    pub token: String,
    /// Whether an admin token is accepted.
    pub allow_admin: bool,
}

/// The state shared by the forwarding tasks.
struct Shared {
    client: reqwest::Client,
    endpoint: String,
    token: String,
    /// The version agreed by a legacy `initialize`.
    negotiated: Mutex<Option<String>>,
}

/// A JSON-RPC error answer.
fn error_answer(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// The value of an `Mcp-Name` header: as it is when it is plain printable ASCII, else in the
/// protocol's base64 wrapper.
fn header_text(value: &str) -> String {
    let printable = value.chars().all(|c| (' '..='~').contains(&c));
    let padded = value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']);
    let wrapped = value.starts_with("=?base64?") && value.ends_with("?=");
    if !value.is_empty() && printable && !padded && !wrapped {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    }
}

/// The headers a message travels with: the protocol version, and the method and name.
fn headers_for(message: &Value, negotiated: Option<&str>) -> Vec<(&'static str, String)> {
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let params = message.get("params");
    let version = if method == "initialize" {
        params
            .and_then(|params| params.get("protocolVersion"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    } else {
        params
            .and_then(|params| params.get("_meta"))
            .and_then(|meta| meta.get("io.modelcontextprotocol/protocolVersion"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| negotiated.map(str::to_owned))
    };
    let mut headers = vec![
        ("Content-Type", "application/json".to_owned()),
        ("Accept", "application/json, text/event-stream".to_owned()),
    ];
    if let Some(version) = version {
        headers.push(("MCP-Protocol-Version", version));
    }
    if !method.is_empty() {
        headers.push(("Mcp-Method", header_text(method)));
    }
    let name = match method {
        "tools/call" | "prompts/get" => params.and_then(|p| p.get("name")),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
            params.and_then(|p| p.get("uri"))
        }
        _ => None,
    };
    if let Some(name) = name.and_then(Value::as_str) {
        headers.push(("Mcp-Name", header_text(name)));
    }
    headers
}

/// The messages in an answer body (JSON, one message or a batch, or an event stream), each
/// as the server wrote it and as parsed: the text is passed on untouched (a number parsed and
/// written again could change in its last digit).
fn messages_of(content_type: &str, body: &str) -> Vec<(String, Value)> {
    let parsed = |text: &str| {
        let text = text.trim();
        serde_json::from_str::<Value>(text)
            .ok()
            .map(|value| (text.to_owned(), value))
    };
    if content_type.starts_with("text/event-stream") {
        return body
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(parsed)
            .collect();
    }
    match parsed(body) {
        Some((_, Value::Array(items))) => items
            .into_iter()
            .map(|item| (item.to_string(), item))
            .collect(),
        Some((_, Value::Null)) | None => Vec::new(),
        Some(message) => vec![message],
    }
}

/// Posts one message to `/mcp`; the messages to write back.
async fn forward(shared: &Shared, message: Value) -> Vec<String> {
    let id = message.get("id").cloned();
    let negotiated = shared
        .negotiated
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    let mut request = shared
        .client
        .post(&shared.endpoint)
        .bearer_auth(&shared.token)
        .body(message.to_string());
    for (name, value) in headers_for(&message, negotiated.as_deref()) {
        request = request.header(name, value);
    }
    let fail = |code: i64, text: String| match &id {
        Some(id) => vec![error_answer(id.clone(), code, text).to_string()],
        None => {
            eprintln!("cairn mcp: a notification was not delivered: {text}");
            Vec::new()
        }
    };
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => {
            return fail(
                -32000,
                format!("cairn is unreachable at {}: {error}", shared.endpoint),
            )
        }
    };
    let status = response.status();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = match response.text().await {
        Ok(body) => body,
        Err(error) => return fail(-32000, format!("cairn's answer was cut off: {error}")),
    };
    let messages = messages_of(&content_type, &body);
    let answered = messages.iter().any(|(_, m)| m.get("jsonrpc").is_some());
    if !status.is_success() && !answered {
        // cairn's own errors are `{code, message}` JSON; say which.
        let detail = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|value| {
                Some(format!(
                    "{}: {}",
                    value.get("code")?.as_str()?,
                    value.get("message")?.as_str()?
                ))
            })
            .unwrap_or_else(|| body.chars().take(200).collect());
        return fail(-32001, format!("cairn answered {status}: {detail}"));
    }
    if message.get("method").and_then(Value::as_str) == Some("initialize") {
        let version = messages.iter().find_map(|(_, m)| {
            m.pointer("/result/protocolVersion")?
                .as_str()
                .map(str::to_owned)
        });
        if let Some(version) = version {
            *shared
                .negotiated
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(version);
        }
    }
    messages.into_iter().map(|(text, _)| text).collect()
}

/// Checks the token, then bridges stdin and stdout to `/mcp` until stdin ends.
pub async fn run(bridge: Bridge) -> anyhow::Result<()> {
    let base = bridge.server.trim_end_matches('/').to_owned();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .context("building the HTTP client")?;
    let me = client
        .get(format!("{base}/v1/tokens/self"))
        .bearer_auth(&bridge.token)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .with_context(|| format!("cairn is unreachable at {base}"))?;
    match me.status().as_u16() {
        200 => {}
        401 => {
            anyhow::bail!("CAIRN_TOKEN is not a valid cairn token (unknown, revoked or expired)")
        }
        status => anyhow::bail!("{base}/v1/tokens/self answered {status}"),
    }
    let principal: receipts::Principal = me.json().await.context("reading the token's scopes")?;
    if principal.scopes.contains(&receipts::Scope::Admin) && !bridge.allow_admin {
        anyhow::bail!(
            "refusing the admin token `{}`: an agent needs only `search` (and `ingest` to \
             store documents). Create one with `cairn token create --name agent --scope \
             search`, or pass --allow-admin",
            principal.name
        );
    }
    let scopes: Vec<&str> = principal
        .scopes
        .iter()
        .map(|scope| scope.as_str())
        .collect();
    eprintln!(
        "cairn mcp: serving stdio through {base}/mcp as token:{} (scopes: {})",
        principal.name,
        scopes.join(", ")
    );
    let shared = Arc::new(Shared {
        client,
        endpoint: format!("{base}/mcp"),
        token: bridge.token,
        negotiated: Mutex::new(None),
    });
    let (out, mut answers) = tokio::sync::mpsc::channel::<String>(64);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(answer) = answers.recv().await {
            let mut line = answer;
            line.push('\n');
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let running: Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    let mut lines = FramedRead::new(
        tokio::io::stdin(),
        LinesCodec::new_with_max_length(MAX_LINE_BYTES),
    );
    while let Some(line) = lines.next().await {
        let line = match line {
            Ok(line) => line,
            Err(LinesCodecError::MaxLineLengthExceeded) => {
                let _ = out
                    .send(
                        error_answer(
                            Value::Null,
                            -32700,
                            format!("a message is over {MAX_LINE_BYTES} bytes"),
                        )
                        .to_string(),
                    )
                    .await;
                continue;
            }
            Err(LinesCodecError::Io(error)) => {
                eprintln!("cairn mcp: stdin failed: {error}");
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let message: Value = match serde_json::from_str(&line) {
            Ok(message) => message,
            Err(error) => {
                let answer = error_answer(Value::Null, -32700, format!("not JSON: {error}"));
                let _ = out.send(answer.to_string()).await;
                continue;
            }
        };
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let id = message.get("id").cloned();
        match (method.as_deref(), id) {
            (Some("notifications/cancelled"), None) => {
                let target = message
                    .pointer("/params/requestId")
                    .map(Value::to_string)
                    .unwrap_or_default();
                let handle = running
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .remove(&target);
                if let Some(handle) = handle {
                    handle.abort();
                }
            }
            (Some(_), id) => {
                let permit = slots.clone().acquire_owned().await?;
                let (shared, out, finished) = (shared.clone(), out.clone(), running.clone());
                let key = id.as_ref().map(Value::to_string);
                let task_key = key.clone();
                let handle = tasks.spawn(async move {
                    let _permit = permit;
                    for answer in forward(&shared, message).await {
                        if out.send(answer).await.is_err() {
                            break;
                        }
                    }
                    if let Some(key) = task_key {
                        finished
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .remove(&key);
                    }
                });
                if let Some(key) = key {
                    running
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .insert(key, handle);
                }
            }
            // An answer to a server request: a stateless server sends none.
            (None, _) => {}
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    drop(out);
    let _ = writer.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_follow_the_message() {
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "search", "arguments": {},
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        let headers = headers_for(&call, None);
        assert!(headers.contains(&("MCP-Protocol-Version", "2026-07-28".to_owned())));
        assert!(headers.contains(&("Mcp-Method", "tools/call".to_owned())));
        assert!(headers.contains(&("Mcp-Name", "search".to_owned())));
        let legacy = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        assert!(headers_for(&legacy, Some("2025-06-18"))
            .contains(&("MCP-Protocol-Version", "2025-06-18".to_owned())));
        let read = json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read",
            "params": {"uri": "cairn://source/docs/ä"}});
        assert!(headers_for(&read, None)
            .iter()
            .any(|(name, value)| *name == "Mcp-Name" && value.starts_with("=?base64?")));
    }

    #[test]
    fn answers_are_read_from_json_and_event_streams() {
        let score = r#"{"id":1,"score":0.016393442622950817}"#;
        assert_eq!(
            messages_of("application/json", score),
            vec![(
                score.to_owned(),
                json!({"id": 1, "score": 0.016393442622950817})
            )],
            "the text passes untouched"
        );
        assert_eq!(
            messages_of("text/event-stream", "event: message\ndata: {\"id\":2}\n\n"),
            vec![("{\"id\":2}".to_owned(), json!({"id": 2}))]
        );
        assert!(messages_of("application/json", "").is_empty());
    }
}
