//! The session directory across the nodes of one real PostgreSQL (docs/cluster.md): an
//! owner's quota counts its sessions on every node, whether registered at the store's API by
//! two nodes at once, created on real daemons or forked; and a session's name, taken on one
//! node, is taken on every node (in SQL too), for its owner only.

use crate::cluster::{new_session, two_nodes, two_nodes_with};
use crate::common::postgres;
use crate::common::Daemon;

use std::time::Duration;

use pyvisor::cluster::{directory, Store};
use pyvisor::errors::ClusterError;
use serde_json::{json, Value};

#[tokio::test]
async fn an_owners_quota_counts_its_sessions_across_nodes() {
    let db = postgres::database().await;
    let store = Store::open(&db.config()).await.expect("open the store");
    let ttl = Duration::from_secs(5);
    for node in ["node-a", "node-b"] {
        directory::join(&store, node, "http://127.0.0.1:1")
            .await
            .unwrap();
    }
    // Two nodes register alice's sessions at once, 8 each, under a quota of 5: 5 are taken.
    let ids: Vec<String> = (0..16).map(|n| format!("s-{n}")).collect();
    let registering = ids.iter().enumerate().map(|(n, id)| {
        let node = ["node-a", "node-b"][n % 2];
        directory::register(&store, node, ttl, new_session(id, Some(5)))
    });
    let outcomes = futures::future::join_all(registering).await;
    let taken = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    assert_eq!(taken, 5, "{outcomes:?}");
    for refused in outcomes.iter().filter_map(|outcome| outcome.as_ref().err()) {
        assert!(
            matches!(refused, ClusterError::TooManySessions { limit: 5, .. }),
            "{refused}"
        );
    }
    // Another owner has a quota of its own.
    let bob = directory::NewSession {
        owner: Some("bob"),
        ..new_session("s-bob", Some(5))
    };
    directory::register(&store, "node-a", ttl, bob)
        .await
        .expect("bob's first session");
}

#[tokio::test]
async fn a_node_refuses_a_session_over_the_owners_quota_held_on_another_node() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let quota = "[limits]\nmax_sessions_per_owner = 1\n";
    let (node_a, node_b) = two_nodes_with(&db, homes.path(), quota).await;
    let created = (node_a.connect().await)
        .call("session.create", json!({"owner": "alice"}))
        .await;
    assert!(created["session_id"].is_string(), "{created}");
    let mut at_b = node_b.connect().await;
    let refused = at_b
        .error_code("session.create", json!({"owner": "alice"}))
        .await;
    assert_eq!(refused, -32005, "alice holds her one session on node A");
    let bob = at_b.call("session.create", json!({"owner": "bob"})).await;
    assert!(bob["session_id"].is_string(), "{bob}");
}

#[tokio::test]
async fn forked_sessions_enter_the_directory_and_count_against_the_quota() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let quota = "[limits]\nmax_sessions_per_owner = 3\n";
    let (node_a, node_b) = two_nodes_with(&db, homes.path(), quota).await;
    let mut at_a = node_a.connect().await;
    let created = at_a.call("session.create", json!({"owner": "alice"})).await;
    let source = created["session_id"].as_str().expect("an id").to_owned();
    let forked = at_a
        .call(
            "session.fork",
            json!({"session_id": source, "owner": "alice"}),
        )
        .await;
    let clone = forked["sessions"][0]["session_id"]
        .as_str()
        .expect("a clone");
    let store = db.connect().await;
    let holder: String = store
        .query_one(
            "SELECT holder FROM pyvisor_sessions WHERE session_id = $1",
            &[&clone],
        )
        .await
        .expect("the clone's directory row")
        .get(0);
    assert_eq!(holder, "node-a");
    // Node B holds alice's third session: one more clone on node A is over the quota.
    let third = (node_b.connect().await)
        .call("session.create", json!({"owner": "alice"}))
        .await;
    assert!(third["session_id"].is_string(), "{third}");
    let params = json!({"session_id": source, "owner": "alice", "count": 1});
    assert_eq!(at_a.error_code("session.fork", params).await, -32005);
    let listed = at_a.call("session.list", json!({"owner": "alice"})).await;
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
}

/// `session.create` of `owner`'s session named `name` on `node`.
async fn create_named(node: &Daemon, owner: &str, name: &str) -> Value {
    let mut conn = node.connect().await;
    conn.call("session.create", json!({"owner": owner, "name": name}))
        .await
}

#[tokio::test]
async fn a_name_taken_on_one_node_is_taken_on_every_node() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (node_a, node_b) = two_nodes(&db, homes.path()).await;
    let first = create_named(&node_a, "alice", "analysis").await;
    let id = first["session_id"].as_str().expect("an id").to_owned();
    assert_eq!(first["attached"], false, "{first}");

    // The same owner's create of that name on node B is an attach to node A's session, as
    // on one node; the directory holds one session of that name.
    let again = create_named(&node_b, "alice", "analysis").await;
    assert_eq!(again["session_id"], id.as_str(), "{again}");
    assert_eq!(again["attached"], true, "{again}");
    let store = db.connect().await;
    let named: i64 = store
        .query_one(
            "SELECT count(*) FROM pyvisor_sessions WHERE name = 'analysis'",
            &[],
        )
        .await
        .expect("count the named sessions")
        .get(0);
    assert_eq!(named, 1);
    // In SQL too, whoever writes: a second row of that owner and name is refused.
    let refused = store
        .execute(
            "INSERT INTO pyvisor_sessions (session_id, name, owner, holder, lease_expires_at,
             epoch) VALUES ('s-x', 'analysis', 'alice', 'node-b', now(), 1)",
            &[],
        )
        .await;
    assert!(refused.is_err(), "a duplicate name entered the directory");

    // Another owner's names are its own.
    let bobs = create_named(&node_b, "bob", "analysis").await;
    assert_ne!(bobs["session_id"], id.as_str(), "{bobs}");
    assert_eq!(bobs["attached"], false, "{bobs}");

    // Two creates of one name at once on the two nodes end with one session.
    let (x, y) = tokio::join!(
        create_named(&node_a, "carol", "shared"),
        create_named(&node_b, "carol", "shared")
    );
    assert_eq!(x["session_id"], y["session_id"], "{x} {y}");
    assert!(
        x["attached"] != y["attached"],
        "one of them attached: {x} {y}"
    );

    // A clone may not take a name its owner has on another node, as on one node.
    let bobs = bobs["session_id"].as_str().expect("an id");
    create_named(&node_a, "bob", "report").await;
    let mut at_b = node_b.connect().await;
    let (_, forked) = at_b
        .request(
            "session.fork",
            json!({"session_id": bobs, "owner": "bob", "names": ["report"]}),
        )
        .await;
    assert_eq!(forked["error"]["code"], -32602, "{forked}");
    assert!(
        forked["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("\"report\" is taken")),
        "{forked}"
    );
    let listed = at_b.call("session.list", json!({"owner": "bob"})).await;
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(1),
        "no clone stays: {listed}"
    );
}
