//! JSON-RPC over the daemon's Unix socket, as docs/protocol.md defines it: every method, two
//! clients on one named session, the options of `session.create`, hints, and the socket file
//! itself (private by default, one daemon on it, a stale one replaced). Streamed notifications
//! and many requests in flight are in `streaming`; bad input that must not disturb anyone else
//! is in `bad_input`.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{Conn, Daemon};
use serde_json::{json, Value};

mod bad_input;
mod streaming;

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
    // `session.info` lists what is computed ahead: wait for the hinted code there, then
    // its request is answered from the cache.
    let computed = |proactive: &Value| {
        proactive["ahead"]
            .as_array()
            .unwrap()
            .contains(&json!("sum(xs)*2"))
    };
    let mut listed = Value::Null;
    for _ in 0..300 {
        let info = conn
            .call("session.info", json!({"session_id": session}))
            .await;
        listed = info["proactive"].clone();
        if computed(&listed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        computed(&listed),
        "the hinted code was never computed ahead: {listed}"
    );
    assert!(listed["speculating"].is_array(), "{listed}");
    let answer = execute(&mut conn, &session, "sum(xs) * 2").await;
    assert_eq!(answer["result"]["repr"], "90");
    assert_eq!(answer["from_cache"], true, "{answer}");
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
