//! Forwarding between two real nodes of one real PostgreSQL (docs/cluster.md, Forwarding):
//! a streaming execution sent to the node that does not hold its session streams its output
//! and its `input()` requests through it, over the socket and the WebSocket; the caller
//! answers `input()` through that node; a caller that leaves mid-stream leaves nothing
//! behind; the other session methods reach the holder; and an owner's token never reaches
//! another owner's session through either node.

use crate::cluster::{advertised_node_config, execute, free_port, metric};
use crate::common;
use crate::common::postgres;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use awc::ws;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tempfile::TempDir;

use common::{bearer_client, http_get, Conn, Daemon};

pub(crate) const ADMIN: &str = "admin-secret-token";
pub(crate) const ALICE: &str = "alice-secret-token";
pub(crate) const BOB: &str = "bob-secret-token";

/// Two nodes, `node-a` and `node-b`, that reach each other over HTTP on loopback, with the
/// admin token and a token each for alice and bob.
pub(crate) struct Pair {
    nodes: Vec<Daemon>,
    ports: Vec<u16>,
    _homes: TempDir,
}

impl Pair {
    pub(crate) async fn start(db: &postgres::Database) -> Pair {
        let homes = tempfile::tempdir().expect("temp dir");
        let mut tokens = String::new();
        for (owner, token) in [("alice", ALICE), ("bob", BOB)] {
            let file = homes.path().join(format!("{owner}.token"));
            std::fs::write(&file, token).expect("write a token file");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .expect("chmod a token file");
            tokens.push_str(&format!(
                "[[server.tokens]]\nowner = \"{owner}\"\ntoken_file = \"{}\"\n\n",
                file.display()
            ));
        }
        let (mut nodes, mut ports) = (Vec::new(), Vec::new());
        for id in ["node-a", "node-b"] {
            let home = homes.path().join(id);
            let port = free_port();
            let addr = format!("127.0.0.1:{port}");
            let config = advertised_node_config(&home, db, id, &format!("http://{addr}"));
            let mut text = std::fs::read_to_string(&config).expect("the node's config");
            text.push_str(&format!("[server]\ntoken = \"{ADMIN}\"\n\n{tokens}"));
            std::fs::write(&config, text).expect("write the node's config");
            let args = ["--config", config.to_str().unwrap(), "--http", &addr];
            nodes.push(Daemon::start_in(&home, &args, &[]).await);
            ports.push(port);
        }
        Pair {
            nodes,
            ports,
            _homes: homes,
        }
    }

    pub(crate) fn holder(&self) -> &Daemon {
        &self.nodes[0]
    }

    pub(crate) fn other(&self) -> &Daemon {
        &self.nodes[1]
    }

    /// A new session of alice's on `node-a`.
    async fn alices_session(&self) -> String {
        let mut conn = self.holder().connect().await;
        let created = conn.call("session.create", json!({"owner": "alice"})).await;
        created["session_id"].as_str().expect("an id").to_owned()
    }

    /// `path` of node `index`'s HTTP API.
    pub(crate) fn url(&self, index: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.ports[index])
    }
}

/// The `data` of the `session.output` notifications among `messages`, in order, joined
/// (a line may come in more than one chunk).
pub(crate) fn output(messages: &[Value]) -> String {
    messages
        .iter()
        .filter(|m| m["method"] == "session.output")
        .filter_map(|m| m["params"]["data"].as_str())
        .collect()
}

/// Reads from `conn` until the notification `method`; the messages before it and it.
async fn read_until(conn: &mut Conn, method: &str) -> (Vec<Value>, Value) {
    let mut before = Vec::new();
    loop {
        let message = conn.read().await.expect("the node closed the connection");
        if message["method"] == method {
            return (before, message);
        }
        before.push(message);
    }
}

