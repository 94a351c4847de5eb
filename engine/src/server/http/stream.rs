//! `POST /v1/sessions/{id}/execute` with `Accept: application/x-ndjson`: a streaming
//! execution over plain HTTP (docs/protocol.md, HTTP). The body's params run as
//! `session.execute` with `stream: true`, and the response is newline-delimited JSON, one
//! message a line, in the order they were produced: each `session.output`,
//! `session.input_request` and `session.display` notification as the socket sends it, then
//! one last line `{"result": …}` or `{"error": …}`. The client answers an `input()` with
//! `POST /v1/sessions/{id}/input`, on this node or any other. This is how a node that does not
//! hold a session relays a streaming execution from its holder (docs/cluster.md).
//!
//! The execution runs on a task of its own and writes into a bounded [`Outbound`] queue that
//! the response body drains, so a reader that stops reading holds the execution back rather
//! than memory growing. A reader that goes away drops the body and the queue: the execution
//! runs on as it would for a socket client that left, and an `input()` after that raises
//! `EOFError` at once. A bridged stream (`bridge`) also carries the server's `bridge.llm`
//! requests; its calls fail once the body ends or is dropped.

use actix_web::http::header::{HeaderValue, ACCEPT};
use actix_web::web::Bytes;
use actix_web::{rt, web, HttpRequest, HttpResponse};
use serde_json::{Map, Value};

use super::bridge::Registration;
use super::routes::{body_object, with_params};
use super::{ApiError, State};
use crate::cluster::forward::{BRIDGE, BRIDGE_STREAM};
use crate::rpc::wire::method;
use crate::rpc::{Caller, Outbound, OutboundQueue, OUTBOUND_CAPACITY};

/// The media type of a streamed response.
pub const NDJSON: &str = "application/x-ndjson";

/// `POST /v1/sessions/{id}/execute`: streamed when the client accepts [`NDJSON`], else the
/// whole result as one JSON body. A streamed execution that another node forwards for a
/// caller who answers the server's requests ([`BRIDGE`]) runs with its params as they are
/// (`stream` as the caller sent it) and sends its `bridge.llm` requests as lines too, for
/// that node to relay (`bridge`).
pub(super) async fn execute(
    req: HttpRequest,
    state: web::Data<State>,
    caller: Caller,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let mut params = with_params(body_object(&state, body).await?, id.clone())?;
    if !accepts_ndjson(req.headers().get_all(ACCEPT)) {
        return super::routes::run(&state, &caller, method::EXECUTE, params).await;
    }
    let mut response = HttpResponse::Ok();
    response.content_type(NDJSON);
    // The header counts from another node only, as the forwarding mark does.
    let (out, queue, bridge) = if caller.forwarded() && req.headers().contains_key(BRIDGE) {
        let (out, queue) = Outbound::new(OUTBOUND_CAPACITY);
        let registration = state.bridges.open(&id, &out)?;
        response.insert_header((BRIDGE_STREAM, registration.id()));
        (out, queue, Some(registration))
    } else {
        params.insert("stream".into(), Value::Bool(true));
        let (out, queue) = Outbound::one_way(OUTBOUND_CAPACITY);
        (out, queue, None)
    };
    Ok(response.streaming(stream(
        state,
        caller,
        params,
        out,
        Body {
            queue,
            _bridge: bridge,
        },
    )))
}

/// What the response's body drains: the queue, and the bridged stream's registration, which
/// goes with the body (its end, or its reader's departure).
struct Body {
    queue: OutboundQueue,
    /// Held for its drop.
    _bridge: Option<Registration>,
}

/// The lines of the execution of `params` for `caller`, run on a task of its own that writes
/// to `out`, whose queue `body` drains.
fn stream(
    state: web::Data<State>,
    caller: Caller,
    params: Map<String, Value>,
    out: Outbound,
    body: Body,
) -> impl futures::Stream<Item = Result<Bytes, actix_web::Error>> {
    rt::spawn(async move {
        let params = Some(Value::Object(params));
        let answer = state
            .dispatcher
            .call(&caller, method::EXECUTE, params, &out)
            .await;
        let last = match answer {
            Ok(result) => format!(r#"{{"result":{}}}"#, result.get()),
            Err(error) => serde_json::json!({ "error": error }).to_string(),
        };
        out.send(last).await;
    });
    futures::stream::unfold(body, |mut body| async move {
        let mut line = body.queue.recv().await?;
        line.push('\n');
        Some((Ok(Bytes::from(line)), body))
    })
}

/// Whether an `Accept` header names [`NDJSON`].
fn accepts_ndjson<'a>(accept: impl Iterator<Item = &'a HeaderValue>) -> bool {
    accept
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|kind| {
            let kind = kind.split(';').next().unwrap_or_default().trim();
            kind.eq_ignore_ascii_case(NDJSON)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_accept_that_names_ndjson_streams() {
        let values = |text: &[&'static str]| -> Vec<HeaderValue> {
            text.iter().map(|t| HeaderValue::from_static(t)).collect()
        };
        let streams = |text: &[&'static str]| accepts_ndjson(values(text).iter());
        assert!(streams(&["application/x-ndjson"]));
        assert!(streams(&["application/json, Application/X-NDJSON; q=0.9"]));
        assert!(streams(&["application/json", "application/x-ndjson"]));
        assert!(!streams(&[]));
        assert!(!streams(&["application/json"]));
        assert!(!streams(&["*/*"]));
    }
}
