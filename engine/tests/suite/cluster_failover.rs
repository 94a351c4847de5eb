//! Failover under load, against a real throwaway PostgreSQL and real daemon processes: the
//! sessions of a killed node taken over together on one survivor, each claimed and restored
//! once; a request whose remembered holder lost the session, counted once as forwarded
//! when the store's holder answers it; the execution count a failover admits as lost,
//! taken from the holder that died, not from the one before it; and a session taken over
//! counting its executions on from its checkpoint's count, which its first result names.

use crate::common;
use crate::common::postgres;

use std::time::Duration;

use serde_json::json;

use nix::sys::signal::Signal;
use pyvisor::cluster::directory::{self, Held};
use pyvisor::cluster::Store;

use super::cluster::{
    checkpointed_session, execute, execute_once_free, http_nodes, metric, new_session, two_nodes,
};
use common::http_get;
use postgres::until;

#[tokio::test]
async fn a_dead_nodes_sessions_are_restored_together_on_one_node_each_once() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (mut node_a, node_b) = two_nodes(&db, homes.path()).await;
    let store = db.connect().await;
    let mut sessions = Vec::new();
    for n in 0..3 {
        sessions.push(checkpointed_session(&node_a, &store, &format!("x = {n}")).await);
    }
    node_a.child.kill().expect("kill -9 node A");
    node_a.child.wait().expect("reap node A");

    // The store's checkpoints stay locked until the three take-overs wait for them at the
    // same time. Taken over one after another, only one would ever wait, and this would
    // time out.
    let mut locker = db.connect().await;
    let lock = locker.transaction().await.expect("begin");
    lock.batch_execute("LOCK TABLE pyvisor_checkpoints IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock the checkpoints");
    let requests = sessions
        .iter()
        .map(|(session, _)| execute_once_free(&node_b, session, "x + 100"));
    let release = async {
        until(
            "the three take-overs wait for the checkpoints together",
            || async {
                let waiting: i64 = store
                    .query_one(
                        "SELECT count(*) FROM pg_locks
                     WHERE relation = 'pyvisor_checkpoints'::regclass AND NOT granted",
                        &[],
                    )
                    .await
                    .expect("read the locks")
                    .get(0);
                waiting == 3
            },
        )
        .await;
        lock.rollback().await.expect("release the checkpoints");
    };
    let (answers, ()) = tokio::join!(futures::future::join_all(requests), release);

    for (n, ((session, checkpoint), answer)) in sessions.iter().zip(&answers).enumerate() {
        let result = &answer["result"];
        assert_eq!(result["status"], "ok", "{answer}\n{}", node_b.log());
        assert_eq!(result["result"]["repr"], (n + 100).to_string(), "{answer}");
        let recovered = &result["recovered"];
        assert_eq!(recovered["from_node"], "node-a", "{recovered}");
        assert_eq!(
            recovered["checkpoint_id"],
            checkpoint.as_str(),
            "{recovered}"
        );
        // Claimed once: one epoch bump after the create.
        let row = store
            .query_one(
                "SELECT holder, epoch FROM pyvisor_sessions WHERE session_id = $1",
                &[session],
            )
            .await
            .expect("the directory row");
        assert_eq!(row.get::<_, String>(0), "node-b");
        assert_eq!(row.get::<_, i64>(1), 2, "one claim of {session}");
        // Restored once: its next result says nothing more, and the state goes on.
        let next = execute(&node_b, session, "alice", "x = x + 1; x").await;
        assert_eq!(
            next["result"]["result"]["repr"],
            (n + 1).to_string(),
            "{next}"
        );
        assert!(next["result"]["recovered"].is_null(), "{next}");
    }
    let took_over = node_b.log().matches("took the session over").count();
    assert_eq!(took_over, 3, "{}", node_b.log());
}

#[tokio::test]
async fn a_forward_refused_by_the_remembered_holder_is_counted_once() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (nodes, ports) = http_nodes(&db, homes.path(), &["node-a", "node-b", "node-c"]).await;
    let (node_a, node_b, node_c) = (&nodes[0], &nodes[1], &nodes[2]);
    let forwarded_by_b = || async {
        let (_, text) = http_get(ports[1], "/metrics", None).await;
        metric(&text, "pyvisor_cluster_forwarded_total")
    };
    let store = db.connect().await;
    let (session, _) = checkpointed_session(node_a, &store, "x = 41").await;

    // Node B forwards to node A, and remembers it as the holder.
    let there = execute(node_b, &session, "alice", "x").await;
    assert_eq!(there["result"]["node"], "node-a", "{there}");
    assert_eq!(forwarded_by_b().await, 1.0);

    // Node A is paused past its lease; node C takes the session over; node A wakes and
    // gives it up.
    node_a.signal(Signal::SIGSTOP);
    until("node A's lease ran out", || async {
        store
            .query_one(
                "SELECT lease_expires_at < now() FROM pyvisor_sessions WHERE session_id = $1",
                &[&session],
            )
            .await
            .expect("the directory row")
            .get(0)
    })
    .await;
    let taken = execute_once_free(node_c, &session, "x = x + 1; x").await;
    assert_eq!(taken["result"]["result"]["repr"], "42", "{taken}");
    node_a.signal(Signal::SIGCONT);
    until("node A gave the session up", || async {
        node_a
            .log()
            .contains("lost the session's lease to another node")
    })
    .await;

    // Node B asks node A first, which refuses; the store says node C; node C answers. One
    // request, one forward.
    let moved = execute(node_b, &session, "alice", "x").await;
    assert_eq!(moved["result"]["result"]["repr"], "42", "{moved}");
    assert_eq!(moved["result"]["node"], "node-c", "{moved}");
    assert_eq!(forwarded_by_b().await, 2.0);
}

