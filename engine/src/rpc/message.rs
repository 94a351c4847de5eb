//! One incoming JSON-RPC 2.0 message — a request, a notification or a batch — turned into
//! the text of its response (none for notifications), whatever the transport.

use futures::future::join_all;
use serde::Serialize;
use serde_json::Value;

use super::dispatch::Dispatcher;
use super::errors::RpcError;
use super::outbound::Outbound;

/// Handles the message `text` (UTF-8 JSON); returns the response to send, if any. Notifications a
/// streaming execution produces go to `out` before this returns.
pub async fn respond(dispatcher: &Dispatcher, text: &[u8], out: &Outbound) -> Option<String> {
    let message: Value = match serde_json::from_slice(text) {
        Ok(message) => message,
        Err(err) => return Some(error_text(&Value::Null, RpcError::parse_error(err))),
    };
    match message {
        Value::Array(batch) if batch.is_empty() => Some(error_text(
            &Value::Null,
            RpcError::invalid_request("empty batch"),
        )),
        Value::Array(batch) => {
            let replies = join_all(
                batch
                    .into_iter()
                    .map(|request| respond_one(dispatcher, request, out)),
            )
            .await;
            let replies: Vec<Reply> = replies.into_iter().flatten().collect();
            if replies.is_empty() {
                return None;
            }
            Some(serde_json::to_string(&replies).expect("replies are plain JSON values"))
        }
        request => respond_one(dispatcher, request, out)
            .await
            .map(|reply| serde_json::to_string(&reply).expect("replies are plain JSON values")),
    }
}

/// The response to a line longer than `limit` bytes, which was skipped unread.
pub fn oversized(limit: usize) -> String {
    let err = RpcError::invalid_request(format!(
        "the message is longer than server.max_request_bytes ({limit} bytes)"
    ));
    error_text(&Value::Null, err)
}

/// A response whose `id` could not be read from the request.
pub fn error_text(id: &Value, error: RpcError) -> String {
    let reply = Reply {
        jsonrpc: "2.0",
        result: None,
        error: Some(error),
        id: id.clone(),
    };
    serde_json::to_string(&reply).expect("replies are plain JSON values")
}

/// A JSON-RPC response object.
#[derive(Serialize)]
struct Reply {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<RpcError>,
    id: Value,
}

/// A request as JSON-RPC 2.0 defines it; `id` is `None` for a notification.
struct Request {
    id: Option<Value>,
    method: String,
    params: Option<Value>,
}

async fn respond_one(dispatcher: &Dispatcher, request: Value, out: &Outbound) -> Option<Reply> {
    let request = match validate(request) {
        Ok(request) => request,
        Err(error) => {
            return Some(Reply {
                jsonrpc: "2.0",
                result: None,
                error: Some(error),
                id: Value::Null,
            })
        }
    };
    let outcome = dispatcher.call(&request.method, request.params, out).await;
    let id = request.id?;
    Some(match outcome {
        Ok(result) => Reply {
            jsonrpc: "2.0",
            result: Some(result),
            error: None,
            id,
        },
        Err(error) => Reply {
            jsonrpc: "2.0",
            result: None,
            error: Some(error),
            id,
        },
    })
}

/// Checks the envelope of one request object.
fn validate(request: Value) -> Result<Request, RpcError> {
    let Value::Object(mut request) = request else {
        return Err(RpcError::invalid_request("expected a request object"));
    };
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(RpcError::invalid_request("jsonrpc must be \"2.0\""));
    }
    let id = match request.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id),
        Some(_) => {
            return Err(RpcError::invalid_request(
                "id must be a string, a number or null",
            ))
        }
    };
    let method = match request.remove("method") {
        Some(Value::String(method)) => method,
        _ => return Err(RpcError::invalid_request("method must be a string")),
    };
    let params = match request.remove("params") {
        None => None,
        Some(params @ (Value::Object(_) | Value::Array(_))) => Some(params),
        Some(_) => {
            return Err(RpcError::invalid_request(
                "params must be an object or an array",
            ))
        }
    };
    Ok(Request { id, method, params })
}
