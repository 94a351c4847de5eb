//! The store under real daemons (docs/cluster.md): two nodes started at once against an empty
//! database both come up, the schema applied once; and a node cut off from its store (the
//! way to it cut), or whose PostgreSQL is stopped and started again: the node says so in
//! `/readyz`, registers no new session, stops serving its sessions once it can no longer prove
//! it holds them, and serves them again, as they were, once the store is back.

use std::path::Path;
use std::time::{Duration, Instant};

use pyvisor::loadtest::postgres::Postgres;
use serde_json::{json, Value};

use crate::cluster::{each_migration_applied_once, execute, free_port, node_config_with};
use crate::common::postgres::{self, until};
use crate::common::{http_get, Conn, Daemon};

#[tokio::test]
async fn two_daemons_started_together_on_an_empty_store_both_serve() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let start = |id: &'static str| {
        let home = homes.path().join(id);
        let config = node_config_with(&home, &db, id, "http://127.0.0.1:9", "");
        async move {
            let args = ["--config", config.to_str().expect("a UTF-8 path")];
            Daemon::start_in(&home, &args, &[]).await
        }
    };
    let (node_a, node_b) = tokio::join!(start("node-a"), start("node-b"));
    for node in [&node_a, &node_b] {
        let mut conn = node.connect().await;
        let created = conn.call("session.create", json!({"owner": "alice"})).await;
        assert!(created["session_id"].is_string(), "{created}");
    }
    each_migration_applied_once(&db).await;
    let status = (node_a.connect().await)
        .call("cluster.status", json!({}))
        .await;
    assert_eq!(
        status["nodes"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    assert_eq!(status["sessions"], 2, "{status}");
}

/// A node `node-a` of `db` serving HTTP on a port of its own under `home`, with a session of
/// alice's that ran `x = 1`, ready: the node, its port, its socket's connection and the
/// session.
async fn node_with_a_session(db: &postgres::Database, home: &Path) -> (Daemon, u16, Conn, String) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let config = node_config_with(home, db, "node-a", &format!("http://{addr}"), "");
    let args = ["--config", config.to_str().unwrap(), "--http", &addr];
    let node = Daemon::start_in(home, &args, &[]).await;
    let mut conn = node.connect().await;
    let created = conn.call("session.create", json!({"owner": "alice"})).await;
    let session = created["session_id"].as_str().expect("an id").to_owned();
    let set = execute(&node, &session, "alice", "x = 1").await;
    assert_eq!(set["result"]["status"], "ok", "{set}");
    until("the node is ready", || async {
        http_get(port, "/readyz", None).await.0 == 200
    })
    .await;
    (node, port, conn, session)
}

/// Once the store went away: `/readyz` says so, and past the lease the node refuses the
/// session (`-32008`, "lease"): it can no longer prove it holds it.
async fn refused_once_the_lease_runs_out(node: &Daemon, port: u16, session: &str) {
    until("/readyz says the store is unreachable", || async {
        let (status, body) = http_get(port, "/readyz", None).await;
        status == 503 && body.contains("store unreachable")
    })
    .await;
    let mut answer = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(60);
    while answer["error"]["code"] != -32008 {
        assert!(Instant::now() < deadline, "the node kept serving: {answer}");
        answer = execute(node, session, "alice", "x").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("lease"), "{answer}");
}

/// Once the store is back and nobody took the session: the node serves it again, as it was
/// (the same worker), and says it is ready.
async fn served_again_as_it_was(node: &Daemon, port: u16, session: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let back = loop {
        let answer = execute(node, session, "alice", "x").await;
        if answer["error"].is_null() {
            break answer;
        }
        assert!(Instant::now() < deadline, "never served again: {answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(back["result"]["result"]["repr"], "1", "{back}");
    assert!(
        back["result"]["recovered"].is_null(),
        "the same worker: {back}"
    );
    until("the node is ready again", || async {
        http_get(port, "/readyz", None).await.0 == 200
    })
    .await;
}

#[tokio::test]
async fn a_node_cut_off_from_its_store_stops_serving_until_the_store_is_back() {
    let db = postgres::database().await;
    let home = tempfile::tempdir().expect("temp dir");
    // The node reaches the store through a link to its socket, which the test can cut.
    let (via_link, link) = db.through_link(&home.path().join("link"));
    let (node, port, _conn, session) = node_with_a_session(&via_link, &home.path().join("a")).await;
    // Cut the node off: no new connection, and its open ones ended.
    link.cut(&db).await;
    refused_once_the_lease_runs_out(&node, port, &session).await;
    link.restore();
    served_again_as_it_was(&node, port, &session).await;
}

#[tokio::test]
async fn a_store_stopped_and_started_again_under_a_node_finds_its_sessions_as_they_were() {
    let mut server = Postgres::start().unwrap_or_else(|err| panic!("{err}"));
    server
        .create_database("pyvisor")
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    let db = postgres::Database {
        socket_dir: server.socket_dir().to_owned(),
        name: "pyvisor".into(),
    };
    let home = tempfile::tempdir().expect("temp dir");
    let (node, port, mut conn, session) = node_with_a_session(&db, home.path()).await;
    server.stop();
    refused_once_the_lease_runs_out(&node, port, &session).await;
    let refused = conn
        .error_code("session.create", json!({"owner": "alice"}))
        .await;
    assert_eq!(
        refused, -32000,
        "no session is registered without the store"
    );
    // The same server, on the same data, started again: nobody took the session meanwhile.
    server
        .start_again()
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    served_again_as_it_was(&node, port, &session).await;
    let created = conn.call("session.create", json!({"owner": "alice"})).await;
    assert!(created["session_id"].is_string(), "{created}");
}