#[actix_rt::test]
async fn a_streaming_execution_through_another_node_streams_its_output_on_the_socket() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = pair.alices_session().await;

    let mut conn = pair.other().connect().await;
    let code = "print('first', flush=True)\nimport time\ntime.sleep(0.3)\nprint('second')";
    let params = json!({"session_id": session, "owner": "alice", "code": code, "stream": true});
    let (notes, response) = conn.request("session.execute", params).await;
    assert_eq!(output(&notes), "first\nsecond\n", "{notes:?}");
    for note in &notes {
        assert_eq!(note["params"]["session_id"], session.as_str(), "{note}");
    }
    let result = &response["result"];
    assert_eq!(result["status"], "ok", "{response}");
    assert_eq!(result["node"], "node-a", "the holder ran it: {response}");
    assert_eq!(result["stdout"], "first\nsecond\n", "echoed: {response}");

    // stream_echo: false leaves the streamed bytes out of the relayed result.
    let params = json!({"session_id": session, "owner": "alice", "code": "print('once')",
        "stream": true, "stream_echo": false});
    let (notes, response) = conn.request("session.execute", params).await;
    assert_eq!(output(&notes), "once\n", "{notes:?}");
    assert_eq!(response["result"]["stdout"], "", "{response}");

    // session.interrupt through node B stops the execution node A runs for it.
    let code = "print('going', flush=True)\nimport time\ntime.sleep(120)";
    conn.send(
        &json!({"jsonrpc": "2.0", "id": 10, "method": "session.execute",
        "params": {"session_id": session, "owner": "alice", "code": code, "stream": true}}),
    )
    .await;
    let (_, going) = read_until(&mut conn, "session.output").await;
    let going = going["params"]["data"].as_str().expect("text");
    assert!(going.starts_with("going"), "{going}");
    conn.send(
        &json!({"jsonrpc": "2.0", "id": 11, "method": "session.interrupt",
        "params": {"session_id": session, "owner": "alice"}}),
    )
    .await;
    let (mut stopped, mut interrupted) = (None, None);
    while stopped.is_none() || interrupted.is_none() {
        let message = conn.read().await.expect("the node answers");
        match message["id"].as_i64() {
            Some(10) => stopped = Some(message),
            Some(11) => interrupted = Some(message),
            _ => {}
        }
    }
    let (stopped, interrupted) = (stopped.unwrap(), interrupted.unwrap());
    assert_eq!(interrupted["result"]["interrupted"], true, "{interrupted}");
    assert_eq!(stopped["result"]["status"], "interrupted", "{stopped}");

    // Plain HTTP cannot take notifications: the whole output arrives in the result.
    let (status, body) = post(
        &pair,
        1,
        &session,
        "/execute",
        ADMIN,
        json!({
        "owner": "alice", "code": "print('whole')", "stream": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "whole\n", "{body}");
}

/// What a client reads after it answered an `input()`: the answer to its `session.input`
/// (id 2) and to the execution (id 1), in either order (the input's reaches the holder first,
/// but its answer travels back beside the execution's last output), and the notifications.
#[derive(Default)]
struct AfterInput {
    execution: Option<Value>,
    input: Option<Value>,
    notes: Vec<Value>,
}

impl AfterInput {
    /// Takes one message; true once both answers are in.
    fn take(&mut self, message: Value) -> bool {
        match message["id"].as_i64() {
            Some(1) => self.execution = Some(message),
            Some(2) => self.input = Some(message),
            _ => self.notes.push(message),
        }
        self.execution.is_some() && self.input.is_some()
    }

    /// The execution's answer and the notifications, once the input was taken (`{}`).
    fn answered(self) -> (Value, Vec<Value>) {
        let input = self.input.expect("session.input answered");
        assert_eq!(input["result"], json!({}), "{input}");
        (self.execution.expect("the execution answered"), self.notes)
    }
}

#[tokio::test]
async fn input_through_another_node_is_answered_by_its_client() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = pair.alices_session().await;

    let mut conn = pair.other().connect().await;
    let code = "print('asking', flush=True)\nname = input('who? ')\nprint('hi', name)";
    conn.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute",
        "params": {"session_id": session, "owner": "alice", "code": code, "stream": true}}),
    )
    .await;
    // The execution waits in input() until the client answers: what came before it arrived
    // while it ran, not with its result.
    let (before, asked) = read_until(&mut conn, "session.input_request").await;
    assert_eq!(output(&before), "asking\n", "{before:?}");
    assert_eq!(asked["params"]["prompt"], "who? ", "{asked}");
    let execution = asked["params"]["execution_id"].clone();
    conn.send(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "session.input",
        "params": {"session_id": session, "owner": "alice", "execution_id": execution,
            "value": "ada"}}),
    )
    .await;
    let mut after = AfterInput::default();
    while !after.take(conn.read().await.expect("the node answers")) {}
    let (response, rest) = after.answered();
    assert_eq!(output(&rest), "hi ada\n", "{rest:?}");
    assert_eq!(response["result"]["status"], "ok", "{response}");
    assert_eq!(response["result"]["execution_id"], execution, "{response}");
}

