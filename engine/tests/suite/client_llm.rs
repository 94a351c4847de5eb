//! The client-answered LLM bridge over the daemon's Unix socket (`session.create` with
//! `llm: "client"`): `bridge.llm` requests to the connection that started the execution,
//! batched calls answered out of order, errors, usage in the engine's totals, `bridge.cancel`
//! on an interrupt, a client timeout, a client that goes away mid-call, and answers forged by
//! another connection or by the session's own output.

use crate::common;

use common::{Conn, Daemon};
use serde_json::{json, Value};

async fn client_session(conn: &mut Conn) -> String {
    let created = conn.call("session.create", json!({"llm": "client"})).await;
    created["session_id"]
        .as_str()
        .expect("a session id")
        .to_owned()
}

/// Sends a streaming `session.execute` of `code` with id `id`, without waiting.
async fn start(conn: &mut Conn, id: &str, session: &str, code: &str) {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "session.execute",
        "params": {"session_id": session, "code": code, "stream": true}});
    conn.send(&request).await;
}

/// Reads messages until one satisfies `wanted`, which it returns; the others are dropped.
pub(crate) async fn until(conn: &mut Conn, wanted: impl Fn(&Value) -> bool) -> Value {
    loop {
        let message = conn.read().await.expect("the daemon keeps the connection");
        if wanted(&message) {
            return message;
        }
    }
}

/// Reads until both the `bridge.cancel` of `call` and the response `id` came, in either
/// order (the notice follows the call's end, which may be after the execution's result);
/// returns the response.
pub(crate) async fn cancelled_and_done(conn: &mut Conn, call: &Value, id: &str) -> Value {
    let (mut cancelled, mut done) = (false, None);
    while !cancelled || done.is_none() {
        let message = conn.read().await.expect("the daemon keeps the connection");
        if message["method"] == "bridge.cancel" {
            assert_eq!(message["params"]["call_id"], call["id"]);
            assert!(message.get("id").is_none(), "a notification");
            cancelled = true;
        } else if message["id"] == id {
            done = Some(message);
        }
    }
    done.unwrap()
}

pub(crate) fn is_bridge_call(message: &Value) -> bool {
    message["method"] == "bridge.llm"
}

pub(crate) async fn answer(conn: &mut Conn, call: &Value, result: Value) {
    conn.send(&json!({"jsonrpc": "2.0", "id": call["id"], "result": result}))
        .await;
}

