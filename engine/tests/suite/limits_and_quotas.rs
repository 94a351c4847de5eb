//! What a client may ask for and hold: per-session limits within the operator's ceilings
//! (`[limits.max]`), nonsense refused with the field named, the sessions one owner may hold,
//! and idle sessions checkpointed and closed, then brought back by name.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Conn, Daemon};
use serde_json::{json, Value};

/// A daemon with `config` as its user config (one warm worker).
async fn daemon_with(config: &str) -> (Daemon, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    write_config(home.path(), config);
    let daemon = Daemon::start_in(home.path(), &[], &[]).await;
    (daemon, home)
}

fn write_config(home: &Path, config: &str) {
    let dir = home.join("config/pyvisor");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        format!("[pool]\nmin_idle = 1\n{config}"),
    )
    .unwrap();
}

/// The error of a call that must fail: its code and message.
async fn refused(conn: &mut Conn, method: &str, params: Value) -> (i64, String) {
    let (_, reply) = conn.request(method, params).await;
    let error = &reply["error"];
    assert!(error.is_object(), "{method} must fail: {reply}");
    (
        error["code"].as_i64().unwrap(),
        error["message"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_above_a_ceiling_or_nonsense_are_refused_naming_the_field() {
    let (daemon, _home) =
        daemon_with("[limits.max]\nmemory_mb = 4096\noutput_bytes = 16777216\ntimeout_s = 60\n")
            .await;
    let mut conn = daemon.connect().await;
    let cases = [
        (json!({"memory_mb": 8192}), "limits.memory_mb: 8192 is above the ceiling limits.max.memory_mb = 4096"),
        (json!({"memory_mb": u64::MAX}), "limits.max.memory_mb = 4096"),
        (json!({"memory_mb": 0}), "limits.memory_mb: 0 (no limit) is above the ceiling"),
        (json!({"memory_mb": 1}), "limits.memory_mb: 1 is below the least a worker runs with"),
        (json!({"output_bytes": 4_000_000_000u64}), "limits.output_bytes: 4000000000 is above the ceiling limits.max.output_bytes = 16777216"),
        (json!({"output_bytes": 0}), "limits.output_bytes: must be at least 1"),
        (json!({"timeout_s": 1e-300}), "limits.timeout_s: expected a number of seconds from 0.001"),
        (json!({"timeout_s": -1}), "limits.timeout_s"),
        (json!({"timeout_s": 3600}), "limits.timeout_s: 3600 is above the ceiling limits.max.timeout_s = 60"),
        (json!({"processes": -5}), "limits.processes"),
    ];
    for (limits, expected) in cases {
        let (code, message) =
            refused(&mut conn, "session.create", json!({ "limits": limits })).await;
        assert_eq!(code, -32602, "{limits}: {message}");
        assert!(message.contains(expected), "{limits}: {message}");
    }
    // Within the ceilings, and 0 for a field without one (cpu_s): accepted, and enforced.
    let created = conn
        .call(
            "session.create",
            json!({"limits": {"memory_mb": 4096, "cpu_s": 0, "timeout_s": 60}}),
        )
        .await;
    let session = created["session_id"].as_str().unwrap().to_owned();
    let (code, message) = refused(
        &mut conn,
        "session.execute",
        json!({"session_id": session, "code": "1", "timeout_s": 61}),
    )
    .await;
    assert_eq!(code, -32602);
    assert!(
        message.contains("timeout_s: 61 is above the ceiling limits.max.timeout_s = 60"),
        "{message}"
    );
    let answer = conn
        .call(
            "session.execute",
            json!({"session_id": session, "code": "6 * 7"}),
        )
        .await;
    assert_eq!(answer["result"]["repr"], "42");
}

#[test]
fn a_default_above_its_ceiling_is_a_config_error() {
    let home = tempfile::tempdir().unwrap();
    write_config(
        home.path(),
        "[limits]\nmemory_mb = 8192\n[limits.max]\nmemory_mb = 4096\n",
    );
    let output = common::command(home.path())
        .args(["config", "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains("limits.memory_mb: 8192 is above the ceiling limits.max.memory_mb = 4096"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_holds_at_most_its_quota_of_sessions() {
    let (daemon, _home) = daemon_with("[limits]\nmax_sessions_per_owner = 2\n").await;
    let mut conn = daemon.connect().await;
    let mut alices = Vec::new();
    for _ in 0..2 {
        let created = conn.call("session.create", json!({"owner": "alice"})).await;
        alices.push(created["session_id"].as_str().unwrap().to_owned());
    }
    let (code, message) = refused(&mut conn, "session.create", json!({"owner": "alice"})).await;
    assert_eq!(code, -32005, "{message}");
    assert!(message.contains("already holds 2 sessions"), "{message}");
    // Someone else is not affected, and closing one frees a place.
    conn.call("session.create", json!({"owner": "bob"})).await;
    conn.call("session.close", json!({"session_id": alices[0]}))
        .await;
    conn.call("session.create", json!({"owner": "alice"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_checkpointed_closed_and_comes_back_by_name() {
    let (daemon, _home) = daemon_with("[limits]\nidle_timeout_s = 0.5\n").await;
    let mut conn = daemon.connect().await;
    let created = conn.call("session.create", json!({"name": "notes"})).await;
    let first_id = created["session_id"].as_str().unwrap().to_owned();
    conn.call(
        "session.execute",
        json!({"session_id": first_id, "code": "kept = [1, 2, 3]"}),
    )
    .await;
    // Closed once idle: its id is gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, reply) = conn
            .request("session.info", json!({"session_id": first_id}))
            .await;
        if reply["error"]["code"] == -32001 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle session was never closed: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Attaching by name brings it back from its last checkpoint.
    let back = conn.call("session.create", json!({"name": "notes"})).await;
    assert_eq!(back["restored"], true, "{back}");
    let answer = conn
        .call(
            "session.execute",
            json!({"session_id": back["session_id"], "code": "sum(kept)"}),
        )
        .await;
    assert_eq!(answer["result"]["repr"], "6");
}