/// A WebSocket to `node`'s route for `session`, with `token`.
pub(crate) async fn websocket(
    pair: &Pair,
    node: usize,
    session: &str,
    token: &str,
) -> Result<
    impl futures::Sink<ws::Message>
        + futures::Stream<Item = Result<ws::Frame, awc::error::WsProtocolError>>
        + Unpin,
    awc::error::WsClientError,
> {
    let url = pair.url(node, &format!("/v1/sessions/{session}/ws"));
    bearer_client(token)
        .ws(url)
        .connect()
        .await
        .map(|(_, socket)| socket)
}

/// The next JSON text message of a WebSocket.
pub(crate) async fn receive(
    socket: &mut (impl futures::Stream<Item = Result<ws::Frame, awc::error::WsProtocolError>> + Unpin),
) -> Value {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(60), socket.next())
            .await
            .expect("a message within 60 s")
            .expect("the socket is open")
            .expect("a valid frame");
        if let ws::Frame::Text(text) = frame {
            return serde_json::from_slice(&text).expect("JSON");
        }
    }
}

#[actix_rt::test]
async fn the_websocket_of_another_node_streams_and_takes_input() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = pair.alices_session().await;

    let mut socket = websocket(&pair, 1, &session, ALICE)
        .await
        .expect("connects");
    let code = "print('first', flush=True)\nname = input('who? ')\nprint('hi', name)";
    let execute = json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute",
        "params": {"session_id": session, "code": code, "stream": true}});
    let _ = socket
        .send(ws::Message::Text(execute.to_string().into()))
        .await;
    // The execution waits in input() until the client answers: what came before it arrived
    // while it ran.
    let mut before = Vec::new();
    let asked = loop {
        let message = receive(&mut socket).await;
        if message["method"] == "session.input_request" {
            break message;
        }
        before.push(message);
    };
    assert_eq!(output(&before), "first\n", "{before:?}");
    let input = json!({"jsonrpc": "2.0", "id": 2, "method": "session.input",
        "params": {"session_id": session, "execution_id": asked["params"]["execution_id"],
            "value": "ada"}});
    let _ = socket
        .send(ws::Message::Text(input.to_string().into()))
        .await;
    let mut after = AfterInput::default();
    while !after.take(receive(&mut socket).await) {}
    let (response, seen) = after.answered();
    assert_eq!(output(&seen), "hi ada\n", "{seen:?}");
    assert_eq!(response["result"]["node"], "node-a", "{response}");
    assert_eq!(
        response["result"]["stdout"], "first\nhi ada\n",
        "{response}"
    );

    // The WebSocket is pinned to its session, forwarded or not.
    let other = json!({"jsonrpc": "2.0", "id": 3, "method": "session.info",
        "params": {"session_id": "s-someone-else"}});
    let _ = socket
        .send(ws::Message::Text(other.to_string().into()))
        .await;
    let refused = receive(&mut socket).await;
    assert_eq!(refused["id"], 3, "{refused}");
    assert!(refused["error"]["code"].is_i64(), "{refused}");
}