#[tokio::test]
async fn a_failover_counts_the_executions_the_dead_holder_reported_not_its_predecessor() {
    let db = postgres::database().await;
    let store = Store::open(&db.config()).await.expect("open the store");
    let (long, gone) = (Duration::from_secs(60), Duration::ZERO);
    let beat = |node: &'static str, epoch: i64, executions: i64, ttl: Duration| {
        let held = [Held {
            session_id: "s-1".to_owned(),
            epoch,
            execution_count: executions,
        }];
        let store = &store;
        async move {
            let renewed = directory::renew(store, node, ttl, &held).await;
            assert_eq!(renewed.expect("a heartbeat"), ["s-1"], "{node} holds s-1");
        }
    };
    for node in ["node-a", "node-b"] {
        directory::join(&store, node, "http://127.0.0.1:9")
            .await
            .expect("join");
    }
    let epoch = directory::register(&store, "node-a", long, new_session("s-1", None))
        .await
        .expect("register");
    // Node A reports 15 executions at its last heartbeat, then dies (its lease ends now).
    beat("node-a", epoch, 15, gone).await;
    let claim = |node: &'static str| {
        let store = &store;
        async move {
            until("the lease ran out", || async {
                let lookup = directory::lookup(store, "s-1").await.expect("a lookup");
                lookup.expect("in the directory").expired
            })
            .await;
            (directory::claim(store, node, long, "s-1").await)
                .expect("a claim")
                .expect("the lease ran out")
        }
    };
    let by_b = claim("node-b").await;
    assert_eq!(by_b.execution_count, 15, "{by_b:?}");
    // Node B restored a checkpoint of 10 executions and ran 2 more: it reports 12, then dies.
    beat("node-b", by_b.epoch, 12, gone).await;
    let by_a = claim("node-a").await;
    assert_eq!(by_a.from_node.as_deref(), Some("node-b"), "{by_a:?}");
    assert_eq!(
        by_a.execution_count, 12,
        "node B's own count, not node A's older and larger one"
    );
}

/// The execution count of `session` in the store's directory and of its checkpoint there.
async fn stored_counts(store: &tokio_postgres::Client, session: &str) -> (i64, i64) {
    let row = store
        .query_one(
            "SELECT s.execution_count, c.execution_count FROM pyvisor_sessions s
             JOIN pyvisor_checkpoints c USING (session_id) WHERE s.session_id = $1",
            &[&session],
        )
        .await
        .expect("the session and its checkpoint in the store");
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_session_taken_over_counts_on_from_its_checkpoint_and_says_so() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (mut node_a, node_b) = two_nodes(&db, homes.path()).await;
    let store = db.connect().await;
    let mut conn = node_a.connect().await;
    let created = conn.call("session.create", json!({"owner": "alice"})).await;
    let session = created["session_id"].as_str().expect("an id").to_owned();
    for code in ["x = 1", "x += 1", "x += 1"] {
        let ran = execute(&node_a, &session, "alice", code).await;
        assert_eq!(ran["result"]["status"], "ok", "{ran}");
    }
    until("node A's third execution is in the store", || async {
        let row = store
            .query_opt(
                "SELECT execution_count FROM pyvisor_checkpoints WHERE session_id = $1",
                &[&session],
            )
            .await
            .expect("query the store");
        row.is_some_and(|row| row.get::<_, i64>(0) == 3)
    })
    .await;
    node_a.child.kill().expect("kill -9 node A");
    node_a.child.wait().expect("reap node A");

    // The session comes back to execution 3 and counts on from there.
    let back = execute_once_free(&node_b, &session, "x").await;
    let result = &back["result"];
    assert_eq!(result["result"]["repr"], "3", "{back}");
    assert_eq!(result["recovered"]["execution_count"], 3, "{back}");
    assert_eq!(result["execution_count"], 4, "{back}");
    let next = execute(&node_b, &session, "alice", "x += 1").await;
    assert_eq!(next["result"]["execution_count"], 5, "{next}");
    // Node B's heartbeat and upload carry the session's count, not one on top of the other.
    until("node B recorded execution 5", || async {
        stored_counts(&store, &session).await == (5, 5)
    })
    .await;
}
