//! Which node serves a session, with two real daemon processes on one real throwaway PostgreSQL
//! (docs/cluster.md): a request at the node that does not hold the session is forwarded to its
//! live holder; a killed holder's session comes back on the other node from its last checkpoint
//! and says where it came from, for its owner only, losing nothing acknowledged with reply
//! durability; a holder paused past its lease gives the session up when it wakes; and a drained
//! node hands its sessions over and exits.

use crate::cluster::{
    checkpointed_session, execute, execute_once_free, http_nodes, metric, two_nodes, two_nodes_with,
};
use crate::common;
use crate::common::postgres;

use std::time::Duration;

use serde_json::{json, Value};

use common::http_get;
use postgres::until;

#[tokio::test]
async fn a_session_of_a_killed_node_comes_back_on_another_with_its_state() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (mut node_a, node_b) = two_nodes(&db, homes.path()).await;

    let store = db.connect().await;
    let (session, checkpoint) = checkpointed_session(&node_a, &store, "x = 41").await;

    // While node A lives, node B does not take its session.
    let held = execute(&node_b, &session, "alice", "x").await;
    assert_eq!(held["error"]["code"], -32008, "{held}");
    assert_eq!(held["error"]["data"]["node"], "node-a", "{held}");

    node_a.child.kill().expect("kill -9 node A");
    node_a.child.wait().expect("reap node A");

    // Another owner never reaches the session, through any node.
    let foreign = execute(&node_b, &session, "bob", "x").await;
    assert_eq!(foreign["error"]["code"], -32001, "{foreign}");

    // The session's next request on node B, which cannot reach node A, waits for node A's
    // lease to run out and claims it: it is answered, not refused.
    let answer = execute(&node_b, &session, "alice", "x + 1").await;
    let result = &answer["result"];
    assert_eq!(result["status"], "ok", "{answer}\n{}", node_b.log());
    assert_eq!(
        result["result"]["repr"], "42",
        "the state of node A came back"
    );
    assert_eq!(result["node"], "node-b", "{answer}");
    let recovered = &result["recovered"];
    assert_eq!(recovered["from_node"], "node-a", "{recovered}");
    assert_eq!(
        recovered["checkpoint_id"],
        checkpoint.as_str(),
        "{recovered}"
    );
    assert_eq!(recovered["lost_executions"], 0, "{recovered}");
    // The default mode cannot count what the dead node acknowledged after its last
    // heartbeat: the count is a lower bound, and the result says so.
    assert_eq!(recovered["lost_may_be_more"], true, "{recovered}");

    // Only the request that took it over says so; the session goes on on node B.
    let next = execute(&node_b, &session, "alice", "x = 7; x").await;
    assert_eq!(next["result"]["result"]["repr"], "7", "{next}");
    assert!(next["result"]["recovered"].is_null(), "{next}");
    let row = store
        .query_one(
            "SELECT holder, epoch FROM pyvisor_sessions WHERE session_id = $1",
            &[&session],
        )
        .await
        .expect("the directory row");
    assert_eq!(row.get::<_, String>(0), "node-b");
    assert_eq!(row.get::<_, i64>(1), 2, "one claim after the create");
    let foreign = execute(&node_b, &session, "bob", "x").await;
    assert_eq!(foreign["error"]["code"], -32001, "{foreign}");

    // cluster.status: both nodes, the session with node B, node A's heartbeat stale.
    let mut conn_b = node_b.connect().await;
    let status = conn_b.call("cluster.status", json!({})).await;
    assert_eq!(status["sessions"], 1, "{status}");
    let nodes = status["nodes"].as_array().expect("a list of nodes");
    let ids: Vec<&str> = nodes.iter().filter_map(|n| n["node_id"].as_str()).collect();
    assert_eq!(ids, ["node-a", "node-b"], "{status}");
    assert_eq!(nodes[0]["sessions"], 0, "{status}");
    assert_eq!(nodes[1]["sessions"], 1, "{status}");
    assert!(
        nodes[0]["heartbeat_age_ms"].as_i64() > nodes[1]["heartbeat_age_ms"].as_i64(),
        "{status}"
    );
    assert_eq!(nodes[1]["advertise_url"], "http://127.0.0.1:9", "{status}");
    // It counts every owner's sessions: an owner may not read it.
    let (_, refused) = conn_b
        .request("cluster.status", json!({"owner": "alice"}))
        .await;
    assert_eq!(refused["error"]["code"], -32007, "{refused}");
}

