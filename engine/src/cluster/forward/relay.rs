//! The relay of a holder's streamed answer to the caller's connection (see `forward`), line
//! by line until its last line, the result or the error: the notifications as they come
//! (when the caller streams), and the bridge both ways. Each `bridge.llm` request of the
//! holder goes to the caller under an id of the caller's own connection (its
//! [`PeerRequests`](crate::rpc::PeerRequests)), so that only a response on that connection
//! answers it, as on one node; the caller's response goes back to the holder's
//! `POST /v1/sessions/{id}/bridge` under the holder's id and the stream's; a `bridge.cancel`
//! of the holder reaches the caller under the caller's id.
//!
//! When the relay ends before the result (the caller went away, the holder's answer broke
//! off, or the relay was dropped), it tells the holder from `drop`, on tasks of their own: the
//! last `input()` it passed on is answered `null` (it raises `EOFError`), and the stream's
//! LLM calls fail (`gone`), so that the session is not held until the input or client timeout.
//! The caller's side of the calls still waiting is forgotten, and the caller is sent
//! `bridge.cancel` for each, as a session's end sends it on one node.

use std::collections::HashMap;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use super::{broken, not_json, BridgeAnswer, Forwarder, BRIDGE_STREAM};
use crate::rpc::wire::notification::{self, BRIDGE_CANCEL, BRIDGE_LLM};
use crate::rpc::wire::BridgeCancelParams;
use crate::rpc::{code, Outbound, PeerRefusal, PeerReply, RpcError};

impl Forwarder {
    /// Relays the streamed answer `response` of the holder (its session route `base`) to
    /// `out` for a caller confined to `owner`, until its last line: the result or the error.
    /// Notifications reach `out` when the caller streams (`notes`); the bridge's requests
    /// whenever the holder sends them.
    pub(super) async fn relay(
        &self,
        mut response: reqwest::Response,
        base: &str,
        owner: Option<&str>,
        out: &Outbound,
        notes: bool,
    ) -> Result<Box<RawValue>, RpcError> {
        let stream = (response.headers().get(BRIDGE_STREAM))
            .and_then(|id| id.to_str().ok())
            .map(str::to_owned);
        let mut farewell = Farewell {
            input: None,
            gone: (stream.as_deref()).map(|id| self.bridge_request(base, &BridgeAnswer::gone(id))),
        };
        let mut calls = Calls {
            out,
            asked: HashMap::new(),
        };
        let mut waiting: FuturesUnordered<BoxFuture<'_, String>> = FuturesUnordered::new();
        let mut lines = Lines::default();
        loop {
            let chunk = tokio::select! {
                chunk = response.chunk() => chunk,
                Some(held) = waiting.next(), if !waiting.is_empty() => {
                    calls.asked.remove(&held);
                    continue;
                }
                () = out.gone() => return Err(caller_gone()),
            };
            let chunk = match chunk {
                Ok(Some(chunk)) => chunk,
                Ok(None) => {
                    return Err(RpcError::new(
                        code::ENGINE_ERROR,
                        format!("{base} ended its streamed answer before the result"),
                    ))
                }
                Err(err) => return Err(broken(base, err)),
            };
            lines.extend(&chunk);
            while let Some(line) = lines.next_line() {
                let line = String::from_utf8(line).map_err(|err| not_json(base, err))?;
                let line = line.trim_end();
                let parsed: Line = serde_json::from_str(line).map_err(|err| not_json(base, err))?;
                let params = parsed.params.as_deref().map_or("null", RawValue::get);
                let relayed = match parsed.method.as_deref() {
                    None => {
                        farewell.input = None;
                        farewell.gone = None;
                        return match (parsed.result, parsed.error) {
                            (Some(result), _) => Ok(result),
                            (None, Some(error)) => Err(error),
                            (None, None) => Err(not_json(base, "neither result nor error")),
                        };
                    }
                    Some(BRIDGE_LLM) => {
                        let (Some(stream), Some(Value::String(held))) = (&stream, parsed.id) else {
                            return Err(not_json(base, "a bridge request outside a bridge"));
                        };
                        let params =
                            serde_json::from_str(params).map_err(|err| not_json(base, err))?;
                        let (text, reply) = match calls.ask(&held, params) {
                            Ok((text, reply)) => (Some(text), Ok(reply)),
                            Err(refused) => (None, Err(refused)),
                        };
                        waiting.push(self.bring_back(base, stream, held, reply));
                        match text {
                            Some(text) => text,
                            None => continue,
                        }
                    }
                    Some(BRIDGE_CANCEL) => {
                        let cancel: BridgeCancelParams =
                            serde_json::from_str(params).map_err(|err| not_json(base, err))?;
                        match calls.cancel(&cancel.call_id) {
                            Some(text) => text,
                            None => continue,
                        }
                    }
                    Some(notification::INPUT_REQUEST) => {
                        let asked = serde_json::from_str::<InputNote>(params)
                            .map_err(|err| not_json(base, err))?;
                        let eof = self.end_of_input(base, &asked.execution_id, owner);
                        if !notes {
                            // A caller that streams nothing cannot answer an input().
                            send_later(eof);
                            continue;
                        }
                        farewell.input = Some(eof);
                        line.to_owned()
                    }
                    Some(_) if !notes => continue,
                    Some(_) => line.to_owned(),
                };
                if !out.send(relayed).await {
                    return Err(caller_gone());
                }
            }
        }
    }

