//! The HTTP side of a load test's target: a minimal HTTP/1.1 client of the daemon's JSON API
//! on loopback (plain HTTP, one connection per call), for one URL (a daemon, or HAProxy in
//! front of a cluster), for each node of a cluster the harness runs, or for the URLs of a
//! cluster that runs already.
//!
//! With several nodes, a session's calls go to the node that last answered for it (its
//! holder, as HAProxy's stick table would: by the node id a result names when the harness
//! knows the nodes' ids, else by the URL that answered), a new session's to the next node in
//! turn; through HAProxy, all go to HAProxy. In a cluster a call that certainly did not run is tried
//! again, as a client of a cluster does, for up to [`CLUSTER_RETRY`]: a refused connection
//! (the node is dead: the next node is tried), `421` (another node holds the session: the
//! next try goes to the `advertise_url` the answer names, as for the calls a node does not
//! forward, such as `DELETE`; or the holder is dead and its lease has not run out yet) and
//! `503` (no node ready behind HAProxy, or a node draining). A call cut off mid-way (its node
//! died under it) is not: it may have run, and its error is the caller's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a cluster call that certainly did not run is tried again: past any lease plus a
/// restore.
const CLUSTER_RETRY: Duration = Duration::from_secs(60);

/// The pause between two tries of a call.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A client of one daemon's HTTP API, or of a cluster's nodes.
pub struct Http {
    /// `host:port` of each node, or of the one URL (HAProxy's, in front of a cluster).
    authorities: Vec<String>,
    /// The node ids of `authorities`, when the harness runs them.
    node_ids: Vec<String>,
    token: Option<String>,
    /// Whether calls that did not run are tried again (a cluster).
    retry: bool,
    /// Session id → the id of the node that last answered for it.
    holders: Mutex<HashMap<String, String>>,
    /// Session id → the index in `authorities` that last answered for it, for nodes whose
    /// ids are not known (a cluster given by its URLs).
    homes: Mutex<HashMap<String, usize>>,
    /// The node of the next new session.
    next: AtomicUsize,
}

/// Why one try of a call failed.
enum Failure {
    /// Nothing ran: another try may succeed, at `redirect` (`host:port`) when the answer
    /// named where.
    NotRun {
        kind: String,
        redirect: Option<String>,
    },
    /// It may have run, or the answer is final.
    Final(String),
}

impl Failure {
    fn not_run(kind: String) -> Failure {
        Failure::NotRun {
            kind,
            redirect: None,
        }
    }

    fn kind(self) -> String {
        match self {
            Failure::NotRun { kind, .. } | Failure::Final(kind) => kind,
        }
    }
}

impl Http {
    /// A client of the daemon at `url` (`http://host:port`).
    pub fn new(url: &str, token: Option<String>) -> Result<Http, String> {
        Ok(Http {
            authorities: vec![host_port(url)?],
            node_ids: Vec::new(),
            token,
            retry: false,
            holders: Mutex::default(),
            homes: Mutex::default(),
            next: AtomicUsize::new(0),
        })
    }

    /// A client of a cluster that runs already, at `urls` (its nodes', or a load balancer's).
    pub fn urls(urls: &[String], token: Option<String>) -> Result<Http, String> {
        Ok(Http {
            authorities: urls
                .iter()
                .map(|url| host_port(url))
                .collect::<Result<_, _>>()?,
            node_ids: Vec::new(),
            token,
            retry: true,
            holders: Mutex::default(),
            homes: Mutex::default(),
            next: AtomicUsize::new(0),
        })
    }

    /// A client of a cluster: `nodes` are `(node id, url)` of each node, or, through a load
    /// balancer, `front` is its URL and `nodes` only name the nodes behind it.
    pub fn cluster(nodes: &[(String, String)], front: Option<&str>) -> Result<Http, String> {
        let authorities = match front {
            Some(url) => vec![host_port(url)?],
            None => nodes
                .iter()
                .map(|(_, url)| host_port(url))
                .collect::<Result<_, _>>()?,
        };
        Ok(Http {
            authorities,
            node_ids: nodes.iter().map(|(id, _)| id.clone()).collect(),
            token: None,
            retry: true,
            holders: Mutex::default(),
            homes: Mutex::default(),
            next: AtomicUsize::new(0),
        })
    }

