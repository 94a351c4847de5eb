//! The memory feature across the nodes of a cluster (docs/memory.md#several-nodes), with two
//! real daemon processes on one real throwaway PostgreSQL and real Python workers: a failure
//! learnt on node A warns a like execution on node B, for its owner only; feedback given on
//! one node silences the pattern on the other; and a store that goes away under a node
//! leaves its executions working while the memory says it lost its store. And the store
//! itself, as two engines share it: ids apart, each sees the other's rows only, counts add up.

use crate::common;
use crate::common::postgres;

use std::path::Path;
use std::time::{Duration, Instant};

use pyvisor::cluster::memory::SharedOutcomes;
use pyvisor_actors::memory::{FeedbackRecord, OutcomeRecord, OutcomeStore, PatternRecord, Write};
use serde_json::{json, Value};

use common::Daemon;
use postgres::until;

const SETUP: &str = "import json";
const FAILING: &str = "data = json.loads(\"{'a': 1}\")";
const FIX: &str = "data = json.loads('{\"a\": 1}')";

/// A node of the cluster in `db`, its home at `home`, with a lease of `lease_s` seconds.
async fn node(db: &postgres::Database, home: &Path, node_id: &str, lease_s: f64) -> Daemon {
    std::fs::create_dir_all(home).expect("the node's home");
    let config = home.join("pyvisor.toml");
    let text = format!(
        "[pool]\nmin_idle = 1\n\n[cluster]\nstore = \"{}\"\nnode_id = \"{node_id}\"\n\
         advertise_url = \"http://127.0.0.1:9\"\nlease_ttl_s = {lease_s}\n",
        db.url()
    );
    std::fs::write(&config, text).expect("write the node's config");
    Daemon::start_in(home, &["--config", config.to_str().unwrap()], &[]).await
}

/// A new session of `owner`'s on `node`.
async fn create(node: &Daemon, owner: &str) -> String {
    let mut conn = node.connect().await;
    let created = conn.call("session.create", json!({"owner": owner})).await;
    created["session_id"].as_str().expect("an id").to_owned()
}

/// The result of `code` in `owner`'s `session` on `node`.
async fn execute(node: &Daemon, session: &str, owner: &str, code: &str) -> Value {
    let mut conn = node.connect().await;
    let params = json!({"session_id": session, "owner": owner, "code": code});
    conn.call("session.execute", params).await
}

/// `memory.check` of `code` for `owner` on `node`: its insights.
async fn check(node: &Daemon, owner: &str, code: &str) -> Vec<Value> {
    let mut conn = node.connect().await;
    let checked = conn
        .call("memory.check", json!({"owner": owner, "code": code}))
        .await;
    checked["insights"].as_array().expect("insights").clone()
}

