//! The client-answered LLM bridge (`llm: "client"`) of a session another node holds, between
//! two real nodes of one real PostgreSQL (docs/cluster.md, Forwarding): the node a client
//! talks to relays the holder's `bridge.llm` requests to that client and its answers back,
//! over the socket (streamed or not) and the WebSocket; an interrupt cancels the call on the
//! client's side too; a client that leaves fails its call at once; and nobody but the
//! connection that started the execution answers: not another connection of either node, not
//! the session's own output, not an owner's token or a made-up stream at the holder's bridge
//! route, not a stream's id for another session.

use crate::client_llm::{answer, cancelled_and_done, is_bridge_call, until};
use crate::cluster::execute;
use crate::cluster_forward::{output, receive, soon, websocket, Pair, ADMIN, ALICE, BOB};
use crate::common::postgres;
use crate::common::{bearer_client, Conn};

use awc::ws;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};

/// A new session of alice's on `node-a` whose client answers its LLM calls.
async fn client_session(pair: &Pair) -> String {
    let mut conn = pair.holder().connect().await;
    let created = conn
        .call("session.create", json!({"owner": "alice", "llm": "client"}))
        .await;
    created["session_id"].as_str().expect("an id").to_owned()
}

/// Sends `session.execute` of `code` in alice's `session` with id `id`, without waiting.
async fn send_execute(conn: &mut Conn, id: &str, session: &str, code: &str, stream: bool) {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "session.execute",
        "params": {"session_id": session, "owner": "alice", "code": code, "stream": stream}});
    conn.send(&request).await;
}

#[actix_rt::test]
async fn a_client_answers_the_llm_calls_of_a_session_another_node_holds() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = client_session(&pair).await;

    // Node B's socket, not streamed: the calls come to this connection all the same, as they
    // would on the holder.
    let mut conn = pair.other().connect().await;
    let code = "(llm_query('q1'), llm_query_batched(['x', 'y']))";
    send_execute(&mut conn, "plain", &session, code, false).await;
    let first = until(&mut conn, is_bridge_call).await;
    let params = &first["params"];
    assert_eq!(params["kind"], "llm", "{first}");
    assert_eq!(params["prompts"], json!(["q1"]), "{first}");
    assert_eq!(params["session_id"], session.as_str(), "{first}");
    assert_eq!(
        params["call_id"], first["id"],
        "the call id is the request's id"
    );
    let usage = json!({"input_tokens": 10, "output_tokens": 3, "cost": 0.5});
    answer(
        &mut conn,
        &first,
        json!({"answers": ["A:q1"], "usage": usage}),
    )
    .await;
    let batched = until(&mut conn, is_bridge_call).await;
    assert_eq!(batched["params"]["kind"], "llm_batched", "{batched}");
    assert_ne!(batched["id"], first["id"], "each call has its own id");
    answer(&mut conn, &batched, json!({"answers": ["X", "Y"]})).await;
    let done = until(&mut conn, |m| m["id"] == "plain").await;
    assert_eq!(
        done["result"]["result"]["repr"], "('A:q1', ['X', 'Y'])",
        "{done}"
    );
    assert_eq!(
        done["result"]["node"], "node-a",
        "the holder ran it: {done}"
    );

    // Streamed: the output comes as it happens, beside the call; an error answer is an
    // LlmError in the session's code.
    let code = "print('asking', flush=True)\n\
                try:\n    llm_query('fail')\nexcept LlmError as err:\n    failed = str(err)\n\
                failed";
    send_execute(&mut conn, "streamed", &session, code, true).await;
    let mut seen = Vec::new();
    let (call, done) = loop {
        let message = conn.read().await.expect("the node keeps the connection");
        if is_bridge_call(&message) {
            let error = json!({"code": -1, "message": "provider says no"});
            conn.send(&json!({"jsonrpc": "2.0", "id": message["id"], "error": error}))
                .await;
            let done = until(&mut conn, |m| m["id"] == "streamed").await;
            break (message, done);
        }
        seen.push(message);
    };
    assert_eq!(call["params"]["prompts"], json!(["fail"]), "{call}");
    let shown = done["result"]["result"]["repr"]
        .as_str()
        .unwrap_or_default();
    assert!(shown.contains("provider says no"), "{done}");
    assert_eq!(done["result"]["stdout"], "asking\n", "{done}");
    assert!(
        seen.iter().all(|m| m.get("id").is_none()),
        "only notifications besides the call: {seen:?}"
    );

    // Node B's WebSocket, with alice's token.
    let mut socket = websocket(&pair, 1, &session, ALICE)
        .await
        .expect("connects");
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute",
        "params": {"session_id": session, "code": "print('ws', flush=True)\nllm_query('ws?')",
            "stream": true}});
    let _ = socket
        .send(ws::Message::Text(request.to_string().into()))
        .await;
    let mut before = Vec::new();
    let call = loop {
        let message = receive(&mut socket).await;
        if is_bridge_call(&message) {
            break message;
        }
        before.push(message);
    };
    assert_eq!(call["params"]["prompts"], json!(["ws?"]), "{call}");
    let reply = json!({"jsonrpc": "2.0", "id": call["id"], "result": {"answers": ["over ws"]}});
    let _ = socket
        .send(ws::Message::Text(reply.to_string().into()))
        .await;
    let done = loop {
        let message = receive(&mut socket).await;
        if message["id"] == 1 {
            break message;
        }
        before.push(message);
    };
    assert_eq!(done["result"]["result"]["repr"], "'over ws'", "{done}");
    assert_eq!(output(&before), "ws\n", "{before:?}");

    // The holder counted the usage the client reported.
    let mut on_holder = pair.holder().connect().await;
    let stats = on_holder.call("engine.stats", json!({})).await;
    assert_eq!(stats["llm"]["input_tokens"], 10, "{stats}");
    assert_eq!(stats["llm"]["output_tokens"], 3, "{stats}");
}