    /// Waits for the caller's response `reply` to the holder's request `held` of the bridged
    /// stream `stream` (or takes the refusal of the caller's connection), brings it to the
    /// holder at `base`, and ends with `held`. A request the caller will not answer
    /// (cancelled, or its connection gone) brings nothing.
    fn bring_back<'a>(
        &'a self,
        base: &'a str,
        stream: &'a str,
        held: String,
        reply: Result<oneshot::Receiver<PeerReply>, RpcError>,
    ) -> BoxFuture<'a, String> {
        Box::pin(async move {
            let reply = match reply {
                Ok(waiting) => waiting.await.ok(),
                Err(refused) => Some(Err(refused)),
            };
            if let Some(reply) = reply {
                let answer = BridgeAnswer::reply(stream, &held, reply);
                match self.bridge_request(base, &answer).send().await {
                    Ok(response) if response.status().is_success() => {}
                    // The call ended on the holder first (cancelled, timed out).
                    Ok(response) => {
                        tracing::debug!(status = %response.status(), "no bridge answer taken")
                    }
                    Err(err) => {
                        tracing::warn!(url = %base, error = %err, "cannot bring a bridge answer back")
                    }
                }
            }
            held
        })
    }

    /// The request that brings `answer` to the bridge route of the session at `base`.
    fn bridge_request(&self, base: &str, answer: &BridgeAnswer) -> reqwest::RequestBuilder {
        self.request(self.client.post(format!("{base}/bridge")).json(answer))
    }

    /// The request that answers the `input()` of the execution `execution_id` of the session
    /// at `base` with `null` (it raises `EOFError`).
    fn end_of_input(
        &self,
        base: &str,
        execution_id: &str,
        owner: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut body = serde_json::json!({"execution_id": execution_id, "value": null});
        if let Some(owner) = owner {
            body["owner"] = Value::String(owner.to_owned());
        }
        self.request(self.client.post(format!("{base}/input")).json(&body))
    }
}

/// The holder's requests passed on to the caller that wait for the caller's response: the
/// caller's id of each, by the holder's.
struct Calls<'a> {
    out: &'a Outbound,
    asked: HashMap<String, String>,
}

impl Calls<'_> {
    /// Asks the caller the holder's request `held` with `params`, under an id of the
    /// caller's connection: the request's text and where the caller's response will come,
    /// or the error the holder gets when the connection takes no more requests.
    fn ask(
        &mut self,
        held: &str,
        mut params: Map<String, Value>,
    ) -> Result<(String, oneshot::Receiver<PeerReply>), RpcError> {
        let (id, reply) = self.out.peer().start().map_err(|refusal| {
            RpcError::new(
                code::ENGINE_ERROR,
                match refusal {
                    PeerRefusal::Closed => "the client connection that ran this code is gone",
                    PeerRefusal::Full => "the client has too many calls waiting for its answer",
                },
            )
        })?;
        params.insert("call_id".into(), Value::String(id.clone()));
        let request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": BRIDGE_LLM,
            "params": params});
        self.asked.insert(held.to_owned(), id);
        Ok((request.to_string(), reply))
    }

    /// The caller's notice of the holder's `bridge.cancel` of `held`; `None` when the caller
    /// was not asked it, or answered it already.
    fn cancel(&mut self, held: &str) -> Option<String> {
        let id = self.asked.remove(held)?;
        self.out.peer().forget(&id);
        Some(cancel_notice(&id))
    }
}

impl Drop for Calls<'_> {
    fn drop(&mut self) {
        for (_, id) in self.asked.drain() {
            self.out.peer().forget(&id);
            // A notice only: when the queue is full, the client learns from the call's end.
            self.out.try_send(cancel_notice(&id));
        }
    }
}

/// The `bridge.cancel` notice of the caller's call `id`.
fn cancel_notice(id: &str) -> String {
    let params = BridgeCancelParams {
        call_id: id.to_owned(),
    };
    serde_json::json!({"jsonrpc": "2.0", "method": BRIDGE_CANCEL, "params": params}).to_string()
}

/// What the holder is told when a relay ends before the result: the `null` answer to the
/// last `input()` it passed on (the caller who would have answered it is gone, so `input()`
/// raises `EOFError` now rather than at the input timeout), and that the bridged stream's
/// caller is gone (its LLM calls fail now rather than at the client timeout). A relay may
/// end by being dropped (its caller's connection closed), so this is sent from `drop`.
struct Farewell {
    input: Option<reqwest::RequestBuilder>,
    gone: Option<reqwest::RequestBuilder>,
}

