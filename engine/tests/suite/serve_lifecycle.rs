//! The life of `pyvisor serve`: a graceful SIGTERM with executions in flight, named
//! sessions back after a restart, a SIGHUP reload of the pool, and `--stdio`.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{http_get, Daemon};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_checkpoints_and_named_sessions_come_back() {
    let home = tempfile::TempDir::new().unwrap();
    let mut daemon = Daemon::start_in(home.path(), &[], &[]).await;
    let mut conn = daemon.connect().await;
    let created = conn.call("session.create", json!({"name": "keep"})).await;
    let session = created["session_id"].as_str().unwrap().to_owned();
    conn.call(
        "session.execute",
        json!({"session_id": session, "code": "data = {'n': 41}\ndef bump(d):\n    return d['n'] + 1"}),
    )
    .await;
    // An execution in flight when SIGTERM arrives finishes within the grace period.
    let mut busy = daemon.connect().await;
    let in_flight = tokio::spawn(async move {
        busy.call(
            "session.execute",
            json!({"session_id": "keep", "code": "import time; time.sleep(0.5); 'finished'"}),
        )
        .await
    });
    // Once the session is busy with it, the execution is in flight.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = conn
            .call("session.info", json!({"session_id": session}))
            .await;
        if info["state"] == "busy" {
            break;
        }
        assert!(Instant::now() < deadline, "never busy: {info}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    daemon.signal(Signal::SIGTERM);
    let result = in_flight.await.unwrap();
    assert_eq!(result["status"], "ok", "{result}");
    assert_eq!(result["result"]["repr"], "'finished'");
    let code = tokio::task::spawn_blocking(move || {
        let code = daemon.wait_exit(Duration::from_secs(30));
        (code, daemon)
    })
    .await
    .unwrap();
    assert_eq!(code.0, Some(0), "{}", code.1.log());
    assert!(!code.1.socket.exists(), "the socket is removed at exit");
    drop(code);

    let daemon = Daemon::start_in(home.path(), &[], &[]).await;
    let mut conn = daemon.connect().await;
    let back = conn.call("session.create", json!({"name": "keep"})).await;
    assert_eq!(back["restored"], true, "{back}");
    let result = conn
        .call(
            "session.execute",
            json!({"session_id": back["session_id"], "code": "bump(data)"}),
        )
        .await;
    assert_eq!(result["result"]["repr"], "42", "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_min_idle_without_dropping_sessions() {
    let home = tempfile::TempDir::new().unwrap();
    let config = home.path().join("pyvisor.toml");
    std::fs::write(&config, "[pool]\nmin_idle = 1\n").unwrap();
    let daemon = Daemon::start_in(home.path(), &["--config", config.to_str().unwrap()], &[]).await;
    let mut conn = daemon.connect().await;
    let session = conn.call("session.create", json!({})).await["session_id"].clone();
    conn.call(
        "session.execute",
        json!({"session_id": session, "code": "kept = 'yes'"}),
    )
    .await;

    std::fs::write(&config, "[pool]\nmin_idle = 3\n").unwrap();
    daemon.signal(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = conn.call("engine.stats", json!({})).await;
        if stats["pool"]["idle"].as_u64().unwrap() >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "min_idle 3 never reached: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let result = conn
        .call(
            "session.execute",
            json!({"session_id": session, "code": "kept"}),
        )
        .await;
    assert_eq!(result["result"]["repr"], "'yes'");

    // A broken file is refused and the daemon keeps its settings and serves on.
    std::fs::write(&config, "[pool]\nmin_idel = 0\n").unwrap();
    daemon.signal(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.log().contains("min_idel") {
        assert!(Instant::now() < deadline, "no refusal: {}", daemon.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(conn.call("engine.health", json!({})).await["status"], "ok");
}

#[test]
fn stdio_speaks_json_rpc_and_exits_at_end_of_input() {
    let home = tempfile::TempDir::new().unwrap();
    let mut child = common::command(home.path())
        .args(["serve", "--stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut call = |request: Value| -> Value {
        writeln!(stdin, "{request}").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    let created = call(json!({"jsonrpc": "2.0", "id": 1, "method": "session.create"}));
    let session = created["result"]["session_id"].clone();
    let result = call(
        json!({"jsonrpc": "2.0", "id": 2, "method": "session.execute",
        "params": {"session_id": session, "code": "print('out'); 6 * 7"}}),
    );
    assert_eq!(result["id"], 2);
    assert_eq!(result["result"]["stdout"], "out\n");
    assert_eq!(result["result"]["result"]["repr"], "42");
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve --stdio did not exit at EOF"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}

/// The daemon as systemd sees it: a notify socket of our own collects what it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_watchdog_pings_and_stopping_and_workers_do_not() {
    let home = tempfile::TempDir::new().unwrap();
    let notify_path = home.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let notify_str = notify_path.to_str().unwrap();
    let mut daemon = Daemon::start_in(
        home.path(),
        &[],
        &[("NOTIFY_SOCKET", notify_str), ("WATCHDOG_USEC", "200000")],
    )
    .await;
    let mut received = Vec::new();
    let read = |until: &str, received: &mut Vec<String>| {
        let mut buffer = [0u8; 4096];
        while !received.iter().any(|m| m.contains(until)) {
            let n = notify
                .recv(&mut buffer)
                .expect("a notification within 30 s");
            received.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
        }
    };
    read("READY=1", &mut received);
    // Pings every 100 ms (half the interval): three more arrive, each within the read timeout.
    let pings = |received: &[String]| received.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    let wanted = pings(&received) + 3;
    let mut buffer = [0u8; 4096];
    while pings(&received) < wanted {
        let n = notify.recv(&mut buffer).expect("a ping within 30 s");
        received.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
    }

    // A worker does not see the daemon's notify socket.
    let mut conn = daemon.connect().await;
    let session = conn.call("session.create", json!({})).await["session_id"].clone();
    let seen = conn
        .call(
            "session.execute",
            json!({"session_id": session, "code": "import os; (os.environ.get('NOTIFY_SOCKET'), os.environ.get('WATCHDOG_USEC'))"}),
        )
        .await;
    assert_eq!(seen["result"]["repr"], "(None, None)");

    daemon.signal(Signal::SIGTERM);
    read("STOPPING=1", &mut received);
    let code = tokio::task::spawn_blocking(move || daemon.wait_exit(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(code, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_http_exposes_probes_and_prometheus_metrics_behind_the_token() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let daemon =
        Daemon::start_with(&["--http", &addr], &[("PYVISOR_SERVER__TOKEN", "s3cret")]).await;
    let mut conn = daemon.connect().await;
    let session = conn.call("session.create", json!({})).await["session_id"].clone();
    conn.call(
        "session.execute",
        json!({"session_id": session, "code": "print('hi')"}),
    )
    .await;
    conn.call("session.checkpoint", json!({"session_id": session}))
        .await;

    assert_eq!(http_get(port, "/healthz", None).await.0, 401);
    assert_eq!(http_get(port, "/metrics", Some("wrong")).await.0, 401);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(port, "/readyz", Some("s3cret")).await.0 != 200 {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, metrics) = http_get(port, "/metrics", Some("s3cret")).await;
    assert_eq!(status, 200);
    // Counters and gauges show from the start; histograms once something was measured
    // (the checkpoint above, for the checkpoint histograms).
    for name in [
        "pyvisor_executions_total{status=\"ok\"} 1",
        "pyvisor_executions_total{status=\"crashed\"} 0",
        "pyvisor_execution_seconds",
        "pyvisor_sessions{state=\"idle\"}",
        "pyvisor_pool_acquire_seconds",
        "pyvisor_pool_hits_total",
        "pyvisor_pool_misses_total",
        "pyvisor_worker_spawn_seconds",
        "pyvisor_worker_crashes_total 0",
        "pyvisor_restores_total 0",
        "pyvisor_checkpoint_seconds",
        "pyvisor_checkpoint_bytes",
        "pyvisor_proactive_predictions_total{source=\"template\"}",
        "pyvisor_proactive_cache_hits_total",
        "pyvisor_proactive_cache_misses_total",
        "pyvisor_proactive_cache_size",
        "pyvisor_proactive_hit_rate",
        "pyvisor_proactive_cpu_seconds_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
    let (status, body) = http_get(port, "/v1/sessions", Some("s3cret")).await;
    assert_eq!(status, 200);
    assert!(body.contains(session.as_str().unwrap()), "{body}");
}
