//! Forwarding: a request for a session that another live node holds is sent on to that
//! node's HTTP API (its `advertise_url`), so that a client need not know which node holds a
//! session.
//!
//! The request goes to the session method's REST route (docs/protocol.md, HTTP) with the
//! admin token of `[server] token` (every node of a cluster shares it) and the owner the
//! caller is confined to (in the body, or `?owner=` for a GET or DELETE), so the holder
//! applies the same owner rule as the node that received it. The header [`FORWARDED_BY`]
//! marks it: the holder serves it or refuses it, and never sends it on again.
//!
//! A streaming execution (`stream: true`, which is also what lets `input()` reach the caller)
//! asks the holder for its streamed response (`Accept: application/x-ndjson`): one JSON
//! message a line, the notifications as they happen and then the result. Each notification
//! line is relayed to the caller's connection as it is, bytes unchanged; the caller answers
//! an `input()` with `session.input`, which is forwarded like any other call. A streamed
//! HTTP response rather than the holder's WebSocket: one response is one ordered stream that
//! ends with its result, so nothing needs matching up; backpressure is TCP's (the relay reads
//! a line only once the caller's queue took the one before, and the holder's execution waits
//! while its own queue is full); and it uses the same pooled keep-alive connections, token and
//! headers as every other forward, where a WebSocket would take a client of its own and a
//! handshake per execution.
//!
//! The relay ends when the holder's response ends (the execution finished) or the caller
//! goes: its connection hangs up or refuses a line, or the request's future is dropped. Either way the
//! response is dropped, which closes the connection to the holder, whose execution then runs
//! on without a reader, as for a socket client that left. An `input()` the caller can no
//! longer answer is answered `null` at once (it raises `EOFError`), so the session is not
//! held until the input timeout.
//!
//! The forwarder remembers which node answered for a session ([`Holders`]), so the next
//! request for it goes straight there instead of asking the store first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::ACCEPT;
use reqwest::Method;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::errors::ClusterError;
use crate::rpc::wire::{method, notification};
use crate::rpc::{code, Outbound, RpcError};

/// The header that marks a request another node sent on; its value is that node's id.
pub const FORWARDED_BY: &str = "x-pyvisor-forwarded-by";

/// The media type of the holder's streamed answer.
const NDJSON: &str = "application/x-ndjson";

/// The longest wait to connect to the holder; the request itself runs as long as the
/// holder's own limits let it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long an idle connection to another node is kept for the next forward.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The most sessions whose holder is remembered; past it, the memory starts over.
const MAX_HOLDERS: usize = 65_536;

/// How a session method travels to the holder's REST route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// POST to the path after `/v1/sessions/{id}`, with the params as the JSON body.
    Post(&'static str),
    /// GET of the path after `/v1/sessions/{id}`, with `?owner=`.
    Get(&'static str),
    /// `DELETE /v1/sessions/{id}?checkpoint=&owner=`.
    Delete,
}

/// The REST route of a session method that can be forwarded.
fn route(method: &str) -> Option<Route> {
    Some(match method {
        method::EXECUTE => Route::Post("/execute"),
        method::INPUT => Route::Post("/input"),
        method::INTERRUPT => Route::Post("/interrupt"),
        method::CHECKPOINT => Route::Post("/checkpoint"),
        method::RESTORE => Route::Post("/restore"),
        method::HINT => Route::Post("/hint"),
        method::COMPLETE => Route::Post("/complete"),
        method::FORK => Route::Post("/fork"),
        method::INFO => Route::Get(""),
        method::CHECKPOINTS => Route::Get("/checkpoints"),
        method::CLOSE => Route::Delete,
        _ => return None,
    })
}

/// A call's params as the holder's route takes them in its body: without `session_id` (the
/// path names the session) and with `owner` the caller's scope, serialised from the params
/// the caller sent without copying them.
struct Body<'a> {
    params: &'a Map<String, Value>,
    owner: Option<&'a str>,
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.params {
            if key != "session_id" && key != "owner" {
                map.serialize_entry(key, value)?;
            }
        }
        if let Some(owner) = self.owner {
            map.serialize_entry("owner", owner)?;
        }
        map.end()
    }
}