    fn lock_holders(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.holders.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that `node` answered for `session`.
    pub fn answered(&self, session: &str, node: Option<&str>) {
        if let Some(node) = node {
            self.lock_holders()
                .insert(session.to_owned(), node.to_owned());
        }
    }

    /// The node that last answered for `session`, if known.
    pub fn holder(&self, session: &str) -> Option<String> {
        self.lock_holders().get(session).cloned()
    }

    /// Forgets `session` (closed).
    pub fn forget(&self, session: &str) {
        self.lock_holders().remove(session);
        self.lock_homes().remove(session);
    }

    fn lock_homes(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.homes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node a call of `path` goes to first: its session's holder, else the next in turn.
    fn route(&self, path: &str) -> usize {
        if self.authorities.len() == 1 {
            return 0;
        }
        let known = session_of(path).and_then(|session| {
            if self.node_ids.is_empty() {
                return self.lock_homes().get(session).copied();
            }
            let holder = self.holder(session)?;
            self.node_ids.iter().position(|id| *id == holder)
        });
        known.unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed) % self.authorities.len())
    }

    /// Notes that the node at `authority` answered `value` to a call of `path` (a session's,
    /// or the creation of one), for nodes known only by their URLs.
    fn answered_at(&self, path: &str, authority: &str, value: &Value) {
        if !self.node_ids.is_empty() || self.authorities.len() == 1 {
            return;
        }
        let created = (path == "/v1/sessions")
            .then(|| value["session_id"].as_str())
            .flatten();
        let index = self.authorities.iter().position(|a| a == authority);
        if let (Some(session), Some(index)) = (session_of(path).or(created), index) {
            self.lock_homes().insert(session.to_owned(), index);
        }
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        self.request("GET", path, None).await
    }

    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, String> {
        self.request("POST", path, Some(body)).await
    }

    /// `GET path`, tried once at the first URL: what a node (or HAProxy) says now.
    pub async fn get_once<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        let value =
            (self.once(&self.authorities[0], "GET", path, None).await).map_err(Failure::kind)?;
        typed(value)
    }

    pub async fn request<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + CLUSTER_RETRY;
        let mut index = self.route(path);
        // Where the last answer said to go instead, once.
        let mut redirected: Option<String> = None;
        loop {
            let authority = redirected.take();
            let authority = authority.as_deref().unwrap_or(&self.authorities[index]);
            match self.once(authority, method, path, body).await {
                Ok(value) => {
                    self.answered_at(path, authority, &value);
                    return typed(value);
                }
                Err(Failure::NotRun { kind, redirect })
                    if self.retry && Instant::now() < deadline =>
                {
                    // A dead node: the next one answers for its sessions once their leases
                    // run out. A live one that said "not yet": ask it (or where it says) again.
                    if kind.starts_with("connect") {
                        index = (index + 1) % self.authorities.len();
                    }
                    redirected = redirect;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(failure) => return Err(failure.kind()),
            }
        }
    }

    /// One try of a call to `authority`: the JSON of its answer.
    async fn once(
        &self,
        authority: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Type: \
             application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(token) = &self.token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|err| Failure::not_run(format!("connect: {err}")))?;
        let cut = |what: &str, err: std::io::Error| Failure::Final(format!("{what}: {err}"));
        stream
            .write_all(format!("{head}{body}").as_bytes())
            .await
            .map_err(|err| cut("write", err))?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|err| cut("read", err))?;
        let text = String::from_utf8_lossy(&response);
        let (head, rest) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| Failure::Final("truncated HTTP response".to_owned()))?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| Failure::Final("no HTTP status".to_owned()))?;
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_owned()
        };
        match status {
            200..=299 => serde_json::from_str(&body)
                .map_err(|err| Failure::Final(format!("bad JSON: {err}"))),
            421 => {
                let error: Value = serde_json::from_str(&body).unwrap_or_default();
                let redirect = error["error"]["data"]["advertise_url"]
                    .as_str()
                    .and_then(|url| host_port(url).ok());
                Err(Failure::NotRun {
                    kind: format!("http {status}"),
                    redirect,
                })
            }
            503 => Err(Failure::not_run(format!("http {status}"))),
            _ => Err(Failure::Final(format!("http {status}"))),
        }
    }
}

/// `value` as the type the caller expects.
fn typed<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|err| format!("bad JSON: {err}"))
}

/// The session a call of `path` is for, if any.
fn session_of(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/sessions/")
        .and_then(|rest| rest.split('/').next())
}

/// `host:port` of `url`.
fn host_port(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("the url {url:?} must start with http://"))?;
    let authority = rest.split('/').next().unwrap_or_default().to_owned();
    if authority.is_empty() {
        return Err(format!("the url {url:?} names no host"));
    }
    Ok(authority)
}

/// The body of a chunked HTTP response.
fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || after.len() < size {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    body
}