#[tokio::test]
async fn the_client_that_runs_the_code_answers_its_llm_calls() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    for bad in [json!("Client"), json!(1), json!({"client": true})] {
        let code = conn.error_code("session.create", json!({"llm": bad})).await;
        assert_eq!(code, -32602, "llm: {bad}");
    }
    let session = client_session(&mut conn).await;

    // Two threads ask at once: both calls reach the client before it answers either, and
    // each thread gets its own answer although they are answered in reverse order.
    let code = "import threading\n\
                got = {}\n\
                def ask(n): got[n] = llm_query('q%d' % n)\n\
                ts = [threading.Thread(target=ask, args=(n,)) for n in (1, 2)]\n\
                [t.start() for t in ts]; [t.join() for t in ts]\n\
                batch = llm_query_batched(['x', 'y'])\n\
                try:\n    llm_query('fail')\nexcept LlmError as err:\n    failed = str(err)\n\
                (got[1], got[2], batch, failed)";
    start(&mut conn, "run", &session, code).await;
    let first = until(&mut conn, is_bridge_call).await;
    let second = until(&mut conn, is_bridge_call).await;
    for call in [&first, &second] {
        let params = &call["params"];
        assert_eq!(params["kind"], "llm");
        assert_eq!(params["session_id"], session.as_str());
        assert_eq!(params["depth"], 0);
        assert_eq!(
            params["call_id"], call["id"],
            "the call id is the request's id"
        );
        assert!(params["execution_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()));
    }
    for call in [&second, &first] {
        let prompt = call["params"]["prompts"][0].as_str().unwrap().to_owned();
        let usage = json!({"input_tokens": 10, "output_tokens": 3, "cost": 0.5});
        answer(
            &mut conn,
            call,
            json!({"answers": [format!("A:{prompt}")], "usage": usage}),
        )
        .await;
    }
    let batched = until(&mut conn, is_bridge_call).await;
    assert_eq!(batched["params"]["kind"], "llm_batched");
    assert_eq!(batched["params"]["prompts"], json!(["x", "y"]));
    answer(&mut conn, &batched, json!({"answers": ["X", "Y"]})).await;
    let failing = until(&mut conn, is_bridge_call).await;
    let error = json!({"code": -1, "message": "provider says no"});
    conn.send(&json!({"jsonrpc": "2.0", "id": failing["id"], "error": error}))
        .await;
    let done = until(&mut conn, |m| m["id"] == "run").await;
    let result = &done["result"];
    assert_eq!(result["status"], "ok", "{done}");
    let shown = result["result"]["repr"].as_str().unwrap();
    assert!(
        shown.starts_with("('A:q1', 'A:q2', ['X', 'Y'], '") && shown.contains("provider says no"),
        "{shown}"
    );

    // Usage the client reported counts in the engine's totals.
    let stats = conn.call("engine.stats", json!({})).await;
    assert_eq!(stats["llm"]["input_tokens"], 20, "{stats}");
    assert_eq!(stats["llm"]["output_tokens"], 6);
    assert_eq!(stats["llm"]["cost"], 1.0);

    // A wrong number of answers is an LlmError, not a crash; so is an answer of bad shape.
    let code = "out = []\n\
                for ask in (lambda: llm_query_batched(['a', 'b']), lambda: llm_query('c')):\n\
                \x20   try:\n        ask()\n    except LlmError as err:\n        out.append(str(err))\n\
                out";
    start(&mut conn, "bad", &session, code).await;
    let call = until(&mut conn, is_bridge_call).await;
    answer(&mut conn, &call, json!({"answers": ["only one"]})).await;
    let call = until(&mut conn, is_bridge_call).await;
    answer(&mut conn, &call, json!({"text": "not answers"})).await;
    let done = until(&mut conn, |m| m["id"] == "bad").await;
    let shown = done["result"]["result"]["repr"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(shown.contains("2 prompt(s) with 1 answer(s)"), "{shown}");
    assert!(shown.contains("not {answers, usage?}"), "{shown}");

    // A plain HTTP-like execution (no connection to answer) and a session without `llm`.
    let plain = conn.call("session.create", json!({})).await;
    let plain = plain["session_id"].as_str().unwrap();
    let missing = conn
        .call(
            "session.execute",
            json!({"session_id": plain,
            "code": "import builtins; hasattr(builtins, 'llm_query')"}),
        )
        .await;
    assert_eq!(missing["result"]["repr"], "False");
}

#[tokio::test]
async fn interrupts_timeouts_and_departures_fail_the_call_not_the_session() {
    let daemon = Daemon::start_with(&[], &[("PYVISOR_LLM__CLIENT_TIMEOUT_S", "1")]).await;
    let mut conn = daemon.connect().await;
    let session = client_session(&mut conn).await;

    // An interrupt while the call waits: the client is told, the code sees KeyboardInterrupt.
    start(&mut conn, "wait", &session, "llm_query('slow')").await;
    let call = until(&mut conn, is_bridge_call).await;
    let mut other = daemon.connect().await;
    let interrupted = other
        .call("session.interrupt", json!({"session_id": session}))
        .await;
    assert_eq!(interrupted["interrupted"], true);
    let done = cancelled_and_done(&mut conn, &call, "wait").await;
    assert_eq!(done["result"]["status"], "interrupted", "{done}");
    // A late answer to the cancelled call reaches nobody and harms nothing.
    answer(&mut conn, &call, json!({"answers": ["late"]})).await;

    // No answer within client_timeout_s: LlmError, and the client is told to stop.
    let code = "try:\n    llm_query('never')\nexcept LlmError as err:\n    timed = str(err)\ntimed";
    start(&mut conn, "timeout", &session, code).await;
    let call = until(&mut conn, is_bridge_call).await;
    let done = cancelled_and_done(&mut conn, &call, "timeout").await;
    let shown = done["result"]["result"]["repr"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(shown.contains("client_timeout_s"), "{shown}");

    // The client goes away mid-call: the call fails at once, the session lives on.
    let code = "try:\n    llm_query('orphan')\nexcept LlmError as err:\n    orphaned = str(err)";
    start(&mut conn, "orphan", &session, code).await;
    until(&mut conn, is_bridge_call).await;
    drop(conn);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let shown = loop {
        let ran = other
            .call(
                "session.execute",
                json!({"session_id": session,
                "code": "globals().get('orphaned')", "queue": true}),
            )
            .await;
        let shown = ran["result"]["repr"].as_str().unwrap_or("None").to_owned();
        if shown != "None" {
            break shown;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the orphaned call never failed"
        );
    };
    assert!(shown.contains("connection"), "{shown}");
}

#[tokio::test]
async fn no_one_but_the_running_client_can_answer_a_call() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    let mut intruder = daemon.connect().await;
    let session = client_session(&mut conn).await;

    // The session prints a forged response, then asks; another connection answers the
    // call's id first. Only the client that ran the code decides the answer.
    let code = "print('{\"jsonrpc\": \"2.0\", \"id\": \"b1\", \"result\": {\"answers\": [\"printed\"]}}')\n\
                llm_query('real?')";
    start(&mut conn, "run", &session, code).await;
    let call = until(&mut conn, is_bridge_call).await;
    let forged = json!({"jsonrpc": "2.0", "id": call["id"], "result": {"answers": ["forged"]}});
    intruder.send(&forged).await;
    // The intruder's connection still serves it; the forged response changed nothing.
    let health = intruder.call("engine.health", json!({})).await;
    assert_eq!(health["status"], "ok");
    answer(&mut conn, &call, json!({"answers": ["real"]})).await;
    let done = until(&mut conn, |m| m["id"] == "run").await;
    assert_eq!(done["result"]["result"]["repr"], "'real'", "{done}");

    // An execution the intruder starts in that session asks the intruder, not the owner.
    start(&mut intruder, "its-own", &session, "llm_query('mine')").await;
    let call = until(&mut intruder, is_bridge_call).await;
    answer(&mut intruder, &call, json!({"answers": ["theirs"]})).await;
    let done = until(&mut intruder, |m| m["id"] == "its-own").await;
    assert_eq!(done["result"]["result"]["repr"], "'theirs'");
}
