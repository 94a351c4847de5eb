//! One incoming JSON-RPC 2.0 message — a request, a notification or a batch — turned into
//! the text of its response (none for notifications), whatever the transport. A response
//! of the client to one of the server's requests (`bridge.llm`) goes to that request, and
//! is itself answered by nothing.

use futures::future::join_all;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::caller::Caller;
use super::dispatch::Dispatcher;
use super::errors::RpcError;
use super::outbound::Outbound;
use super::strict_json::{self, duplicate_message, Checked};

/// Handles the message `text` (UTF-8 JSON) from `caller`; returns the response to send, if
/// any. Notifications a streaming execution produces go to `out` before this returns.
pub async fn respond(
    dispatcher: &Dispatcher,
    caller: &Caller,
    text: &[u8],
    out: &Outbound,
) -> Option<String> {
    match parse(text) {
        Message::Invalid(error) => Some(error_text(&Value::Null, error)),
        Message::Single(request) => respond_one(dispatcher, caller, request, out)
            .await
            .map(|reply| serde_json::to_string(&reply).expect("replies are plain JSON values")),
        Message::Batch(batch) => {
            let replies = join_all(
                batch
                    .into_iter()
                    .map(|request| respond_one(dispatcher, caller, request, out)),
            )
            .await;
            let replies: Vec<Reply> = replies.into_iter().flatten().collect();
            if replies.is_empty() {
                return None;
            }
            Some(serde_json::to_string(&replies).expect("replies are plain JSON values"))
        }
    }
}

/// What one incoming message holds.
#[derive(Debug)]
enum Message {
    /// Not JSON, or an empty batch: one error response with a null id.
    Invalid(RpcError),
    Single(Result<Incoming, RpcError>),
    Batch(Vec<Result<Incoming, RpcError>>),
}