/// Two sessions of `owner`'s on `node` that fail with [`FAILING`] and then run [`FIX`].
async fn fail_twice(node: &Daemon, owner: &str) {
    for _ in 0..2 {
        let session = create(node, owner).await;
        assert_eq!(execute(node, &session, owner, SETUP).await["status"], "ok");
        let failed = execute(node, &session, owner, FAILING).await;
        assert_eq!(failed["status"], "error", "{failed}");
        assert_eq!(execute(node, &session, owner, FIX).await["status"], "ok");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failure_on_one_node_warns_a_like_execution_on_another_for_its_owner_only() {
    let db = postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let node_a = node(&db, &homes.path().join("a"), "node-a", 5.0).await;
    let node_b = node(&db, &homes.path().join("b"), "node-b", 5.0).await;

    fail_twice(&node_a, "alice").await;
    until("node B knows node A's failures", || async {
        check(&node_b, "alice", FAILING).await.len() == 1
    })
    .await;
    let suggestion = check(&node_b, "alice", FAILING).await[0]["suggestion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        suggestion.contains("json.loads('{"),
        "what worked on A: {suggestion}"
    );

    // Another owner learns nothing from alice's failures, on either node.
    assert_eq!(check(&node_b, "bob", FAILING).await, Vec::<Value>::new());
    assert_eq!(check(&node_a, "bob", FAILING).await, Vec::<Value>::new());
    let bobs = create(&node_b, "bob").await;
    execute(&node_b, &bobs, "bob", SETUP).await;
    let unwarned = execute(&node_b, &bobs, "bob", FAILING).await;
    assert_eq!(unwarned["insights"], json!([]), "{unwarned}");

    // Alice's like execution on node B carries the insight.
    let session = create(&node_b, "alice").await;
    execute(&node_b, &session, "alice", SETUP).await;
    let warned = execute(&node_b, &session, "alice", FAILING).await;
    let insight = &warned["insights"][0];
    assert_eq!(insight["kind"], "failure_pattern", "{warned}");
    let insight_id = insight["id"].as_str().expect("an insight id").to_owned();
    for evidence in insight["evidence"].as_array().expect("evidence") {
        let id = evidence.as_str().expect("an outcome id");
        assert!(id.starts_with("m-"), "{warned}");
    }

    // Feedback on node A on the insight node B showed: A learns of it, and the pattern it
    // marks wrong twice stops firing on B too.
    let mut at_a = node_a.connect().await;
    let feedback = json!({"insight_id": insight_id, "score": -1});
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, answer) = at_a.request("memory.feedback", feedback.clone()).await;
        if answer["result"] == json!({}) {
            break;
        }
        // Unknown until node A has taken in node B's insight.
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
        assert!(Instant::now() < deadline, "node A never knew the insight");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !check(&node_b, "alice", FAILING).await.is_empty(),
        "one wrong mark does not silence a pattern"
    );
    at_a.call("memory.feedback", feedback).await;
    until("the pattern is silenced on node B", || async {
        check(&node_b, "alice", FAILING).await.is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_gone_under_a_node_leaves_executions_working_and_memory_warns() {
    let db = postgres::database().await;
    let home = tempfile::tempdir().expect("temp dir");
    // The node reaches the store through a link to its socket, which the test cuts.
    let (via_link, link) = db.through_link(&home.path().join("link"));
    // A long lease: the node keeps serving its session while the store is gone.
    let node = node(&via_link, &home.path().join("a"), "node-a", 600.0).await;
    let session = create(&node, "alice").await;
    assert_eq!(
        execute(&node, &session, "alice", SETUP).await["status"],
        "ok"
    );
    let mut conn = node.connect().await;
    let stats = conn.call("memory.stats", json!({})).await;
    assert_eq!(stats["store"], "postgresql (the cluster store)", "{stats}");
    assert!(stats["warning"].is_null(), "{stats}");

    link.cut(&db).await;

    // Executions go on, failures and all, and the memory still warns from what it holds.
    for _ in 0..2 {
        let failed = execute(&node, &session, "alice", FAILING).await;
        assert_eq!(failed["status"], "error", "{failed}");
        let fixed = execute(&node, &session, "alice", FIX).await;
        assert_eq!(fixed["status"], "ok", "{fixed}");
    }
    until("the memory says it lost its store", || async {
        let stats = node.connect().await.call("memory.stats", json!({})).await;
        stats["warning"]
            .as_str()
            .is_some_and(|warning| warning.contains("cluster store"))
    })
    .await;
    assert_eq!(check(&node, "alice", FAILING).await.len(), 1);
    let found = conn
        .call("memory.search", json!({"owner": "alice", "query": FAILING}))
        .await;
    assert!(
        !found.as_array().expect("outcomes").is_empty(),
        "what memory holds, without the store: {found}"
    );
}

/// A failure of alice's with id `id`, and its pattern, numbered `number` by its engine.
fn failure(id: i64, number: u32) -> [Write; 2] {
    let outcome = OutcomeRecord {
        id,
        owner: "alice".into(),
        session_id: "s-1".into(),
        execution_id: format!("e-{id}"),
        at_ms: 1_000 + id,
        code: FAILING.into(),
        status: "error".into(),
        error_type: Some("JSONDecodeError".into()),
        error_message: Some("Expecting property name".into()),
        normalized_message: Some("expecting property name".into()),
        duration_ms: 1.0,
        reads: vec!["json".into()],
        meta: None,
        failing_line: Some(1),
        vector: vec![1, -2, 3],
        embedder: "test".into(),
    };
    let pattern = PatternRecord {
        id: number,
        owner: "alice".into(),
        error_type: "JSONDecodeError".into(),
        normalized_message: "expecting property name".into(),
        shape: "call".into(),
        wrong: 0,
        right: 0,
        fired: 0,
    };
    [Write::Outcome(Box::new(outcome)), Write::Pattern(pattern)]
}

/// Feedback `score` on pattern `number` of its engine.
fn feedback(number: u32, score: i8) -> Write {
    Write::Feedback(FeedbackRecord {
        owner: "alice".into(),
        insight: None,
        outcome: None,
        pattern: Some(number),
        score,
        comment: None,
        at_ms: 2_000,
    })
}

#[tokio::test]
async fn two_engines_sharing_the_store_get_apart_ids_and_each_others_rows() {
    let db = postgres::database().await;
    let config = db.config();
    // The store blocks on a runtime of its own: off this one.
    tokio::task::spawn_blocking(move || {
        let mut a = SharedOutcomes::open(&config, "node-a").expect("node A's store");
        let mut b = SharedOutcomes::open(&config, "node-b").expect("node B's store");
        let loaded = b.load(100, None).expect("B loads the empty store");
        assert!(loaded.outcomes.is_empty());
        let (base_a, base_b) = (a.id_base().unwrap(), b.id_base().unwrap());
        let (base_a, base_b) = (base_a.expect("a block"), base_b.expect("a block"));
        assert!(base_a.abs_diff(base_b) >= 1 << 32, "{base_a} {base_b}");

        a.apply(&failure(base_a + 1, 0))
            .expect("A writes a failure");
        let seen = b.changes(loaded.mark).unwrap().expect("a shared store");
        assert_eq!(seen.outcomes.len(), 1);
        assert_eq!(seen.outcomes[0].id, base_a + 1);
        assert_eq!(seen.outcomes[0].reads, vec!["json".to_owned()]);
        assert_eq!(seen.outcomes[0].vector, vec![1, -2, 3]);
        assert_eq!(seen.patterns.len(), 1);
        assert!(seen.mark > loaded.mark);
        let own = a.changes(loaded.mark).unwrap().expect("a shared store");
        assert!(
            own.outcomes.is_empty(),
            "an engine is not told its own outcomes"
        );
        assert_eq!(own.mark, seen.mark, "but goes past them");
        let quiet = b.changes(seen.mark).unwrap().expect("a shared store");
        assert!(quiet.outcomes.is_empty() && quiet.patterns.is_empty());

        // Each engine numbers the pattern itself; their feedback adds up in the store.
        b.apply(&failure(base_b + 1, 7))
            .expect("B writes a like failure");
        a.apply(&[feedback(0, -1)]).expect("A marks it wrong");
        b.apply(&[feedback(7, -1)]).expect("B marks it wrong");
        let counted = a.changes(own.mark).unwrap().expect("a shared store");
        let pattern = counted.patterns.last().expect("the pattern changed");
        assert_eq!((pattern.wrong, pattern.right), (2, 0), "{pattern:?}");
        assert_eq!(counted.outcomes.len(), 1, "B's failure only");

        // A later engine loads it all, with the counts of both.
        let mut c = SharedOutcomes::open(&config, "node-c").expect("node C's store");
        let all = c.load(100, None).expect("C loads");
        assert_eq!(all.outcomes.len(), 2);
        assert_eq!(all.patterns.len(), 1);
        assert_eq!(all.patterns[0].wrong, 2);
        let fetched = c.fetch(&[base_a + 1, base_b + 1, 12345]).expect("fetch");
        assert_eq!(fetched.len(), 2);
    })
    .await
    .expect("the store test ran");
}