/// What `answer` comes to, within 20 s: the bound of a request that waits for nothing.
pub(crate) async fn soon<T>(answer: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), answer)
        .await
        .expect("answered within 20 s")
}

#[actix_rt::test]
async fn a_caller_that_leaves_mid_stream_leaves_no_relay_behind() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = pair.alices_session().await;
    let waits = "input('never answered')";

    // On the socket: the caller goes while the execution waits in input().
    let mut conn = pair.other().connect().await;
    conn.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute",
        "params": {"session_id": session, "owner": "alice", "code": waits, "stream": true}}),
    )
    .await;
    read_until(&mut conn, "session.input_request").await;
    drop(conn);
    // input() raised EOFError at once, not after the input timeout (300 s): the session is
    // free for the next request well within the bound.
    let next = soon(execute(pair.other(), &session, "alice", "1 + 1")).await;
    assert_eq!(next["result"]["result"]["repr"], "2", "{next}");

    // On the WebSocket, whose connection ends the relay by dropping it.
    let mut socket = websocket(&pair, 1, &session, ALICE)
        .await
        .expect("connects");
    let execute_ws = json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute",
        "params": {"session_id": session, "code": waits, "stream": true}});
    let _ = socket
        .send(ws::Message::Text(execute_ws.to_string().into()))
        .await;
    loop {
        let message = receive(&mut socket).await;
        if message["method"] == "session.input_request" {
            break;
        }
    }
    drop(socket);
    let next = soon(execute(pair.other(), &session, "alice", "2 + 2")).await;
    assert_eq!(next["result"]["result"]["repr"], "4", "{next}");
    let on_holder = execute(pair.holder(), &session, "alice", "3 + 3").await;
    assert_eq!(on_holder["result"]["result"]["repr"], "6", "{on_holder}");
}

/// A POST of `body` to `path` of `session` on node `node` with `token`: status and body.
async fn post(
    pair: &Pair,
    node: usize,
    session: &str,
    path: &str,
    token: &str,
    body: Value,
) -> (u16, Value) {
    let url = pair.url(node, &format!("/v1/sessions/{session}{path}"));
    let mut response = bearer_client(token)
        .post(url)
        .send_json(&body)
        .await
        .expect("the node answers");
    let json = response.json::<Value>().limit(1 << 24).await.expect("JSON");
    (response.status().as_u16(), json)
}

/// A request with no body: status and body.
async fn bodiless(pair: &Pair, node: usize, method: &str, path: &str, token: &str) -> (u16, Value) {
    let request = bearer_client(token).request(
        awc::http::Method::from_bytes(method.as_bytes()).unwrap(),
        pair.url(node, path),
    );
    let mut response = request.send().await.expect("the node answers");
    let json = response.json::<Value>().await.expect("JSON");
    (response.status().as_u16(), json)
}