/// Parses one message; never fails, whatever the bytes: what is wrong becomes the error
/// its response carries.
fn parse(text: &[u8]) -> Message {
    match strict_json::parse_message(text) {
        Err(err) => Message::Invalid(RpcError::parse_error(err)),
        Ok(strict_json::Message::Batch(batch)) if batch.is_empty() => {
            Message::Invalid(RpcError::invalid_request("empty batch"))
        }
        Ok(strict_json::Message::Batch(batch)) => {
            Message::Batch(batch.into_iter().map(validate).collect())
        }
        Ok(strict_json::Message::Object(request)) => Message::Single(validate(request)),
        Ok(strict_json::Message::Other) => {
            Message::Single(Err(RpcError::invalid_request("expected a request object")))
        }
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
    result: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<RpcError>,
    id: Value,
}

/// A request as JSON-RPC 2.0 defines it; `id` is `None` for a notification. Params with a
/// duplicate key are answered with `params_error` instead of running the method.
#[derive(Debug)]
struct Request {
    id: Option<Value>,
    method: String,
    params: Option<Value>,
    params_error: Option<RpcError>,
}

async fn respond_one(
    dispatcher: &Dispatcher,
    caller: &Caller,
    request: Result<Incoming, RpcError>,
    out: &Outbound,
) -> Option<Reply> {
    let request = match request {
        Ok(Incoming::Call(request)) => request,
        Ok(Incoming::Response { id, reply }) => {
            if !out.peer().answer(&id, reply) {
                tracing::debug!(%id, "a response to no request of this connection");
            }
            return None;
        }
        Err(error) => {
            return Some(Reply {
                jsonrpc: "2.0",
                result: None,
                error: Some(error),
                id: Value::Null,
            })
        }
    };
    let outcome = match request.params_error {
        Some(error) => Err(error),
        None => {
            dispatcher
                .call(caller, &request.method, request.params, out)
                .await
        }
    };
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

/// One object of a message: a call of a method, or the client's response to a request of
/// the server.
#[derive(Debug)]
enum Incoming {
    Call(Request),
    Response {
        id: Value,
        reply: Result<Value, RpcError>,
    },
}

/// Checks the envelope of one request (or response) object.
fn validate(request: Checked) -> Result<Incoming, RpcError> {
    let request_duplicate = request.duplicate;
    let Value::Object(mut request) = request.value else {
        return Err(RpcError::invalid_request("expected a request object"));
    };
    if let Some(response) = as_response(&mut request) {
        return Ok(response);
    }
    // A duplicate inside params is the params' fault, answered with the request's id.
    let params_error = match request_duplicate.as_deref() {
        None => None,
        Some(path) if path.starts_with("params.") || path.starts_with("params[") => {
            let field = path.strip_prefix("params.").unwrap_or(path);
            Some(RpcError::invalid_params(duplicate_message(field)))
        }
        Some(path) => return Err(RpcError::invalid_request(duplicate_message(path))),
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
    Ok(Incoming::Call(Request {
        id,
        method,
        params,
        params_error,
    }))
}

/// A response object (`jsonrpc`, `id`, and `result` or an `error` object; no `method`), as
/// the client answers a request of the server.
fn as_response(object: &mut serde_json::Map<String, Value>) -> Option<Incoming> {
    let is_response = object.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
        && !object.contains_key("method")
        && object.contains_key("id")
        && (object.contains_key("result") != object.contains_key("error"));
    if !is_response {
        return None;
    }
    let id = object.remove("id").unwrap_or_default();
    let reply = match (object.remove("result"), object.remove("error")) {
        (Some(result), _) => Ok(result),
        (None, Some(error)) => Err(serde_json::from_value(error).unwrap_or_else(|_| {
            RpcError::invalid_request("the client's error is not an error object")
        })),
        (None, None) => return None,
    };
    Some(Incoming::Response { id, reply })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn single(text: &str) -> Result<Request, RpcError> {
        match parse(text.as_bytes()) {
            Message::Single(Ok(Incoming::Call(request))) => Ok(request),
            Message::Single(Err(error)) => Err(error),
            other => panic!("expected a single request, got {other:?}"),
        }
    }

    #[test]
    fn a_response_of_the_client_is_told_from_a_request() {
        let text = r#"{"jsonrpc":"2.0","id":"b1","result":{"answers":["x"]}}"#;
        let Message::Single(Ok(Incoming::Response { id, reply })) = parse(text.as_bytes()) else {
            panic!("a response");
        };
        assert_eq!(id, Value::from("b1"));
        assert_eq!(reply.unwrap()["answers"][0], "x");
        let text = r#"{"jsonrpc":"2.0","id":"b2","error":{"code":1,"message":"no"}}"#;
        let Message::Single(Ok(Incoming::Response { reply, .. })) = parse(text.as_bytes()) else {
            panic!("a response");
        };
        assert_eq!(reply.unwrap_err().message, "no");
        // Both result and error, or neither: not a response, and not a request either.
        for text in [
            r#"{"jsonrpc":"2.0","id":"b3","result":1,"error":{"code":1,"message":"no"}}"#,
            r#"{"jsonrpc":"2.0","id":"b3"}"#,
        ] {
            assert!(single(text).is_err(), "{text}");
        }
    }

    #[test]
    fn a_well_formed_request_is_accepted() {
        let request = single(
            r#"{"jsonrpc":"2.0","id":7,"method":"session.info","params":{"session_id":"s"}}"#,
        )
        .expect("valid");
        assert_eq!(request.id, Some(Value::from(7)));
        assert_eq!(request.method, "session.info");
        let note = single(r#"{"jsonrpc":"2.0","method":"engine.health"}"#).expect("valid");
        assert_eq!(note.id, None);
        let null_id = single(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).expect("valid");
        assert_eq!(
            null_id.id,
            Some(Value::Null),
            "a null id is a request, not a notification"
        );
    }

    #[test]
    fn malformed_envelopes_are_invalid_requests() {
        for text in [
            r#"{"id":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":5}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":"p"}"#,
            r#"42"#,
        ] {
            let err = single(text).expect_err(text);
            assert_eq!(err.code, super::super::code::INVALID_REQUEST, "{text}");
        }
        assert!(matches!(parse(b"[]"), Message::Invalid(e) if e.code == -32600));
        assert!(matches!(parse(b"{"), Message::Invalid(e) if e.code == -32700));
    }

    #[test]
    fn duplicate_keys_are_refused_naming_the_key() {
        let request = single(
            r#"{"jsonrpc":"2.0","id":1,"method":"session.info",
                "params":{"session_id":"a","session_id":"b"}}"#,
        )
        .expect("the envelope itself is fine");
        let err = request.params_error.expect("the params are refused");
        assert_eq!(err.code, super::super::code::INVALID_PARAMS);
        assert!(
            err.message.contains("session_id: duplicate key"),
            "{}",
            err.message
        );
        let err = single(r#"{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}"#).unwrap_err();
        assert_eq!(err.code, super::super::code::INVALID_REQUEST);
        assert!(
            err.message.contains("method: duplicate key"),
            "{}",
            err.message
        );
    }

    /// Arbitrary JSON values, to reach the envelope checks more often than random bytes do.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z.\\\"]{0,12}".prop_map(Value::from),
            Just(Value::from("2.0")),
            Just(Value::from("session.execute")),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("jsonrpc".to_owned()),
                        Just("id".to_owned()),
                        Just("method".to_owned()),
                        Just("params".to_owned()),
                        Just("result".to_owned()),
                        "[a-z]{1,6}"
                    ],
                    inner,
                    0..6
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the bytes, parsing ends in a message or a typed error, and an error
        /// response is valid JSON-RPC.
        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Message::Invalid(error) = parse(&bytes) {
                let text = error_text(&Value::Null, error);
                let reply: Value = serde_json::from_str(&text).expect("an error reply is JSON");
                prop_assert_eq!(&reply["jsonrpc"], "2.0");
                prop_assert!(reply["error"]["code"].is_i64());
            }
        }

        /// Every JSON value parses, and exactly the well-formed envelopes are accepted.
        #[test]
        fn envelopes_are_judged_by_the_spec(value in json_value()) {
            let text = serde_json::to_vec(&value).expect("a Value encodes");
            let judged: Vec<(Value, Result<Incoming, RpcError>)> = match (parse(&text), &value) {
                (Message::Single(request), _) => vec![(value.clone(), request)],
                (Message::Batch(batch), Value::Array(items)) => items.iter().cloned().zip(batch).collect(),
                (Message::Invalid(_), Value::Array(items)) => { prop_assert!(items.is_empty()); vec![] }
                (other, _) => { prop_assert!(false, "unexpected {:?}", other); vec![] }
            };
            for (value, request) in judged {
                let is_response = value.get("jsonrpc") == Some(&Value::from("2.0"))
                    && value.get("method").is_none()
                    && value.get("id").is_some()
                    && (value.get("result").is_some() != value.get("error").is_some());
                prop_assert_eq!(matches!(request, Ok(Incoming::Response { .. })), is_response, "{}", value);
                let well_formed = is_response || value.get("jsonrpc") == Some(&Value::from("2.0"))
                    && value.get("method").is_some_and(Value::is_string)
                    && value.get("id").is_none_or(|id| id.is_string() || id.is_number() || id.is_null())
                    && value.get("params").is_none_or(|p| p.is_object() || p.is_array());
                prop_assert_eq!(request.is_ok(), well_formed, "{}", value);
            }
        }
    }
}
