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
//! An execution whose caller answers the server's requests (a socket or WebSocket connection,
//! which an `llm: "client"` session's LLM calls need) asks for the streamed response too,
//! streaming or not, with the header [`BRIDGE`]: the holder then sends its `bridge.llm`
//! requests and `bridge.cancel` notices as lines of it, and this node relays them to the
//! caller under ids of the caller's connection and brings the caller's answers back to the
//! holder (`relay`).
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
use crate::rpc::wire::method;
use crate::rpc::{code, Outbound, RpcError};

mod relay;

/// The header that marks a request another node sent on; its value is that node's id.
pub const FORWARDED_BY: &str = "x-pyvisor-forwarded-by";

/// The header of a forwarded execution whose caller answers the server's requests (a socket
/// or WebSocket connection): the holder sends its `bridge.llm` requests as lines of its
/// streamed answer, for this node to relay.
pub const BRIDGE: &str = "x-pyvisor-bridge";

/// The header of the holder's streamed answer to a [`BRIDGE`] request: the id that the
/// answers to its requests name ([`BridgeAnswer`]).
pub const BRIDGE_STREAM: &str = "x-pyvisor-bridge-stream";

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

/// What a forwarding node posts to the holder's `POST /v1/sessions/{id}/bridge`: the answer
/// of its client to one request of a bridged stream, `call_id` with `result` or `error`, or
/// `gone: true` when the client went away (every call of the stream fails).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeAnswer {
    /// The stream's id, from the holder's [`BRIDGE_STREAM`] header.
    pub stream: String,
    /// The holder's id of the request answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The client's result, whatever it is (`null` included).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub result: Option<Value>,
    /// The client's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
}

/// What a [`BridgeAnswer`] says.
#[derive(Debug, PartialEq)]
pub enum Bridged {
    /// The client's response to the request `call_id`.
    Answer {
        call_id: String,
        reply: crate::rpc::PeerReply,
    },
    /// The client went away.
    Gone,
}

impl BridgeAnswer {
    /// The answer that the caller of stream `stream` went away.
    pub fn gone(stream: &str) -> BridgeAnswer {
        BridgeAnswer {
            stream: stream.to_owned(),
            call_id: None,
            result: None,
            error: None,
            gone: true,
        }
    }

    /// The caller's `reply` to the request `call_id` of stream `stream`.
    pub fn reply(stream: &str, call_id: &str, reply: crate::rpc::PeerReply) -> BridgeAnswer {
        let (result, error) = match reply {
            Ok(result) => (Some(result), None),
            Err(error) => (None, Some(error)),
        };
        BridgeAnswer {
            stream: stream.to_owned(),
            call_id: Some(call_id.to_owned()),
            result,
            error,
            gone: false,
        }
    }

    /// The stream it is for and what it says; a message for an answer of no valid shape.
    pub fn into_reply(self) -> Result<(String, Bridged), String> {
        let bridged =
            match (self.call_id, self.result, self.error, self.gone) {
                (None, None, None, true) => Bridged::Gone,
                (Some(call_id), Some(result), None, false) => Bridged::Answer {
                    call_id,
                    reply: Ok(result),
                },
                (Some(call_id), None, Some(error), false) => Bridged::Answer {
                    call_id,
                    reply: Err(error),
                },
                _ => return Err(
                    "a bridge answer is {stream, call_id, result} or {stream, call_id, error} or \
                     {stream, gone: true}"
                        .to_owned(),
                ),
            };
        Ok((self.stream, bridged))
    }
}

/// A field that is `Some` whenever it is present, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    serde::Deserialize::deserialize(deserializer).map(Some)
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
        let execute = method == method::EXECUTE;
        // A caller that cannot take notifications (plain HTTP) gets the plain answer.
        let streams =
            execute && params.get("stream") == Some(&Value::Bool(true)) && !out.is_closed();
        // A caller that answers the server's requests (a socket or WebSocket connection)
        // gets the holder's bridge.llm requests through this node, streamed or not.
        let bridged = execute && out.peer().is_open();
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
        if streams || bridged {
            request = request.header(ACCEPT, NDJSON);
        }
        if bridged {
            request = request.header(BRIDGE, "client");
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
        if status.is_success() && is_ndjson(&response) {
            return Ok(self.relay(response, &base, owner, out, streams).await);
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

    /// `request` as a forward from this node: marked, with the admin token.
    fn request(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = request.header(FORWARDED_BY, &self.node_id);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}

/// `owner` as a query parameter after `sep`; nothing without one.
fn owner_query(owner: Option<&str>, sep: char) -> String {
    owner.map_or_else(String::new, |owner| {
        format!("{sep}owner={}", percent_encode(owner))
    })
}

/// Whether `response` is a streamed answer.
fn is_ndjson(response: &reqwest::Response) -> bool {
    (response.headers().get(reqwest::header::CONTENT_TYPE))
        .and_then(|kind| kind.to_str().ok())
        .is_some_and(|kind| {
            kind.split(';')
                .next()
                .is_some_and(|kind| kind.trim() == NDJSON)
        })
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