/// Where a forward ended when it has no answer for the caller.
#[derive(Debug)]
pub enum Unanswered {
    /// The method has no route, or the params name no session.
    NotForwarded,
    /// The holder could not be reached: nothing was sent.
    Unreachable,
}

/// What a forward came back with.
pub type Forwarded = Result<Result<Box<RawValue>, RpcError>, Unanswered>;

/// Sends requests on to the nodes that hold their sessions.
pub struct Forwarder {
    client: reqwest::Client,
    node_id: String,
    token: Option<String>,
    holders: Holders,
}

impl Forwarder {
    /// A forwarder for the node `node_id`, which presents `token` (the admin token) to the
    /// others. Its one client keeps connections to the other nodes open between forwards,
    /// with Nagle's algorithm off so that a small request leaves at once.
    pub fn new(node_id: &str, token: Option<String>) -> Result<Forwarder, ClusterError> {
        let client = crate::http_client::builder()
            .map_err(|err| ClusterError::Unreachable(format!("set up TLS: {err}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .tcp_nodelay(true)
            .build()
            .map_err(|err| ClusterError::Unreachable(format!("build an HTTP client: {err}")))?;
        Ok(Forwarder {
            client,
            node_id: node_id.to_owned(),
            token,
            holders: Holders::default(),
        })
    }

    /// Whether `method` can be forwarded.
    pub fn forwards(method: &str) -> bool {
        route(method).is_some()
    }

    /// The nodes that answered for sessions before.
    pub fn holders(&self) -> &Holders {
        &self.holders
    }

    /// Sends `method` with `params` (which name the session in `session_id`) for `owner` to
    /// the node at `url`: its result or its error. A streaming execution relays the holder's
    /// notifications to `out` as they come.
    pub async fn forward(
        &self,
        url: &str,
        method: &str,
        params: &Map<String, Value>,
        owner: Option<&str>,
        out: &Outbound,
    ) -> Forwarded {
        let route = route(method).ok_or(Unanswered::NotForwarded)?;
        let Some(Value::String(session_id)) = params.get("session_id") else {
            return Err(Unanswered::NotForwarded);
        };
        let base = format!(
            "{}/v1/sessions/{}",
            url.trim_end_matches('/'),
            percent_encode(session_id)
        );
        // A caller that cannot take notifications (plain HTTP) gets the plain answer.
        let streams = method == method::EXECUTE
            && params.get("stream") == Some(&Value::Bool(true))
            && !out.is_closed();
        let mut request = match route {
            Route::Post(path) => self
                .client
                .post(format!("{base}{path}"))
                .json(&Body { params, owner }),
            Route::Get(path) => self
                .client
                .get(format!("{base}{path}{}", owner_query(owner, '?'))),
            Route::Delete => {
                let checkpoint = params.get("checkpoint") == Some(&Value::Bool(true));
                let query = format!("?checkpoint={checkpoint}{}", owner_query(owner, '&'));
                self.client
                    .request(Method::DELETE, format!("{base}{query}"))
            }
        };
        request = self.request(request);
        if streams {
            request = request.header(ACCEPT, NDJSON);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) if err.is_connect() => {
                tracing::warn!(url = %base, error = %err, "cannot reach the session's holder");
                return Err(Unanswered::Unreachable);
            }
            // The request may have reached the holder: running it again could run it twice.
            Err(err) => return Ok(Err(broken(&base, err))),
        };
        let status = response.status();
        if streams && status.is_success() {
            return Ok(self.relay(response, &base, owner, out).await);
        }
        let body = match response.text().await {
            Ok(body) => body,
            Err(err) => return Ok(Err(broken(&base, err))),
        };
        if status.is_success() {
            return Ok(RawValue::from_string(body).map_err(|err| not_json(&base, err)));
        }
        #[derive(serde::Deserialize)]
        struct Failed {
            error: RpcError,
        }
        Ok(Err(match serde_json::from_str::<Failed>(&body) {
            Ok(failed) => failed.error,
            Err(_) => RpcError::new(code::ENGINE_ERROR, format!("{base} answered HTTP {status}")),
        }))
    }

    /// Relays the streamed answer `response` of the holder (its session route `base`) to
    /// `out`, line by line, until its last line: the result or the error.
    async fn relay(
        &self,
        mut response: reqwest::Response,
        base: &str,
        owner: Option<&str>,
        out: &Outbound,
    ) -> Result<Box<RawValue>, RpcError> {
        let mut pending: Vec<u8> = Vec::new();
        // How much of `pending` holds no line end: a long line that comes in many chunks is
        // scanned once, not once per chunk.
        let mut scanned = 0;
        let mut unanswered = UnansweredInput(None);
        loop {
            let chunk = tokio::select! {
                chunk = response.chunk() => chunk,
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
            pending.extend_from_slice(&chunk);
            while let Some(found) = pending[scanned..].iter().position(|&byte| byte == b'\n') {
                let line: Vec<u8> = pending.drain(..=scanned + found).collect();
                scanned = 0;
                let line = String::from_utf8(line).map_err(|err| not_json(base, err))?;
                let line = line.trim_end();
                let parsed: Line = serde_json::from_str(line).map_err(|err| not_json(base, err))?;
                match (parsed.method, parsed.result, parsed.error) {
                    (Some(method), _, _) if method == notification::INPUT_REQUEST => {
                        let asked = parsed.params.as_deref().map(RawValue::get);
                        let asked = serde_json::from_str::<InputNote>(asked.unwrap_or("null"))
                            .map_err(|err| not_json(base, err))?;
                        unanswered.0 = Some(self.end_of_input(base, &asked.execution_id, owner));
                    }
                    (Some(_), _, _) => {}
                    (None, result, error) => {
                        unanswered.0 = None;
                        return match (result, error) {
                            (Some(result), _) => Ok(result),
                            (None, Some(error)) => Err(error),
                            (None, None) => Err(not_json(base, "neither result nor error")),
                        };
                    }
                }
                if !out.send(line.to_owned()).await {
                    return Err(caller_gone());
                }
            }
            scanned = pending.len();
        }
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

    /// `request` as a forward from this node: marked, with the admin token.
    fn request(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = request.header(FORWARDED_BY, &self.node_id);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}

/// The `null` answer to the last `input()` a relay passed on, sent when the relay ends before
/// the result: the caller who would have answered it is gone, so `input()` raises `EOFError`
/// now rather than at the input timeout. A relay may end by being dropped (its caller's
/// connection closed), so this is sent from `drop`, on a task of its own.
struct UnansweredInput(Option<reqwest::RequestBuilder>);

impl Drop for UnansweredInput {
    fn drop(&mut self) {
        let Some(request) = self.0.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            match request.send().await {
                Ok(response) if response.status().is_success() => {}
                // No input() waits any more: it was answered, or the execution ended.
                Ok(response) => tracing::debug!(status = %response.status(), "no EOF input taken"),
                Err(err) => tracing::debug!(error = %err, "cannot send an EOF input"),
            }
        });
    }
}

/// One line of a streamed answer: a notification to relay (`method`), or the last line
/// (`result` or `error`).
#[derive(serde::Deserialize)]
struct Line {
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

/// `owner` as a query parameter after `sep`; nothing without one.
fn owner_query(owner: Option<&str>, sep: char) -> String {
    owner.map_or_else(String::new, |owner| {
        format!("{sep}owner={}", percent_encode(owner))
    })
}

/// The answer of a relay whose caller went away: it has nowhere to go.
fn caller_gone() -> RpcError {
    RpcError::new(code::ENGINE_ERROR, "the caller went away")
}

/// The error of an answer from `base` that broke off.
fn broken(base: &str, err: reqwest::Error) -> RpcError {
    RpcError::new(
        code::ENGINE_ERROR,
        format!("the answer of {base} broke off: {err}"),
    )
}

/// The error of an answer from `base` that is not the JSON it should be.
fn not_json(base: &str, err: impl std::fmt::Display) -> RpcError {
    RpcError::new(
        code::ENGINE_ERROR,
        format!("the answer of {base} is not JSON: {err}"),
    )
}

/// The node that last answered for each session, by the caller's owner scope and the
/// session's key: where the next request for it goes first. A guess, never the truth: the
/// holder still checks its lease and the owner, and an answer that says the guess is stale
/// (the session held elsewhere, unknown there, the holder draining or unreachable) makes the
/// caller forget it and ask the store.
#[derive(Default)]
pub struct Holders {
    known: Mutex<HashMap<(Option<String>, String), String>>,
}

impl Holders {
    /// The URL of the node that answered for `key` in `owner`'s scope last.
    pub fn get(&self, owner: Option<&str>, key: &str) -> Option<String> {
        let known = self.lock();
        known
            .get(&(owner.map(str::to_owned), key.to_owned()))
            .cloned()
    }

    /// Notes that the node at `url` answered for `key` in `owner`'s scope.
    pub fn remember(&self, owner: Option<&str>, key: &str, url: &str) {
        let mut known = self.lock();
        if known.len() >= MAX_HOLDERS {
            known.clear();
        }
        known.insert((owner.map(str::to_owned), key.to_owned()), url.to_owned());
    }

    /// Forgets where `key` is, in every scope.
    pub fn forget(&self, key: &str) {
        self.lock().retain(|(_, known), _| known != key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Option<String>, String), String>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `id` as one path segment: every byte but `[A-Za-z0-9_~-]` percent-encoded (dots too, so
/// that no id reads as `.` or `..`).
fn percent_encode(id: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || b"_~-".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_is_one_path_segment() {
        assert_eq!(percent_encode("s-1a2b-3"), "s-1a2b-3");
        assert_eq!(percent_encode("../x/y?z"), "%2E%2E%2Fx%2Fy%3Fz");
    }

    #[test]
    fn session_methods_are_forwarded_and_others_are_not() {
        assert!(Forwarder::forwards("session.execute"));
        assert!(Forwarder::forwards("session.info"));
        assert!(Forwarder::forwards("session.close"));
        assert!(!Forwarder::forwards("session.create"));
        assert!(!Forwarder::forwards("session.list"));
        assert!(!Forwarder::forwards("cluster.status"));
    }

    #[test]
    fn the_body_drops_the_session_and_names_the_callers_owner_only() {
        let params = serde_json::json!({"session_id": "s-1", "owner": "mallory", "code": "x"});
        let params = params.as_object().unwrap();
        let body = |owner| serde_json::to_value(Body { params, owner }).unwrap();
        assert_eq!(
            body(Some("alice")),
            serde_json::json!({"code": "x", "owner": "alice"})
        );
        assert_eq!(body(None), serde_json::json!({"code": "x"}));
    }

    #[test]
    fn a_streamed_line_is_a_note_or_the_last_line() {
        let note = r#"{"jsonrpc":"2.0","method":"session.output","params":{"data":"a"}}"#;
        let note: Line = serde_json::from_str(note).unwrap();
        assert_eq!(note.method.as_deref(), Some("session.output"));
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
    fn holders_are_remembered_per_scope_and_forgotten_per_session() {
        let holders = Holders::default();
        holders.remember(Some("alice"), "s-1", "http://a");
        assert_eq!(
            holders.get(Some("alice"), "s-1").as_deref(),
            Some("http://a")
        );
        assert_eq!(holders.get(Some("bob"), "s-1"), None);
        assert_eq!(holders.get(None, "s-1"), None);
        holders.forget("s-1");
        assert_eq!(holders.get(Some("alice"), "s-1"), None);
    }
}
