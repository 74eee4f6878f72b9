//! What `/mcp` answers to a JSON body that is not a message it can take.
//!
//! The SDK answers 415 to any body it cannot read as one JSON-RPC message, which tells a client
//! that sent well-formed JSON to change its `Content-Type`. 415 stays for a body that is not
//! JSON at all; JSON that is not a message the server can take gets what JSON-RPC 2.0 and the
//! MCP transport say instead: HTTP 400 ("if the server cannot accept the input, it MUST return
//! an HTTP error status code, e.g. 400 Bad Request") with a JSON-RPC error object:
//! - `-32600` invalid request: a batch (MCP dropped batching in 2025-06-18), a message that
//!   is not an object, without `"jsonrpc": "2.0"`, with an id that is neither a string nor an
//!   integer, or without a method;
//! - `-32602` invalid params: a request whose `params` its method cannot read (an array or a
//!   scalar where the method takes an object); the error carries the request's id. Params of
//!   the right shape with fields of the wrong type reach the SDK, whose handler answers them
//!   with its own JSON-RPC error.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// JSON-RPC's code for a message that is not a valid request.
pub(crate) const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC's code for parameters the method cannot read.
pub(crate) const INVALID_PARAMS: i64 = -32602;

/// The refusal of a body, when it is JSON the SDK cannot take as a message; `None` when the
/// SDK reads it, or when it is not JSON (the SDK's 415 then stands).
pub(crate) fn refusal(body: &[u8]) -> Option<(i64, Value, String)> {
    if serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(body).is_ok() {
        return None;
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    let invalid = |message: &str| Some((INVALID_REQUEST, Value::Null, message.to_owned()));
    let Value::Object(message) = &value else {
        return if value.is_array() {
            invalid("batches are not supported: send one JSON-RPC message per request")
        } else {
            invalid("a JSON-RPC message is a JSON object")
        };
    };
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid("a JSON-RPC message has \"jsonrpc\": \"2.0\"");
    }
    let id = match message.get("id") {
        None => Value::Null,
        Some(id @ Value::String(_)) => id.clone(),
        Some(Value::Number(number)) if number.is_i64() || number.is_u64() => {
            Value::Number(number.clone())
        }
        Some(_) => return invalid("a request id is a string or an integer"),
    };
    match message.get("method") {
        Some(Value::String(_)) => {}
        Some(_) => return invalid("`method` is a string"),
        None if message.contains_key("result") || message.contains_key("error") => {
            return invalid("the response is not one this server sent a request for")
        }
        None => return invalid("a request names its `method`"),
    }
    Some((
        INVALID_PARAMS,
        id,
        "the parameters do not fit the method (see tools/list and the MCP schema)".to_owned(),
    ))
}

/// The HTTP answer to a refused body: 400 and the JSON-RPC error object.
pub(crate) fn answer(code: i64, id: Value, message: String) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message },
    });
    let mut response = (StatusCode::BAD_REQUEST, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> Option<(i64, Value)> {
        refusal(body.as_bytes()).map(|(code, id, _)| (code, id))
    }

    #[test]
    fn json_that_is_no_message_gets_a_json_rpc_error() {
        let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        assert_eq!(code(ping), None, "a message the SDK reads passes");
        assert_eq!(code("not json"), None, "not JSON: the SDK's 415 stands");
        assert_eq!(
            code(&format!("[{ping}]")),
            Some((INVALID_REQUEST, Value::Null))
        );
        assert_eq!(code("42"), Some((INVALID_REQUEST, Value::Null)));
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#),
            Some((INVALID_REQUEST, Value::Null))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#),
            Some((INVALID_REQUEST, Value::Null))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
            Some((INVALID_REQUEST, Value::Null))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":[1,2]}"#),
            Some((INVALID_PARAMS, json!(7)))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":"x","method":"ping","params":"oops"}"#),
            Some((INVALID_PARAMS, json!("x")))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":7}"#),
            Some((INVALID_PARAMS, Value::Null))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#),
            Some((INVALID_REQUEST, Value::Null))
        );
    }
}