#[tokio::test]
async fn a_node_paused_past_its_lease_gives_the_session_up_when_it_wakes() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (node_a, node_b) = two_nodes(&db, homes.path()).await;
    let store = db.connect().await;
    let (session, _) = checkpointed_session(&node_a, &store, "x = 41").await;
    // Node A has a newer checkpoint of its own when it is paused: unless its uploader sent it
    // in the moment before the pause, it is what node A tries to write when it wakes.
    let newer = execute(&node_a, &session, "alice", "x = 1000").await;
    assert_eq!(newer["result"]["status"], "ok", "{newer}");
    let mut conn_a = node_a.connect().await;
    conn_a
        .call("session.checkpoint", json!({"session_id": session}))
        .await;
    node_a.signal(nix::sys::signal::Signal::SIGSTOP);
    let taken = execute_once_free(&node_b, &session, "x = x + 1; x").await;
    let value = taken["result"]["result"]["repr"].clone();
    assert!(value == "42" || value == "1001", "{taken}");
    // Node B's state reaches the store under its epoch before node A wakes.
    let b_wrote = || async {
        let row = store
            .query_one(
                "SELECT c.node_id, c.epoch = s.epoch FROM pyvisor_sessions s
                 JOIN pyvisor_checkpoints c USING (session_id) WHERE s.session_id = $1",
                &[&session],
            )
            .await
            .expect("the session and its checkpoint");
        (row.get::<_, String>(0), row.get::<_, bool>(1)) == ("node-b".to_owned(), true)
    };
    until("node B's checkpoint is in the store", b_wrote).await;
    node_a.signal(nix::sys::signal::Signal::SIGCONT);

    // Node A learns that it lost the session and stops serving it; the session's state is
    // node B's, whatever node A tried to write when it woke.
    until("node A gave the session up", || async {
        node_a
            .log()
            .contains("lost the session's lease to another node")
    })
    .await;
    let stale = execute(&node_a, &session, "alice", "x").await;
    assert_eq!(stale["error"]["code"], -32008, "{stale}");
    assert_eq!(stale["error"]["data"]["node"], "node-b", "{stale}");
    let now = execute(&node_b, &session, "alice", "x").await;
    assert_eq!(now["result"]["result"]["repr"], value, "{now}");
    assert!(b_wrote().await, "the store's checkpoint is still node B's");
    let holder: String = store
        .query_one(
            "SELECT holder FROM pyvisor_sessions WHERE session_id = $1",
            &[&session],
        )
        .await
        .expect("the directory row")
        .get(0);
    assert_eq!(holder, "node-b");
}

#[tokio::test]
async fn a_request_at_the_wrong_node_is_forwarded_to_the_holder() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (nodes, ports) = http_nodes(&db, homes.path(), &["node-a", "node-b"]).await;
    let (node_a, node_b) = (&nodes[0], &nodes[1]);
    let mut conn = node_a.connect().await;
    let created = conn.call("session.create", json!({"owner": "alice"})).await;
    let session = created["session_id"].as_str().expect("an id").to_owned();
    let set = execute(node_a, &session, "alice", "x = 41").await;
    assert_eq!(set["result"]["status"], "ok", "{set}");

    // Node B does not hold the session: it sends the request on to node A, which runs it.
    let there = execute(node_b, &session, "alice", "x += 1; print('on A'); x").await;
    let result = &there["result"];
    assert_eq!(result["result"]["repr"], "42", "{there}");
    assert_eq!(result["stdout"], "on A\n", "{there}");
    assert_eq!(result["node"], "node-a", "the holder answered: {there}");
    assert!(
        result["recovered"].is_null(),
        "nothing was recovered: {there}"
    );
    let here = execute(node_a, &session, "alice", "x").await;
    assert_eq!(
        here["result"]["result"]["repr"], "42",
        "it ran on node A: {here}"
    );
    let mut conn_b = node_b.connect().await;
    let checkpoint = conn_b
        .call("session.checkpoint", json!({"session_id": session}))
        .await;
    assert!(checkpoint["checkpoint_id"].is_string(), "{checkpoint}");

    // The owner rule holds through any node: bob never reaches alice's session.
    let foreign = execute(node_b, &session, "bob", "x").await;
    assert_eq!(foreign["error"]["code"], -32001, "{foreign}");
    let store = db.connect().await;
    let holder: String = store
        .query_one(
            "SELECT holder FROM pyvisor_sessions WHERE session_id = $1",
            &[&session],
        )
        .await
        .expect("the directory row")
        .get(0);
    assert_eq!(holder, "node-a", "forwarding claims nothing");

    // The metrics say so: node B forwarded, node A holds one lease it registered.
    let (_, metrics_b) = http_get(ports[1], "/metrics", None).await;
    let forwarded = metric(&metrics_b, "pyvisor_cluster_forwarded_total");
    assert!(forwarded >= 2.0, "{metrics_b}");
    let (_, metrics_a) = http_get(ports[0], "/metrics", None).await;
    let claimed = r#"pyvisor_cluster_leases_total{event="claimed"}"#;
    assert_eq!(metric(&metrics_a, claimed), 1.0, "{metrics_a}");
    let registered = r#"pyvisor_cluster_store_seconds_count{op="register"}"#;
    assert_eq!(metric(&metrics_a, registered), 1.0, "{metrics_a}");
}