#[actix_rt::test]
async fn an_owners_token_reaches_no_other_owners_session_through_any_node() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = pair.alices_session().await;
    // Alice uses it through node B first, so node B knows where it is.
    let (status, ran) = post(
        &pair,
        1,
        &session,
        "/execute",
        ALICE,
        json!({"code": "secret = 1"}),
    )
    .await;
    assert_eq!((status, &ran["node"]), (200, &json!("node-a")), "{ran}");

    // Bob, through node B, by every route: unknown, like a missing session.
    let tries = [
        ("/execute", json!({"code": "secret"}), (404, -32001)),
        (
            "/execute",
            json!({"code": "secret", "owner": "alice"}),
            (401, -32007),
        ),
        (
            "/input",
            json!({"execution_id": "e-1", "value": "x"}),
            (404, -32001),
        ),
        ("/fork", json!({}), (404, -32001)),
    ];
    for (path, body, (status, code)) in tries {
        let (got, answer) = post(&pair, 1, &session, path, BOB, body).await;
        assert_eq!(
            (got, &answer["error"]["code"]),
            (status, &json!(code)),
            "{path}: {answer}"
        );
    }
    for (method, path) in [
        ("GET", format!("/v1/sessions/{session}")),
        ("GET", format!("/v1/sessions/{session}/checkpoints")),
        ("DELETE", format!("/v1/sessions/{session}")),
    ] {
        let (status, body) = bodiless(&pair, 1, method, &path, BOB).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    let streamed = bearer_client(BOB)
        .post(pair.url(1, &format!("/v1/sessions/{session}/execute")))
        .insert_header(("accept", "application/x-ndjson"))
        .send_json(&json!({"code": "secret"}))
        .await
        .expect("the node answers")
        .body()
        .await
        .expect("the streamed body");
    let lines: Vec<Value> = (String::from_utf8_lossy(&streamed).lines())
        .map(|line| serde_json::from_str(line).expect("JSON lines"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "nothing of alice's streams to bob: {lines:?}"
    );
    assert_eq!(lines[0]["error"]["code"], -32001, "{lines:?}");
    let refused = websocket(&pair, 1, &session, BOB).await;
    assert!(
        refused.is_err(),
        "bob's WebSocket to alice's session is refused"
    );
    // Bob cannot pass for a node: the forwarding header counts only with the admin token.
    let direct = bearer_client(BOB)
        .post(pair.url(0, &format!("/v1/sessions/{session}/execute")))
        .insert_header(("x-pyvisor-forwarded-by", "node-b"))
        .send_json(&json!({"code": "secret", "owner": "alice"}))
        .await
        .expect("the node answers");
    assert_eq!(direct.status().as_u16(), 401);

    // Alice's session is as she left it, and bob's tries ran nothing in it.
    let (status, ran) = post(
        &pair,
        1,
        &session,
        "/execute",
        ALICE,
        json!({"code": "secret"}),
    )
    .await;
    assert_eq!(
        (status, &ran["result"]["repr"]),
        (200, &json!("1")),
        "{ran}"
    );
    assert_eq!(ran["execution_count"], 2, "{ran}");
}

#[tokio::test]
async fn every_session_method_reaches_the_holder_through_another_node() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = pair.alices_session().await;
    let mut conn = pair.other().connect().await;
    let on = |extra: Value| {
        let mut params = json!({"session_id": session, "owner": "alice"});
        params
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        params
    };
    let ran = execute(pair.other(), &session, "alice", "x = 7").await;
    assert_eq!(ran["result"]["status"], "ok", "{ran}");

    let info = conn.call("session.info", on(json!({}))).await;
    assert_eq!(info["session_id"], session.as_str(), "{info}");
    assert_eq!(info["owner"], "alice", "{info}");
    assert_eq!(info["node"], "node-a", "the holder answered: {info}");
    let taken = conn.call("session.checkpoint", on(json!({}))).await;
    let listed = conn.call("session.checkpoints", on(json!({}))).await;
    assert_eq!(
        listed[0]["checkpoint_id"], taken["checkpoint_id"],
        "{listed}"
    );
    let forked = conn.call("session.fork", on(json!({"count": 1}))).await;
    let clone = forked["sessions"][0]["session_id"]
        .as_str()
        .expect("a clone")
        .to_owned();
    let in_clone = execute(pair.holder(), &clone, "alice", "x").await;
    assert_eq!(
        in_clone["result"]["result"]["repr"], "7",
        "the clone is on node A: {in_clone}"
    );

    conn.call("session.close", on(json!({}))).await;
    let gone = conn.error_code("session.info", on(json!({}))).await;
    assert_eq!(gone, -32001, "closed through node B");
    let mut on_holder = pair.holder().connect().await;
    let gone = on_holder.error_code("session.info", on(json!({}))).await;
    assert_eq!(gone, -32001, "closed on node A");

    let (_, metrics) = http_get(pair.ports[1], "/metrics", Some(ADMIN)).await;
    // execute, info, checkpoint, checkpoints, fork and close; the info after the close was
    // answered by node B from the store.
    let forwarded = metric(&metrics, "pyvisor_cluster_forwarded_total");
    assert_eq!(forwarded, 6.0, "{metrics}");
}
