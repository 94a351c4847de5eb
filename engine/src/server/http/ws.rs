//! `GET /v1/sessions/{id}/ws`: JSON-RPC (docs/protocol.md) over a WebSocket. Each text (or
//! binary) message from the client is one JSON-RPC message — request, notification or batch —
//! handled by [`rpc::respond`]. Messages are handled concurrently, so a long
//! `session.execute` does not hold up the `session.input` or `session.interrupt` that
//! concerns it; responses and the `session.output`/`session.input_request`/`session.display`
//! notifications go out as text messages through the connection's [`Outbound`] queue, in
//! the order they were produced. The `{id}` in the path must name a session the caller may
//! reach (else 404 before the upgrade), and the connection is pinned to it: a message about
//! any other session is refused.
//!
//! The bounds are those of the Unix socket's connections: a message by `max_request_bytes`
//! (answered -32600, then the socket closes with 1009, since the frame cannot be skipped),
//! the messages in flight by `MAX_IN_FLIGHT`, unwritten bytes by [`OUTBOUND_CAPACITY`], and
//! a client that stops reading for `WRITE_STALL` loses its connection.

use actix_web::web::Bytes;
use actix_web::{rt, web, HttpRequest, HttpResponse};
use std::sync::Arc;

use actix_ws::{AggregatedMessage, AggregatedMessageStream, CloseCode, CloseReason, Session};
use futures::stream::FuturesUnordered;
use futures::StreamExt;

use super::{ApiError, State};
use crate::rpc::{self, Caller, Outbound, OutboundQueue, OUTBOUND_CAPACITY};
use crate::server::connection::{MAX_IN_FLIGHT, WRITE_STALL};

/// Why a connection ends.
enum Ending {
    /// The client sent a close frame or went away.
    Client(Option<CloseReason>),
    /// The client stopped reading for [`WRITE_STALL`], or the socket broke.
    Stalled,
    /// The server is stopping and nothing is in flight any more.
    Shutdown,
    /// The client broke the protocol (e.g. a message over the size limit).
    Protocol(CloseCode),
}

/// Upgrades the request and serves the socket on a task of its own, for `caller` pinned to
/// the session of the path.
pub(super) async fn connect(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, actix_web::Error> {
    let session_id = state
        .dispatcher
        .resolve(&caller, &id)
        .await
        .map_err(ApiError::from)?;
    let caller = Arc::new(caller.pinned_to(session_id));
    let (response, session, messages) = actix_ws::handle(&req, payload)?;
    let limit = state.max_request_bytes;
    let messages = messages
        .max_frame_size(limit)
        .aggregate_continuations()
        .max_continuation_size(limit);
    rt::spawn(serve(state, caller, session, messages));
    Ok(response)
}

/// Reads messages until the client leaves, breaks the protocol, or the server stops and
/// nothing is in flight; then closes the socket.
async fn serve(
    state: web::Data<State>,
    caller: Arc<Caller>,
    mut session: Session,
    mut messages: AggregatedMessageStream,
) {
    let limit = state.max_request_bytes;
    let (out, queue) = Outbound::new(OUTBOUND_CAPACITY);
    let mut writer = rt::spawn(write(session.clone(), queue));
    let mut shutdown = state.shutdown.clone();
    let mut in_flight = FuturesUnordered::new();
    let mut stopping = false;
    let ending = loop {
        if stopping && in_flight.is_empty() {
            break Ending::Shutdown;
        }
        tokio::select! {
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            message = messages.recv(), if in_flight.len() < MAX_IN_FLIGHT => match message {
                Some(Ok(AggregatedMessage::Text(text))) => {
                    in_flight.push(handle(state.clone(), caller.clone(), text.into_bytes(), out.clone()));
                }
                Some(Ok(AggregatedMessage::Binary(bytes))) => {
                    in_flight.push(handle(state.clone(), caller.clone(), bytes, out.clone()));
                }
                Some(Ok(AggregatedMessage::Ping(bytes))) => {
                    if session.pong(&bytes).await.is_err() {
                        break Ending::Client(None);
                    }
                }
                Some(Ok(AggregatedMessage::Pong(_))) => {}
                Some(Ok(AggregatedMessage::Close(reason))) => break Ending::Client(reason),
                Some(Err(err)) => {
                    tracing::debug!("WebSocket protocol error: {err}");
                    // The frame was not consumed, so the stream cannot go on after it.
                    let code = if is_oversized(&err) {
                        out.send(rpc::oversized(limit)).await;
                        CloseCode::Size
                    } else {
                        CloseCode::Protocol
                    };
                    break Ending::Protocol(code);
                }
                None => break Ending::Client(None),
            },
            // The writer ends early only when the peer is gone or stalled.
            _ = &mut writer => break Ending::Stalled,
            // Reading goes on while stopping: running executions may still need the
            // client's session.input or session.interrupt.
            _ = shutdown.wait_for(|stopping| *stopping), if !stopping => stopping = true,
        }
    };
    // Whatever still runs has nobody to answer to, and nothing waits for the client.
    out.peer().hang_up();
    drop(in_flight);
    drop(out);
    let reason = match ending {
        // Nothing more can be written; dropping the session ends the response.
        Ending::Stalled => return,
        Ending::Client(reason) => reason,
        Ending::Shutdown => Some(CloseReason::from(CloseCode::Away)),
        Ending::Protocol(code) => Some(CloseReason::from(code)),
    };
    // The writer ends once every sender is gone and the queue is drained.
    if matches!(writer.await, Ok(true)) {
        let _ = session.close(reason).await;
    }
}

/// Handles one JSON-RPC message and queues its response, if it has one.
async fn handle(state: web::Data<State>, caller: Arc<Caller>, message: Bytes, out: Outbound) {
    if let Some(reply) = rpc::respond(&state.dispatcher, &caller, &message, &out).await {
        out.send(reply).await;
    }
}

/// Sends the queued messages, in order, until the queue closes (true) or the socket breaks
/// or makes no progress for [`WRITE_STALL`] (false).
async fn write(mut session: Session, mut queue: OutboundQueue) -> bool {
    while let Some(text) = queue.recv().await {
        match tokio::time::timeout(WRITE_STALL, session.text(text)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return false,
            Err(_) => {
                tracing::warn!("closing a WebSocket whose peer stopped reading");
                return false;
            }
        }
    }
    true
}

/// Whether `err` is a frame or message over the size limit.
fn is_oversized(err: &actix_ws::ProtocolError) -> bool {
    match err {
        actix_ws::ProtocolError::Overflow => true,
        // How the aggregator reports continuations over the limit.
        actix_ws::ProtocolError::Io(err) => err.to_string().contains("maximum continuation size"),
        _ => false,
    }
}