#[tokio::test]
async fn with_reply_durability_a_nodes_death_loses_no_acknowledged_execution() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let durable = "[state]\ndurability = \"reply\"\n";
    let (mut node_a, node_b) = two_nodes_with(&db, homes.path(), durable).await;
    let mut conn = node_a.connect().await;
    let limits = json!({"timeout_s": 7.5, "output_bytes": 123_456});
    let params = json!({"owner": "alice", "limits": limits});
    let created = conn.call("session.create", params).await;
    let session = created["session_id"].as_str().expect("an id").to_owned();
    for n in 1..=5 {
        let ran = execute(&node_a, &session, "alice", &format!("n = {n}")).await;
        assert_eq!(ran["result"]["status"], "ok", "{ran}");
        assert_eq!(ran["result"]["warnings"], json!([]), "{ran}");
    }
    // Killed right after the last reply: no heartbeat has had the time to upload anything.
    node_a.child.kill().expect("kill -9 node A");
    node_a.child.wait().expect("reap node A");

    let answer = execute_once_free(&node_b, &session, "n").await;
    assert_eq!(answer["result"]["result"]["repr"], "5", "{answer}");
    let recovered = &answer["result"]["recovered"];
    assert_eq!(recovered["from_node"], "node-a", "{recovered}");
    assert_eq!(recovered["lost_executions"], 0, "{recovered}");
    assert_eq!(recovered["lost_may_be_more"], false, "{recovered}");
    // It keeps the limits it was created with, not node B's defaults.
    let info = (node_b.connect().await)
        .call("session.info", json!({"session_id": session}))
        .await;
    assert_eq!(info["limits"]["timeout_s"], 7.5, "{info}");
    assert_eq!(info["limits"]["output_bytes"], 123_456, "{info}");
}

#[tokio::test]
async fn a_drained_node_hands_its_sessions_over_and_exits() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (mut node_a, node_b) = two_nodes(&db, homes.path()).await;
    let mut conn = node_a.connect().await;
    let created = conn.call("session.create", json!({"owner": "alice"})).await;
    let session = created["session_id"].as_str().expect("an id").to_owned();
    let ran = execute(&node_a, &session, "alice", "x = 41").await;
    assert_eq!(ran["result"]["status"], "ok", "{ran}");
    drop(conn);

    // An execution is running when the drain begins: it finishes, and its change goes over.
    let mut busy = node_a.connect().await;
    let code = "import time; time.sleep(2); x = x + 1; x";
    let params = json!({"session_id": session, "owner": "alice", "code": code});
    let running = tokio::spawn(async move { busy.request("session.execute", params).await.1 });
    until("the execution runs", || async {
        let params = json!({"session_id": session});
        let info = node_a.connect().await.call("session.info", params).await;
        info["state"] == "busy"
    })
    .await;
    let mut drain = common::command(&node_a.home);
    drain.env("PYVISOR_SERVER__SOCKET", &node_a.socket);
    let config = node_a.home.join("pyvisor.toml");
    let config = config.to_str().expect("a UTF-8 path").to_owned();
    let drained = tokio::task::spawn_blocking(move || {
        common::run(drain, "daemon", &["drain", "--config", &config], "")
    });

    // The cluster sees the node drain, and it takes no new session.
    until("node A says it drains", || async {
        let status = node_b
            .connect()
            .await
            .call("cluster.status", json!({}))
            .await;
        status["nodes"][0]["draining"] == true
    })
    .await;
    let mut fresh = node_a.connect().await;
    let refused = fresh
        .error_code("session.create", json!({"owner": "alice"}))
        .await;
    assert_eq!(refused, -32006, "a draining node takes no new session");

    let finished = running.await.expect("the running execution");
    assert_eq!(finished["result"]["result"]["repr"], "42", "{finished}");
    let drained = drained.await.expect("pyvisor daemon drain");
    assert!(
        drained.status.success(),
        "{}\n{}",
        common::text(&drained.stderr),
        node_a.log()
    );
    assert_eq!(node_a.wait_exit(Duration::from_secs(30)), Some(0));

    // Node B serves the session at once (no lease to wait for), with the state node A had.
    let answer = execute(&node_b, &session, "alice", "x").await;
    assert_eq!(answer["result"]["result"]["repr"], "42", "{answer}");
    let recovered = &answer["result"]["recovered"];
    assert!(
        recovered["from_node"].is_null(),
        "released, not failed over: {recovered}"
    );
    assert_eq!(recovered["lost_executions"], 0, "{recovered}");
    assert_eq!(recovered["lost_may_be_more"], false, "{recovered}");
    let listed = common::run_in(&node_b, "cluster", &["status", "--format", "json"], "");
    let status: Value = serde_json::from_slice(&listed.stdout).expect("cluster status as JSON");
    assert_eq!(status["nodes"][0]["node_id"], "node-a", "{status}");
    assert_eq!(status["nodes"][0]["sessions"], 0, "{status}");
    let table = common::text(&common::run_in(&node_b, "cluster", &["status"], "").stdout);
    let row_a = table.lines().find(|line| line.starts_with("node-a"));
    assert!(
        row_a.is_some_and(|row| row.ends_with("draining")),
        "{table}"
    );
}