impl Drop for Farewell {
    fn drop(&mut self) {
        for request in [self.input.take(), self.gone.take()].into_iter().flatten() {
            send_later(request);
        }
    }
}

/// Sends `request` on a task of its own; what it answers is only logged.
fn send_later(request: reqwest::RequestBuilder) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        match request.send().await {
            Ok(response) if response.status().is_success() => {}
            // Nothing waits any more: it was answered, or the execution ended.
            Ok(response) => tracing::debug!(status = %response.status(), "a farewell not taken"),
            Err(err) => tracing::debug!(error = %err, "cannot send a farewell"),
        }
    });
}

/// The bytes of a streamed answer not yet cut into lines.
#[derive(Default)]
struct Lines {
    pending: Vec<u8>,
    /// How much of `pending` holds no line end: a long line that comes in many chunks is
    /// scanned once, not once per chunk.
    scanned: usize,
}

impl Lines {
    fn extend(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
    }

    /// The next whole line, its end included.
    fn next_line(&mut self) -> Option<Vec<u8>> {
        match self.pending[self.scanned..]
            .iter()
            .position(|&b| b == b'\n')
        {
            Some(found) => {
                let line = self.pending.drain(..=self.scanned + found).collect();
                self.scanned = 0;
                Some(line)
            }
            None => {
                self.scanned = self.pending.len();
                None
            }
        }
    }
}

/// One line of a streamed answer: a notification (`method`), a request of the bridge
/// (`method` and `id`), or the last line (`result` or `error`).
#[derive(serde::Deserialize)]
struct Line {
    id: Option<Value>,
    method: Option<String>,
    params: Option<Box<RawValue>>,
    result: Option<Box<RawValue>>,
    error: Option<RpcError>,
}

/// What the relay needs of a `session.input_request` notification.
#[derive(serde::Deserialize)]
struct InputNote {
    execution_id: String,
}

/// The answer of a relay whose caller went away: it has nowhere to go.
fn caller_gone() -> RpcError {
    RpcError::new(code::ENGINE_ERROR, "the caller went away")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_line_is_a_note_a_request_or_the_last_line() {
        let note = r#"{"jsonrpc":"2.0","method":"session.output","params":{"data":"a"}}"#;
        let note: Line = serde_json::from_str(note).unwrap();
        assert_eq!(note.method.as_deref(), Some("session.output"));
        assert_eq!(note.id, None);
        let asked = r#"{"jsonrpc":"2.0","id":"b1","method":"bridge.llm","params":{}}"#;
        let asked: Line = serde_json::from_str(asked).unwrap();
        assert_eq!(asked.id, Some(Value::from("b1")));
        let done: Line = serde_json::from_str(r#"{"result":{"status":"ok"}}"#).unwrap();
        assert_eq!(
            done.result.map(|r| r.get().to_owned()).as_deref(),
            Some(r#"{"status":"ok"}"#)
        );
        let failed: Line =
            serde_json::from_str(r#"{"error":{"code":-32001,"message":"m"}}"#).unwrap();
        assert_eq!(failed.error.map(|e| e.code), Some(-32001));
    }

    #[test]
    fn lines_are_cut_at_their_ends_whatever_the_chunks() {
        let mut lines = Lines::default();
        lines.extend(b"ab");
        assert_eq!(lines.next_line(), None);
        lines.extend(b"c\nd\ne");
        assert_eq!(lines.next_line().as_deref(), Some(&b"abc\n"[..]));
        assert_eq!(lines.next_line().as_deref(), Some(&b"d\n"[..]));
        assert_eq!(lines.next_line(), None);
        lines.extend(b"\n");
        assert_eq!(lines.next_line().as_deref(), Some(&b"e\n"[..]));
    }

    #[tokio::test]
    async fn the_caller_is_asked_under_its_own_id_and_told_of_a_cancel_once() {
        let (out, _queue) = Outbound::new(4096);
        let (text, reply) = {
            let mut calls = Calls {
                out: &out,
                asked: HashMap::new(),
            };
            let params = serde_json::json!({"call_id": "b7", "prompts": ["p"]});
            let (text, reply) = calls
                .ask("b7", params.as_object().unwrap().clone())
                .unwrap();
            let asked: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(asked["params"]["call_id"], asked["id"]);
            assert_eq!(asked["params"]["prompts"], serde_json::json!(["p"]));
            let cancel: Value = serde_json::from_str(&calls.cancel("b7").unwrap()).unwrap();
            assert_eq!(cancel["params"]["call_id"], asked["id"]);
            assert_eq!(calls.cancel("b7"), None, "once");
            (text, reply)
        };
        let asked: Value = serde_json::from_str(&text).unwrap();
        assert!(
            !out.peer().answer(&asked["id"], Ok(Value::Null)),
            "a cancelled call takes no answer"
        );
        assert!(reply.await.is_err());
    }
}