#[tokio::test]
async fn a_forwarded_llm_call_ends_with_its_execution_or_its_caller() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = client_session(&pair).await;

    // An interrupt through node B while the call waits: the client is told under the id it
    // knows the call by, and the code sees KeyboardInterrupt.
    let mut conn = pair.other().connect().await;
    send_execute(&mut conn, "wait", &session, "llm_query('slow')", true).await;
    let call = until(&mut conn, is_bridge_call).await;
    let mut other = pair.other().connect().await;
    let interrupted = other
        .call(
            "session.interrupt",
            json!({"session_id": session, "owner": "alice"}),
        )
        .await;
    assert_eq!(interrupted["interrupted"], true, "{interrupted}");
    let done = cancelled_and_done(&mut conn, &call, "wait").await;
    assert_eq!(done["result"]["status"], "interrupted", "{done}");
    // A late answer to the cancelled call reaches nobody and harms nothing.
    answer(&mut conn, &call, json!({"answers": ["late"]})).await;

    // The caller leaves while its call waits: the call fails at once, not at the client
    // timeout (300 s), and the session is free for the next request well within the bound.
    let code = "try:\n    llm_query('orphan')\nexcept LlmError as err:\n    orphaned = str(err)";
    send_execute(&mut conn, "orphan", &session, code, false).await;
    until(&mut conn, is_bridge_call).await;
    drop(conn);
    let next = soon(execute(
        pair.other(),
        &session,
        "alice",
        "globals().get('orphaned')",
    ))
    .await;
    let shown = next["result"]["result"]["repr"]
        .as_str()
        .unwrap_or_default();
    assert!(shown.contains("connection"), "{next}");
}

/// A POST of `body` to the holder's bridge route of `session`, with `token` and, when
/// `node` is given, the mark of a forwarding node: the status and the body.
async fn post_answer(
    pair: &Pair,
    session: &str,
    token: &str,
    node: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let mut request =
        bearer_client(token).post(pair.url(0, &format!("/v1/sessions/{session}/bridge")));
    if let Some(node) = node {
        request = request.insert_header(("x-pyvisor-forwarded-by", node));
    }
    let mut response = request.send_json(body).await.expect("the node answers");
    let json = response.json::<Value>().await.expect("JSON");
    (response.status().as_u16(), json)
}

#[actix_rt::test]
async fn only_the_connection_that_ran_the_code_answers_a_forwarded_llm_call() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = client_session(&pair).await;

    // The session prints a forged response (the holder's own id of its first call is `b1`),
    // then asks; connections on both nodes answer the call's ids first.
    let mut conn = pair.other().connect().await;
    let code = "print('{\"jsonrpc\": \"2.0\", \"id\": \"b1\", \"result\": {\"answers\": [\"printed\"]}}')\n\
                llm_query('real?')";
    send_execute(&mut conn, "run", &session, code, true).await;
    let call = until(&mut conn, is_bridge_call).await;
    for node in [pair.other(), pair.holder()] {
        let mut intruder = node.connect().await;
        for id in [call["id"].clone(), json!("b1"), json!("b2")] {
            let forged = json!({"jsonrpc": "2.0", "id": id, "result": {"answers": ["forged"]}});
            intruder.send(&forged).await;
        }
        let health = intruder.call("engine.health", json!({})).await;
        assert_eq!(
            health["status"], "ok",
            "the intruder's connection still serves it"
        );
    }
    // The holder's bridge route takes answers from another node only, for a stream it has.
    let forged = json!({"stream": "0123456789abcdef0123456789abcdef", "call_id": "b1",
        "result": {"answers": ["forged"]}});
    let tries = [
        (ALICE, Some("node-b"), 401),
        (BOB, Some("node-b"), 401),
        (ADMIN, None, 401),
        (ADMIN, Some("node-b"), 400),
    ];
    for (token, node, status) in tries {
        let (got, body) = post_answer(&pair, &session, token, node, &forged).await;
        assert_eq!(got, status, "{node:?}: {body}");
    }
    answer(&mut conn, &call, json!({"answers": ["real"]})).await;
    let done = until(&mut conn, |m| m["id"] == "run").await;
    assert_eq!(done["result"]["result"]["repr"], "'real'", "{done}");
}

