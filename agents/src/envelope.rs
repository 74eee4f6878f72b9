//! The shape every answer shares: the untrusted label first, tool errors the model can act
//! on, the bound on an answer's size, and times as RFC 3339.

use receipts::http::ApiError;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Map, Value};

use crate::text::UNTRUSTED_NOTICE;

/// No answer is longer than this many characters of JSON, whatever the arguments.
pub const MAX_ANSWER_CHARS: usize = 20_000;

/// An answer's fields after the label: `trust` and `notice` come first, then `fields` in
/// their order.
pub(crate) fn labelled(fields: Map<String, Value>) -> Value {
    let mut answer = Map::with_capacity(fields.len() + 2);
    answer.insert("trust".into(), json!("untrusted"));
    answer.insert("notice".into(), json!(UNTRUSTED_NOTICE));
    answer.extend(fields);
    Value::Object(answer)
}

/// The characters of `answer` as JSON.
pub(crate) fn chars(answer: &Value) -> usize {
    serde_json::to_string(answer).map_or(usize::MAX, |text| text.chars().count())
}

/// A successful tool answer: the structured JSON, and the same JSON as the text block for
/// hosts that read only that.
pub(crate) fn success(answer: Value) -> CallToolResult {
    let text = serde_json::to_string(&answer).unwrap_or_default();
    let mut result = CallToolResult::structured(answer);
    result.content = vec![ContentBlock::text(text)];
    result
}

/// Why a tool call has no answer: a stable code, a message that names the fix, and when a
/// retry may succeed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolError {
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) retry_after_ms: Option<u64>,
}

impl ToolError {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> ToolError {
        ToolError {
            code: code.to_owned(),
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// Arguments that do not validate.
    pub(crate) fn arguments(message: impl Into<String>) -> ToolError {
        ToolError::new("invalid_arguments", message)
    }

    /// The error as the tool's answer (`isError`), labelled like every answer.
    pub(crate) fn into_result(self) -> CallToolResult {
        let mut error = Map::new();
        error.insert("code".into(), json!(self.code));
        error.insert("message".into(), json!(self.message));
        if let Some(ms) = self.retry_after_ms {
            error.insert("retry_after_ms".into(), json!(ms));
        }
        let mut fields = Map::new();
        fields.insert("error".into(), Value::Object(error));
        let answer = labelled(fields);
        let text = serde_json::to_string(&answer).unwrap_or_default();
        let mut result = CallToolResult::structured_error(answer);
        result.content = vec![ContentBlock::text(text)];
        result
    }
}

impl From<ApiError> for ToolError {
    fn from(error: ApiError) -> Self {
        // 503 (unavailable) and 504 (a search's budget ran out) say what to do; any other
        // server error is a fault whose detail stays in the log.
        let actionable = matches!(error.status.as_u16(), 503 | 504);
        if error.status.is_server_error() && !actionable {
            // Internal: logged here, never sent.
            tracing::error!(code = %error.code, message = %error.message, "mcp tool failed");
            return ToolError::new(
                "internal_error",
                "cairn failed to answer; the cause is in its log. Retrying may not help.",
            );
        }
        let retry_after_ms = error
            .retry_after
            .map(|seconds| seconds.saturating_mul(1000));
        ToolError {
            code: error.code,
            message: crate::text::line(&error.message, 500).text,
            retry_after_ms: retry_after_ms.or((error.status.as_u16() == 503).then_some(1000)),
        }
    }
}

impl From<receipts::LedgerError> for ToolError {
    fn from(error: receipts::LedgerError) -> Self {
        ApiError::from(error).into()
    }
}

impl From<receipts::auth::Denied> for ToolError {
    fn from(error: receipts::auth::Denied) -> Self {
        ApiError::from(error).into()
    }
}

/// Microseconds since the Unix epoch as RFC 3339 in UTC (`2026-12-02T15:04:05.123456Z`).
pub(crate) fn rfc3339(micros: receipts::Micros) -> String {
    receipts::validity::format_instant(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(1_767_225_600_000_000 + 1),
            "2026-01-01T00:00:00.000001Z"
        );
        assert_eq!(rfc3339(951_782_400_000_000), "2000-02-29T00:00:00.000000Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn answers_open_with_the_label() {
        let mut fields = Map::new();
        fields.insert("a".into(), json!(1));
        let text = serde_json::to_string(&labelled(fields)).unwrap_or_default();
        assert!(
            text.starts_with("{\"trust\":\"untrusted\",\"notice\":"),
            "{text}"
        );
    }
}
