//! Bad input and bad clients on the daemon's socket, none of which may disturb anyone else (a
//! watchdog connection keeps pinging throughout): malformed messages get the standard errors,
//! a 100 MB line is refused, connections closed mid-request, five hundred idle connections and
//! a client that never reads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;

use super::*;

/// Pings the daemon from its own connection until stopped; fails the test if a ping goes
/// unanswered, so every bad-input test also asserts the daemon kept serving.
struct Watchdog {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Watchdog {
    async fn start(daemon: &Daemon) -> Watchdog {
        let mut conn = daemon.connect().await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut pings = 0;
            while !flag.load(Ordering::SeqCst) {
                let health = conn
                    .try_call("engine.health", json!({}))
                    .await
                    .expect("the daemon answers a well-behaved client");
                assert_eq!(health["result"]["status"], "ok");
                pings += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            pings
        });
        Watchdog { stop, task }
    }

    async fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        let pings = self.task.await.expect("the watchdog task does not panic");
        assert!(pings > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_get_the_standard_errors() {
    let daemon = Daemon::start().await;
    let watchdog = Watchdog::start(&daemon).await;
    let mut conn = daemon.connect().await;

    conn.send_raw(b"{not json\n").await;
    let reply = conn.read().await.unwrap();
    assert_eq!(reply["error"]["code"], -32700);
    assert_eq!(reply["id"], Value::Null);

    conn.send_raw(b"[1, \"two\", {\"three\": 3}]\n").await;
    let replies = conn.read().await.unwrap();
    let replies = replies.as_array().expect("a batch gets an array");
    assert_eq!(replies.len(), 3);
    assert!(replies.iter().all(|r| r["error"]["code"] == -32600));

    conn.send_raw(b"[]\n").await;
    assert_eq!(conn.read().await.unwrap()["error"]["code"], -32600);

    conn.send_raw(b"\xff\xfe garbage\n").await;
    assert_eq!(conn.read().await.unwrap()["error"]["code"], -32700);

    conn.send(&json!({"jsonrpc": "1.0", "id": 1, "method": "engine.health"}))
        .await;
    assert_eq!(conn.read().await.unwrap()["error"]["code"], -32600);
    conn.send(&json!({"jsonrpc": "2.0", "id": [1], "method": "engine.health"}))
        .await;
    assert_eq!(conn.read().await.unwrap()["error"]["code"], -32600);

    assert_eq!(conn.error_code("no.such.method", json!({})).await, -32601);

    let (_, reply) = conn
        .request("session.execute", json!({"session_id": 5, "code": "1"}))
        .await;
    assert_eq!(reply["error"]["code"], -32602);
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session_id"),
        "the message names the field: {reply}"
    );
    let (_, reply) = conn
        .request("session.create", json!({"limits": {"memory_mb": "lots"}}))
        .await;
    assert_eq!(reply["error"]["code"], -32602);
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limits.memory_mb"));
    let (_, reply) = conn
        .request("session.execute", json!({"session_id": "x"}))
        .await;
    assert!(reply["error"]["message"].as_str().unwrap().contains("code"));
    assert_eq!(
        conn.error_code("session.create", json!({"unknown": 1}))
            .await,
        -32602
    );
    assert_eq!(
        conn.error_code(
            "session.execute",
            json!({"session_id": "s-nope", "code": "1"})
        )
        .await,
        -32001
    );
    assert_eq!(
        conn.error_code(
            "session.execute",
            json!({"session_id": "s-nope", "code": "1", "timeout_s": -1})
        )
        .await,
        -32602
    );

    // A notification gets no response: the next line answers the next request.
    conn.send(&json!({"jsonrpc": "2.0", "method": "engine.health"}))
        .await;
    let (_, reply) = conn.request("engine.health", json!({})).await;
    assert_eq!(reply["result"]["status"], "ok");

    // A batch of requests and a notification: one array with the two responses.
    conn.send(&json!([
        {"jsonrpc": "2.0", "id": "a", "method": "engine.health"},
        {"jsonrpc": "2.0", "method": "engine.health"},
        {"jsonrpc": "2.0", "id": "b", "method": "nope"},
    ]))
    .await;
    let batch = conn.read().await.unwrap();
    let batch = batch.as_array().unwrap();
    assert_eq!(batch.len(), 2);
    assert_eq!(batch[0]["id"], "a");
    assert_eq!(batch[1]["error"]["code"], -32601);
    watchdog.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_line_is_refused_and_the_connection_stays_usable() {
    let daemon = Daemon::start().await;
    let watchdog = Watchdog::start(&daemon).await;
    let mut conn = daemon.connect().await;
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..100 {
        conn.writer.write_all(&chunk).await.unwrap();
    }
    conn.writer.write_all(b"\n").await.unwrap();
    let reply = conn.read().await.unwrap();
    assert_eq!(reply["error"]["code"], -32600);
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_request_bytes"));
    let (_, reply) = conn.request("engine.health", json!({})).await;
    assert_eq!(reply["result"]["status"], "ok");
    watchdog.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_mid_request_do_not_disturb_the_daemon() {
    let daemon = Daemon::start().await;
    let watchdog = Watchdog::start(&daemon).await;
    let mut conn = daemon.connect().await;
    let session = create(&mut conn, json!({})).await;
    for _ in 0..20 {
        let mut half = daemon.connect().await;
        half.send_raw(b"{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"session.ex")
            .await;
        drop(half);
        let mut gone = daemon.connect().await;
        gone.send(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute",
            "params": {"session_id": session, "code": "print('x' * 100000)", "stream": true}}),
        )
        .await;
        drop(gone);
    }
    // The session served the abandoned executions and still serves this one.
    let result = execute(&mut conn, &session, "1 + 1").await;
    assert_eq!(result["result"]["repr"], "2");
    watchdog.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_idle_connections_do_not_starve_a_working_client() {
    let daemon = Daemon::start().await;
    let mut idle = Vec::new();
    for _ in 0..500 {
        idle.push(daemon.connect().await);
    }
    let mut conn = daemon.connect().await;
    let session = create(&mut conn, json!({})).await;
    let result = execute(&mut conn, &session, "sum(range(10))").await;
    assert_eq!(result["result"]["repr"], "45");
    // The idle ones are still served too.
    let last = idle.last_mut().unwrap();
    assert_eq!(last.call("engine.health", json!({})).await["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_does_not_block_others() {
    let daemon = Daemon::start().await;
    let watchdog = Watchdog::start(&daemon).await;
    let mut reader_less = daemon.connect().await;
    let mut conn = daemon.connect().await;
    let session = create(&mut conn, json!({})).await;
    // Each answer carries 1 MB of output; the socket buffers fill and stay full.
    for i in 0..64 {
        reader_less
            .send(
                &json!({"jsonrpc": "2.0", "id": i, "method": "session.execute",
                "params": {"session_id": session, "code": "print('y' * 1_000_000)"}}),
            )
            .await;
    }
    let other = create(&mut conn, json!({})).await;
    for i in 0..5 {
        let result = execute(&mut conn, &other, &format!("{i} + 1")).await;
        assert_eq!(result["result"]["repr"], (i + 1).to_string());
    }
    drop(reader_less);
    watchdog.finish().await;
}
