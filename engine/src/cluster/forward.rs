//! Forwarding: a request for a session that another live node holds is sent on to that
//! node's HTTP API (its `advertise_url`), so that a client need not know which node holds a
//! session.
//!
//! The request goes to the session method's REST route (docs/protocol.md, HTTP) with the
//! admin token of `[server] token` (every node of a cluster shares it) and the owner the
//! caller is confined to, so the holder applies the same owner rule as the node that received
//! it. The header [`FORWARDED_BY`] marks it: the holder serves it or refuses it, and never
//! sends it on again. Plain HTTP carries no notifications: a forwarded execution's output
//! arrives whole in its result.

use std::time::Duration;

use reqwest::Method;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::errors::ClusterError;
use crate::rpc::{code, RpcError};

/// The header that marks a request another node sent on; its value is that node's id.
pub const FORWARDED_BY: &str = "x-pyvisor-forwarded-by";

/// The longest wait to connect to the holder; the request itself runs as long as the
/// holder's own limits let it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The REST route of a session method that can be forwarded: the HTTP method and the path
/// after `/v1/sessions/{id}`.
fn route(method: &str) -> Option<(Method, &'static str)> {
    let path = match method {
        "session.execute" => "/execute",
        "session.input" => "/input",
        "session.interrupt" => "/interrupt",
        "session.checkpoint" => "/checkpoint",
        "session.restore" => "/restore",
        "session.hint" => "/hint",
        "session.complete" => "/complete",
        _ => return None,
    };
    Some((Method::POST, path))
}

/// Sends requests on to the nodes that hold their sessions.
pub struct Forwarder {
    client: reqwest::Client,
    node_id: String,
    token: Option<String>,
}

impl Forwarder {
    /// A forwarder for the node `node_id`, which presents `token` (the admin token) to the
    /// others.
    pub fn new(node_id: &str, token: Option<String>) -> Result<Forwarder, ClusterError> {
        let client = crate::http_client::builder()
            .map_err(|err| ClusterError::Unreachable(format!("set up TLS: {err}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|err| ClusterError::Unreachable(format!("build an HTTP client: {err}")))?;
        Ok(Forwarder {
            client,
            node_id: node_id.to_owned(),
            token,
        })
    }

    /// Whether `method` can be forwarded.
    pub fn forwards(method: &str) -> bool {
        route(method).is_some()
    }

    /// Sends `method` with `params` (which name the session in `session_id`) for `owner` to
    /// the node at `url`: its result or its error. `None` when the method is not forwarded or
    /// the node cannot be reached, and the caller keeps its own answer.
    pub async fn forward(
        &self,
        url: &str,
        method: &str,
        mut params: Map<String, Value>,
        owner: Option<&str>,
    ) -> Option<Result<Box<RawValue>, RpcError>> {
        let (verb, path) = route(method)?;
        let session_id = match params.remove("session_id") {
            Some(Value::String(id)) => id,
            _ => return None,
        };
        params.remove("owner");
        if let Some(owner) = owner {
            params.insert("owner".into(), Value::String(owner.to_owned()));
        }
        let url = format!(
            "{}/v1/sessions/{}{path}",
            url.trim_end_matches('/'),
            percent_encode(&session_id)
        );
        let mut request = self
            .client
            .request(verb, &url)
            .header(FORWARDED_BY, &self.node_id)
            .json(&params);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => {
                tracing::warn!(%url, error = %err, "cannot forward to the session's holder");
                return None;
            }
        };
        let status = response.status();
        let body = match response.text().await {
            Ok(body) => body,
            Err(err) => {
                return Some(Err(RpcError::new(
                    code::ENGINE_ERROR,
                    format!("read the answer of {url}: {err}"),
                )))
            }
        };
        if status.is_success() {
            return Some(RawValue::from_string(body).map_err(|err| {
                RpcError::new(
                    code::ENGINE_ERROR,
                    format!("the answer of {url} is not JSON: {err}"),
                )
            }));
        }
        #[derive(serde::Deserialize)]
        struct Failed {
            error: RpcError,
        }
        Some(Err(match serde_json::from_str::<Failed>(&body) {
            Ok(failed) => failed.error,
            Err(_) => RpcError::new(code::ENGINE_ERROR, format!("{url} answered HTTP {status}")),
        }))
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
    fn only_methods_with_a_post_route_are_forwarded() {
        assert!(Forwarder::forwards("session.execute"));
        assert!(!Forwarder::forwards("session.create"));
        assert!(!Forwarder::forwards("cluster.status"));
    }
}
