//! JSON-RPC over the daemon's Unix socket, as docs/protocol.md defines it: every method, streamed
//! notifications, many requests in flight, and bad input that must not disturb anyone else.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Conn, Daemon};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

async fn create(conn: &mut Conn, params: Value) -> String {
    let created = conn.call("session.create", params).await;
    created["session_id"]
        .as_str()
        .expect("session.create returns a session_id")
        .to_owned()
}

async fn execute(conn: &mut Conn, session: &str, code: &str) -> Value {
    conn.call(
        "session.execute",
        json!({"session_id": session, "code": code}),
    )
    .await
}

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
async fn every_method_works_through_the_socket() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;

    let health = conn.call("engine.health", json!({})).await;
    assert_eq!(health["status"], "ok");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"));

    let created = conn
        .call("session.create", json!({"name": "main", "owner": "alice"}))
        .await;
    let session = created["session_id"].as_str().unwrap().to_owned();
    assert!(created["pid"].as_u64().unwrap() > 1);
    assert!(created["python_version"].as_str().unwrap().starts_with('3'));
    assert!(created["warm"].is_boolean());

    let result = execute(&mut conn, &session, "x = 41").await;
    assert_eq!(result["status"], "ok");
    let result = execute(&mut conn, &session, "x + 1").await;
    assert_eq!(result["result"]["repr"], "42");
    assert_eq!(result["result"]["type"], "int");
    assert_eq!(result["execution_count"], 2);
    let failed = execute(&mut conn, &session, "{}['k']").await;
    assert_eq!(failed["status"], "error");
    assert_eq!(failed["error"]["type"], "KeyError");
    execute(&mut conn, &session, "def twice(n):\n    return 2 * n").await;

    let info = conn
        .call("session.info", json!({"session_id": session}))
        .await;
    assert_eq!(info["name"], "main");
    assert_eq!(info["owner"], "alice");
    assert_eq!(info["state"], "idle");
    assert_eq!(info["execution_count"], 4);
    // What the Rust API has: the definitions with their source, the limits, the containment.
    assert_eq!(info["definitions"][0]["name"], "twice", "{info}");
    assert!(info["definitions"][0]["source"]
        .as_str()
        .unwrap()
        .contains("return 2 * n"));
    assert_eq!(info["limits"]["memory_mb"], 2048, "{info}");
    assert_eq!(info["limits"]["timeout_s"], 30.0, "{info}");
    assert!(info["containment"].is_string(), "{info}");
    let names: Vec<&str> = info["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"x"), "{info}");
    // Automatic checkpoints are on: a crash now would lose at most what ran since the last.
    assert!(info["durability"]["saved"].is_boolean(), "{info}");
    assert!(info["durability"]["unsaved_executions"].is_u64(), "{info}");
    assert_eq!(result["warnings"], json!([]), "{result}");

    let listed = conn.call("session.list", json!({"owner": "alice"})).await;
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let nobody = conn.call("session.list", json!({"owner": "bob"})).await;
    assert_eq!(nobody, json!([]));

    let checkpoint = conn
        .call("session.checkpoint", json!({"session_id": session}))
        .await;
    let checkpoint_id = checkpoint["checkpoint_id"].as_str().unwrap().to_owned();
    assert!(
        checkpoint["state_bytes"].as_u64().unwrap() > 0,
        "{checkpoint}"
    );
    assert!(checkpoint["saved"]
        .as_array()
        .unwrap()
        .contains(&json!("x")));
    let listed = conn
        .call("session.checkpoints", json!({"session_id": session}))
        .await;
    // An automatic checkpoint may be listed beside it, before or after.
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|entry| entry["checkpoint_id"] == checkpoint_id.as_str()),
        "{listed}"
    );
    execute(&mut conn, &session, "x = 0").await;
    let restored = conn
        .call(
            "session.restore",
            json!({"session_id": session, "checkpoint_id": checkpoint_id}),
        )
        .await;
    assert_eq!(restored["checkpoint_id"], checkpoint_id);
    assert_eq!(
        execute(&mut conn, &session, "x").await["result"]["repr"],
        "41"
    );

    // Interrupt from a second connection while the first waits in time.sleep.
    let mut other = daemon.connect().await;
    let sleeper = {
        let session = session.clone();
        let mut conn = daemon.connect().await;
        tokio::spawn(
            async move { execute(&mut conn, &session, "import time; time.sleep(30)").await },
        )
    };
    let mut interrupted = false;
    for _ in 0..200 {
        let reply = other
            .call("session.interrupt", json!({"session_id": session}))
            .await;
        if reply["interrupted"] == true {
            interrupted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(interrupted);
    assert_eq!(sleeper.await.unwrap()["status"], "interrupted");

    let stats = conn.call("engine.stats", json!({})).await;
    assert_eq!(stats["sessions"], 1);
    assert!(stats["executions"].as_u64().unwrap() >= 6);
    assert!(stats["pool"]["max_total"].as_u64().unwrap() > 0);

    assert_eq!(
        conn.call("session.close", json!({"session_id": session}))
            .await,
        json!({})
    );
    assert_eq!(
        conn.error_code("session.info", json!({"session_id": session}))
            .await,
        -32001
    );
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_on_one_named_session_share_its_state() {
    let daemon = Daemon::start().await;
    let mut first = daemon.connect().await;
    let mut second = daemon.connect().await;
    let one = first
        .call("session.create", json!({"name": "shared"}))
        .await;
    let two = second
        .call("session.create", json!({"name": "shared"}))
        .await;
    assert_eq!(one["session_id"], two["session_id"]);
    assert_eq!(two["attached"], true);
    assert_eq!(one["pid"], two["pid"]);
    execute(&mut first, "shared", "greeting = 'hello'").await;
    let seen = execute(&mut second, two["session_id"].as_str().unwrap(), "greeting").await;
    assert_eq!(seen["result"]["repr"], "'hello'");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_socket_is_private_and_a_second_daemon_is_refused() {
    let home = tempfile::TempDir::new().unwrap();
    // No --socket: the default, $XDG_RUNTIME_DIR/pyvisor/pyvisor.sock, in a new directory.
    let mut first = common::command(home.path())
        .arg("serve")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let socket = home.path().join("run").join("pyvisor").join("pyvisor.sock");
    let mut answered = false;
    for _ in 0..3000 {
        if let Ok(mut conn) = Conn::connect(&socket).await {
            if conn.try_call("engine.health", json!({})).await.is_ok() {
                answered = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(answered, "the daemon never answered on the default socket");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let dir_mode = std::fs::metadata(socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700, "{dir_mode:o}");

    let second = common::command(home.path()).arg("serve").output().unwrap();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("another pyvisor daemon"), "{stderr}");
    // The first one still serves.
    let mut conn = Conn::connect(&socket).await.unwrap();
    assert_eq!(conn.call("engine.health", json!({})).await["status"], "ok");
    let _ = first.kill();
    let _ = first.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_file_is_replaced() {
    let home = tempfile::TempDir::new().unwrap();
    let socket = home.path().join("run").join("pyvisor.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    // A socket nobody listens on, as a killed daemon leaves behind.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let daemon = Daemon::start_in(home.path(), &[], &[]).await;
    let mut conn = daemon.connect().await;
    assert_eq!(conn.call("engine.health", json!({})).await["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_applies_python_cwd_env_and_limits() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    let cwd = daemon.home.join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let session = create(
        &mut conn,
        json!({
            "python": "python3",
            "cwd": cwd,
            "env": {"GREETING": "hej"},
            "limits": {"open_files": 64, "timeout_s": 0.5, "output_bytes": 1000},
        }),
    )
    .await;
    let result = execute(
        &mut conn,
        &session,
        "import os, resource\n(os.getcwd(), os.environ['GREETING'], resource.getrlimit(resource.RLIMIT_NOFILE)[0])",
    )
    .await;
    let expected = format!("('{}', 'hej', 64)", cwd.canonicalize().unwrap().display());
    assert_eq!(result["result"]["repr"], expected);
    let slow = execute(&mut conn, &session, "import time; time.sleep(5)").await;
    assert_eq!(slow["status"], "timeout");
    let loud = execute(&mut conn, &session, "print('z' * 5000)").await;
    assert!(loud["stdout"].as_str().unwrap().len() < 1500, "{loud}");

    let (_, reply) = conn
        .request("session.create", json!({"python": "/no/such/python"}))
        .await;
    assert_eq!(reply["error"]["code"], -32602);
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("python"));
    let (_, reply) = conn
        .request("session.create", json!({"cwd": "/no/such/dir"}))
        .await;
    assert_eq!(reply["error"]["code"], -32602);
    assert!(reply["error"]["message"].as_str().unwrap().contains("cwd"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hinted_code_is_served_ahead_and_bad_hints_are_invalid_params() {
    let daemon = Daemon::start_with(&[], &[("PYVISOR_PROACTIVE__YIELD_TO_LOAD", "false")]).await;
    let mut conn = daemon.connect().await;
    let session = create(&mut conn, json!({})).await;
    execute(&mut conn, &session, "xs = list(range(10))").await;
    let hinted = conn
        .call(
            "session.hint",
            json!({"session_id": session, "code": ["sum(xs) * 2", "not python ("]}),
        )
        .await;
    assert_eq!(hinted["accepted"], 1, "{hinted}");
    let mut served = None;
    for _ in 0..300 {
        let answer = execute(&mut conn, &session, "sum(xs) * 2").await;
        assert_eq!(answer["result"]["repr"], "90");
        if answer["from_cache"] == true {
            served = Some(answer);
            break;
        }
        // Not computed yet: leave the session idle for the predictor.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        served.is_some(),
        "the hinted code was never served from speculation"
    );
    let real = conn
        .call(
            "session.execute",
            json!({"session_id": session, "code": "sum(xs) * 2", "cache": false}),
        )
        .await;
    assert_eq!(real["from_cache"], false);
    let stats = conn.call("engine.stats", json!({})).await;
    // Served from the cache (a hit) or by waiting for the child computing it (a join).
    let served =
        |figures: &Value| figures["hits"].as_u64().unwrap() + figures["joins"].as_u64().unwrap();
    assert!(served(&stats["proactive"]) >= 1, "{stats}");
    let info = conn
        .call("session.info", json!({"session_id": session}))
        .await;
    assert!(served(&info["proactive"]) >= 1, "{info}");

    let plain = create(&mut conn, json!({"proactive": false})).await;
    let hinted = conn
        .call(
            "session.hint",
            json!({"session_id": plain, "code": ["1 + 1"]}),
        )
        .await;
    assert_eq!(hinted["accepted"], 0);
    let info = conn
        .call("session.info", json!({"session_id": plain}))
        .await;
    assert!(info.get("proactive").is_none(), "{info}");

    let too_many: Vec<String> = (0..65).map(|i| format!("{i}")).collect();
    let too_long = "x".repeat(70_000);
    for params in [
        json!({"session_id": session, "code": too_many}),
        json!({"session_id": session, "code": [too_long]}),
        json!({"session_id": session, "code": "1 + 1"}),
        json!({"session_id": session}),
    ] {
        let reply = conn.try_call("session.hint", params).await.unwrap();
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
    }
    let reply = conn
        .try_call("session.hint", json!({"session_id": "nope", "code": []}))
        .await
        .unwrap();
    assert_eq!(reply["error"]["code"], -32001, "{reply}");
}