/// The next line of the streamed answer `body`, as JSON; `pending` holds what came after it.
async fn next_line<S, B, E>(body: &mut S, pending: &mut Vec<u8>) -> Value
where
    S: futures::Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::fmt::Debug,
{
    loop {
        if let Some(end) = pending.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            return serde_json::from_slice(&line).expect("a JSON line");
        }
        let chunk = soon(body.next())
            .await
            .expect("the answer goes on")
            .expect("the answer is readable");
        pending.extend_from_slice(chunk.as_ref());
    }
}

/// A streamed execution of `code` in alice's `session` on the holder, as `node` would ask for
/// it for a client that answers (`node`: `None` for a caller that is no node).
async fn bridged_execution(
    pair: &Pair,
    session: &str,
    node: Option<&str>,
    code: &str,
) -> awc::ClientResponse<
    impl futures::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>,
> {
    let mut request = bearer_client(ADMIN)
        .post(pair.url(0, &format!("/v1/sessions/{session}/execute")))
        .insert_header(("x-pyvisor-bridge", "client"))
        .insert_header(("accept", "application/x-ndjson"));
    if let Some(node) = node {
        request = request.insert_header(("x-pyvisor-forwarded-by", node));
    }
    request
        .send_json(&json!({"owner": "alice", "code": code}))
        .await
        .expect("the holder answers")
}

#[actix_rt::test]
async fn a_bridged_stream_of_the_holder_takes_answers_for_its_own_call_and_session_only() {
    let db = postgres::database().await;
    let pair = Pair::start(&db).await;
    let session = client_session(&pair).await;
    let another = client_session(&pair).await;

    // A caller that is no node gets no bridge: its streamed answer names no stream.
    let mut plain = bridged_execution(&pair, &session, None, "1 + 1").await;
    assert!(plain.headers().get("x-pyvisor-bridge-stream").is_none());
    let last = next_line(&mut plain, &mut Vec::new()).await;
    assert_eq!(last["result"]["result"]["repr"], "2", "{last}");

    let code = "(llm_query('direct'), llm_query('second'))";
    let mut response = bridged_execution(&pair, &session, Some("node-b"), code).await;
    let stream = (response.headers().get("x-pyvisor-bridge-stream"))
        .and_then(|id| id.to_str().ok())
        .expect("the stream's id")
        .to_owned();
    let mut pending = Vec::new();
    let call = next_line(&mut response, &mut pending).await;
    assert_eq!(call["method"], "bridge.llm", "{call}");
    let held = call["id"].as_str().expect("the call's id");
    let reply = json!({"stream": stream, "call_id": held, "result": {"answers": ["direct"]}});

    // The stream's id does not reach another session's calls, and an answer has one shape.
    let (status, body) = post_answer(&pair, &another, ADMIN, Some("node-b"), &reply).await;
    assert_eq!(status, 400, "{body}");
    let mut both = reply.clone();
    both["error"] = json!({"code": -1, "message": "and an error"});
    let (status, body) = post_answer(&pair, &session, ADMIN, Some("node-b"), &both).await;
    assert_eq!(status, 400, "{body}");

    let (status, body) = post_answer(&pair, &session, ADMIN, Some("node-b"), &reply).await;
    assert_eq!((status, &body), (200, &json!({"answered": true})));
    // The code now waits for its second call, so the stream is open: the first is answered
    // once.
    let (status, body) = post_answer(&pair, &session, ADMIN, Some("node-b"), &reply).await;
    assert_eq!(
        (status, &body),
        (200, &json!({"answered": false})),
        "answered once"
    );
    let second = next_line(&mut response, &mut pending).await;
    assert_eq!(second["params"]["prompts"], json!(["second"]), "{second}");
    let reply = json!({"stream": stream, "call_id": second["id"], "result": {"answers": ["2nd"]}});
    let (status, body) = post_answer(&pair, &session, ADMIN, Some("node-b"), &reply).await;
    assert_eq!((status, &body), (200, &json!({"answered": true})));
    let last = next_line(&mut response, &mut pending).await;
    assert_eq!(
        last["result"]["result"]["repr"], "('direct', '2nd')",
        "{last}"
    );
    // Once the answer has ended, its stream is gone.
    let (status, body) = post_answer(&pair, &session, ADMIN, Some("node-b"), &reply).await;
    assert_eq!(status, 400, "{body}");
}
