//! Streamed executions over the daemon's socket: notifications in order before the response,
//! `stream_echo: false` sending each output byte once, `input()` answered through
//! `session.input`, and many requests in flight on one connection.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_notifications_arrive_in_order_before_the_response() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    let session = create(&mut conn, json!({})).await;
    let code = "import sys\nfor i in range(20):\n    print(i, flush=True)\n    print('e', i, file=sys.stderr, flush=True)\ndisplay({'k': 1})\n'done'";
    let (notes, response) = conn
        .request(
            "session.execute",
            json!({"session_id": session, "code": code, "stream": true}),
        )
        .await;
    let result = &response["result"];
    assert_eq!(result["status"], "ok");
    assert_eq!(result["result"]["repr"], "'done'");
    let execution_id = result["execution_id"].clone();
    let mut stdout = String::new();
    let mut stderr = String::new();
    let mut displays = 0;
    for note in &notes {
        assert!(note.get("id").is_none(), "a notification has no id: {note}");
        assert_eq!(note["params"]["execution_id"], execution_id);
        assert_eq!(note["params"]["session_id"], json!(session));
        match note["method"].as_str().unwrap() {
            "session.output" if note["params"]["stream"] == "stdout" => {
                stdout.push_str(note["params"]["data"].as_str().unwrap())
            }
            "session.output" => stderr.push_str(note["params"]["data"].as_str().unwrap()),
            "session.display" => displays += 1,
            other => panic!("unexpected notification {other}"),
        }
    }
    let expected: String = (0..20).map(|i| format!("{i}\n")).collect();
    assert_eq!(stdout, expected);
    assert_eq!(stdout, result["stdout"].as_str().unwrap());
    assert_eq!(stderr, result["stderr"].as_str().unwrap());
    assert_eq!(displays, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_echo_false_sends_each_output_byte_once() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    let session = create(&mut conn, json!({})).await;
    let code = "import sys\nprint('out ' * 1000, flush=True)\nprint('err', file=sys.stderr)\n7";
    let (notes, response) = conn
        .request(
            "session.execute",
            json!({"session_id": session, "code": code, "stream": true, "stream_echo": false}),
        )
        .await;
    let result = &response["result"];
    assert_eq!(result["status"], "ok", "{response}");
    assert_eq!(result["result"]["repr"], "7");
    assert_eq!(result["stdout"], "", "the streamed stdout is not repeated");
    assert_eq!(result["stderr"], "");
    let streamed: String = notes
        .iter()
        .filter(|note| note["params"]["stream"] == "stdout")
        .map(|note| note["params"]["data"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, format!("{}\n", "out ".repeat(1000)));
    // Without stream the flag changes nothing: the result is the only copy.
    let plain = conn
        .call(
            "session.execute",
            json!({"session_id": session, "code": "print('once')", "stream_echo": false}),
        )
        .await;
    assert_eq!(plain["stdout"], "once\n");
    // A flag that is not a boolean is an invalid param naming the field.
    let (_, bad) = conn
        .request(
            "session.execute",
            json!({"session_id": session, "code": "1", "stream": true, "stream_echo": "no"}),
        )
        .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream_echo"),
        "{bad}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_is_answered_through_session_input() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    let session = create(&mut conn, json!({})).await;
    conn.send(&json!({"jsonrpc": "2.0", "id": "run", "method": "session.execute",
        "params": {"session_id": session, "code": "name = input('who? ')\nprint('hi', name)", "stream": true}}))
        .await;
    let request = conn.read().await.unwrap();
    assert_eq!(request["method"], "session.input_request");
    assert_eq!(request["params"]["prompt"], "who? ");
    assert_eq!(request["params"]["password"], false);
    let execution_id = request["params"]["execution_id"].clone();
    // Answer from another connection: any client may answer.
    let mut other = daemon.connect().await;
    let answered = other
        .call(
            "session.input",
            json!({"session_id": session, "execution_id": execution_id, "value": "ada"}),
        )
        .await;
    assert_eq!(answered, json!({}));
    let response = loop {
        let message = conn.read().await.unwrap();
        if message.get("id").is_some() {
            break message;
        }
    };
    assert_eq!(response["id"], "run");
    assert_eq!(response["result"]["stdout"], "hi ada\n");

    // Without stream, input() raises EOFError instead of waiting.
    let result = execute(&mut conn, &session, "input()").await;
    assert_eq!(result["error"]["type"], "EOFError");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_are_in_flight_on_one_connection() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    let a = create(&mut conn, json!({})).await;
    let b = create(&mut conn, json!({})).await;
    // A slow execution on `a` does not hold up `b` on the same connection.
    conn.send(
        &json!({"jsonrpc": "2.0", "id": 100, "method": "session.execute",
        "params": {"session_id": a, "code": "import time; time.sleep(1); 'slow'"}}),
    )
    .await;
    for i in 0..10 {
        conn.send(
            &json!({"jsonrpc": "2.0", "id": i, "method": "session.execute",
            "params": {"session_id": b, "code": format!("{i} * 2")}}),
        )
        .await;
    }
    let mut order = Vec::new();
    for _ in 0..11 {
        let response = conn.read().await.unwrap();
        order.push(response["id"].as_u64().unwrap());
        if let Some(i) = response["id"].as_u64().filter(|&i| i < 10) {
            assert_eq!(response["result"]["result"]["repr"], (i * 2).to_string());
        }
    }
    assert_eq!(
        order.last(),
        Some(&100),
        "the slow one answers last: {order:?}"
    );
}
