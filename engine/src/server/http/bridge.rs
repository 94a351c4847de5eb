//! The holder's side of a bridged forward (docs/cluster.md, Forwarding): the streamed answers
//! whose `bridge.llm` requests another node relays to the client that started the execution,
//! and `POST /v1/sessions/{id}/bridge`, where that node brings the client's answers back.
//!
//! A forwarded streamed execution that asks for the bridge ([`BRIDGE`], from another node
//! only) runs with a queue whose peer table is open, so that the client-answered LLM bridge
//! (rpc/client_llm.rs) sends its requests as lines of the streamed answer. The stream is
//! registered here under a random id, which the response's [`BRIDGE_STREAM`] header tells
//! the forwarding node; an answer names that id and the call's, and reaches that stream's
//! table only. Only another node (the admin token and [`FORWARDED_BY`]) may answer, and only
//! for the session of the stream: an owner's token, another stream's id or session code
//! (which knows neither the token nor the id) cannot. When the streamed answer ends, or its
//! reader goes, the table hangs up: a call still waiting fails at once.
//!
//! [`FORWARDED_BY`]: crate::cluster::forward::FORWARDED_BY

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use actix_web::{web, HttpResponse};
use serde_json::Value;

use super::routes::body_object;
use super::{ApiError, State};
use crate::cluster::forward::{BridgeAnswer, Bridged};
#[cfg(doc)]
use crate::cluster::forward::{BRIDGE, BRIDGE_STREAM};
use crate::rpc::{code, Caller, Outbound, PeerRequests, RpcError};

/// The streamed answers whose requests another node relays, by their random id.
#[derive(Default)]
pub(super) struct Bridges {
    open: Mutex<HashMap<String, Stream>>,
}

/// One bridged streamed answer.
struct Stream {
    /// The session of the execution, as the path named it.
    session: String,
    peer: Arc<PeerRequests>,
}

impl Bridges {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Stream>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the streamed answer of session `session` whose messages go to `out`; it
    /// stays registered, and its table open, while the registration lives.
    pub(super) fn open(
        self: &Arc<Self>,
        session: &str,
        out: &Outbound,
    ) -> Result<Registration, ApiError> {
        let id = random_id().map_err(|err| {
            RpcError::new(
                code::INTERNAL_ERROR,
                format!("no random id for a bridged stream: {err}"),
            )
        })?;
        let peer = out.shared_peer();
        self.lock().insert(
            id.clone(),
            Stream {
                session: session.to_owned(),
                peer: peer.clone(),
            },
        );
        Ok(Registration {
            bridges: self.clone(),
            id,
            peer,
        })
    }

    /// Hands `answer` to its stream's table: whether a call waited for it (a hang-up counts
    /// as taken). Refuses an answer for a stream that is not open for `session`.
    fn answer(&self, session: &str, answer: BridgeAnswer) -> Result<bool, RpcError> {
        let (stream, reply) = answer.into_reply().map_err(RpcError::invalid_params)?;
        let peer = match self.lock().get(&stream) {
            Some(open) if open.session == session => open.peer.clone(),
            _ => {
                return Err(RpcError::invalid_params(format!(
                    "stream: no bridged execution of session {session} has this id (it ended, \
                     or never was)"
                )))
            }
        };
        Ok(match reply {
            Bridged::Answer { call_id, reply } => peer.answer(&Value::String(call_id), reply),
            Bridged::Gone => {
                peer.hang_up();
                true
            }
        })
    }
}

/// A registered bridged stream: the body of its response holds it, so that the stream is
/// forgotten, and its waiting calls fail, when the body ends or is dropped.
pub(super) struct Registration {
    bridges: Arc<Bridges>,
    id: String,
    peer: Arc<PeerRequests>,
}

impl Registration {
    /// The stream's id, for the response's header.
    pub(super) fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.peer.hang_up();
        self.bridges.lock().remove(&self.id);
    }
}

/// `POST /v1/sessions/{id}/bridge`: another node brings the answer of its client (or its
/// departure) to a call of a bridged stream. `{"answered": bool}`: false when the call waits
/// no more (answered, cancelled, timed out).
pub(super) async fn answer(
    state: web::Data<State>,
    caller: Caller,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    if !caller.forwarded() {
        return Err(RpcError::new(
            code::UNAUTHORIZED,
            "unauthorized: only another node of the cluster answers a bridged call",
        )
        .into());
    }
    let body = Value::Object(body_object(&state, body).await?);
    let answer: BridgeAnswer =
        serde_json::from_value(body).map_err(|err| RpcError::invalid_params(err.to_string()))?;
    let answered = state.bridges.answer(&id, answer)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "answered": answered })))
}

/// 128 random bits from the kernel, in hex.
fn random_id() -> std::io::Result<String> {
    use std::fmt::Write as _;
    let mut bytes = [0u8; 16];
    // SAFETY: the kernel writes at most `bytes.len()` bytes into the buffer it is given.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if filled != bytes.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(bytes
        .iter()
        .fold(String::with_capacity(32), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_reaches_its_own_streams_call_only() {
        let bridges = Arc::new(Bridges::default());
        let (out, _queue) = Outbound::new(4096);
        let registration = bridges.open("s-1", &out).unwrap();
        let (call, reply) = out.peer().start().unwrap();
        let answer = |stream: &str, call: &str| BridgeAnswer {
            stream: stream.to_owned(),
            call_id: Some(call.to_owned()),
            result: Some(serde_json::json!({"answers": ["a"]})),
            error: None,
            gone: false,
        };
        let other = bridges.answer("s-2", answer(registration.id(), &call));
        assert_eq!(
            other.unwrap_err().code,
            code::INVALID_PARAMS,
            "another session"
        );
        let guessed = bridges.answer("s-1", answer("0123", &call));
        assert_eq!(
            guessed.unwrap_err().code,
            code::INVALID_PARAMS,
            "a made-up stream"
        );
        assert!(bridges
            .answer("s-1", answer(registration.id(), &call))
            .unwrap());
        assert!(reply.await.unwrap().is_ok());
        assert!(!bridges
            .answer("s-1", answer(registration.id(), &call))
            .unwrap());

        // The stream's end fails what still waits and forgets the stream.
        let (_, waiting) = out.peer().start().unwrap();
        let id = registration.id().to_owned();
        drop(registration);
        assert!(waiting.await.is_err());
        assert!(bridges.answer("s-1", answer(&id, "b9")).is_err());
    }

    #[test]
    fn stream_ids_are_random_and_long() {
        let (a, b) = (random_id().unwrap(), random_id().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
