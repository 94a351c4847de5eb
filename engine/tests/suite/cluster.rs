//! Several nodes, one PostgreSQL (docs/cluster.md), against a real throwaway PostgreSQL: the
//! schema migrated once by two nodes starting together, the store refusing a checkpoint
//! written under a stale epoch (in SQL, whoever writes), and failover between two real daemon
//! processes: the holder killed with SIGKILL, the session's next request on the other node
//! answers from its last checkpoint and says where it came from, for its owner only.

use crate::common;
use crate::common::postgres;

use std::path::Path;
use std::time::{Duration, Instant};

use pyvisor::cluster::checkpoints::{self, Writer};
use pyvisor::cluster::{directory, migrations, Store};
use pyvisor::errors::ClusterError;
use pyvisor_actors::checkpoint::{CheckpointMeta, CheckpointStore, CheckpointStoreConfig};
use serde_json::{json, Value};

use common::{http_get, Daemon};
use postgres::until;

#[tokio::test]
async fn two_nodes_starting_together_migrate_an_empty_store_once() {
    let db = postgres::database().await;
    let config = db.config();
    let (a, b) = tokio::join!(Store::open(&config), Store::open(&config));
    a.expect("the first node opens the store");
    b.expect("the second node opens the store");
    each_migration_applied_once(&db).await;
    // A third node, later, finds nothing to do.
    Store::open(&db.config())
        .await
        .expect("a later node opens the migrated store");
}

/// Checks that the store `db` lists every migration applied, each once.
pub(crate) async fn each_migration_applied_once(db: &postgres::Database) {
    let versions: Vec<i32> = (db.connect().await)
        .query("SELECT version FROM pyvisor_schema ORDER BY version", &[])
        .await
        .expect("read the schema versions")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let expected: Vec<i32> = (1..=migrations::latest()).collect();
    assert_eq!(versions, expected, "each migration applied exactly once");
}

#[tokio::test]
async fn an_unreachable_store_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config: tokio_postgres::Config =
        format!("host={} user=nobody dbname=none", dir.path().display())
            .parse()
            .expect("a connection string");
    match Store::open(&config).await {
        Err(ClusterError::Unreachable(message)) => assert!(!message.is_empty()),
        Err(other) => panic!("expected Unreachable, got {other}"),
        Ok(_) => panic!("no server listens there"),
    }
}

/// Uploads, as `node_id` under `epoch`, a checkpoint of session `s-1` holding `payload`,
/// taken after its execution `execution_count`.
async fn upload(
    store: &Store,
    node_id: &str,
    epoch: i64,
    payload: &[u8],
    execution_count: u64,
) -> Result<checkpoints::Uploaded, ClusterError> {
    let dir = tempfile::tempdir().expect("temp dir");
    let local = CheckpointStore::open(CheckpointStoreConfig::new(dir.path())).expect("a store");
    let meta = CheckpointMeta {
        execution_count,
        ..CheckpointMeta::default()
    };
    let saved = local
        .save("id:s-1", &meta, payload)
        .expect("save a checkpoint");
    let writer = Writer {
        session_id: "s-1",
        key: "id:s-1",
        node_id,
        epoch,
    };
    checkpoints::upload(store, &local, writer, saved.id).await
}

#[tokio::test]
async fn a_paused_holders_stale_checkpoint_is_refused_by_the_store() {
    let db = postgres::database().await;
    let store = Store::open(&db.config()).await.expect("open the store");
    let ttl = Duration::from_millis(500);
    directory::join(&store, "node-a", "http://127.0.0.1:1")
        .await
        .unwrap();
    directory::join(&store, "node-b", "http://127.0.0.1:2")
        .await
        .unwrap();
    let epoch_a = directory::register(&store, "node-a", ttl, new_session("s-1", None))
        .await
        .expect("register");
    assert_eq!(epoch_a, 1);

    // Node B cannot claim a session whose lease still runs.
    let early = directory::claim(&store, "node-b", ttl, "s-1")
        .await
        .unwrap();
    assert_eq!(early, None, "a running lease is not taken");

    // Node A is paused: it renews nothing, and its lease runs out by the store's clock.
    until("the lease of node A ran out", || async {
        let entry = directory::lookup(&store, "s-1").await.unwrap();
        entry.is_some_and(|entry| entry.expired)
    })
    .await;
    let claim = directory::claim(&store, "node-b", ttl, "s-1")
        .await
        .unwrap()
        .expect("an expired lease is claimed");
    assert_eq!(claim.epoch, 2, "each claim bumps the epoch");
    assert_eq!(claim.from_node.as_deref(), Some("node-a"));

    // Node A wakes up: its heartbeat learns that it lost the session...
    let held = [directory::Held {
        session_id: "s-1".into(),
        epoch: epoch_a,
        execution_count: 5,
    }];
    let renewed = directory::renew(&store, "node-a", ttl, &held)
        .await
        .unwrap();
    assert!(renewed.is_empty(), "node A no longer holds s-1");

    // ...and its checkpoint, written under epoch 1, is refused.
    match upload(&store, "node-a", epoch_a, b"stale state of node A", 5).await {
        Err(ClusterError::Fenced { epoch, .. }) => assert_eq!(epoch, 1),
        other => panic!("a stale write must be fenced, got {other:?}"),
    }

    // The fence is in SQL: a writer that bypasses the node's code is refused too.
    let client = db.connect().await;
    let raw = client
        .execute(
            "INSERT INTO pyvisor_checkpoints
                 (session_id, checkpoint_id, epoch, node_id, execution_count, manifest, payload)
             VALUES ('s-1', 'c-9', 1, 'node-a', 9, '\\x00', '\\x00')",
            &[],
        )
        .await
        .expect_err("the store refuses a row under epoch 1");
    assert!(directory::is_fenced(&raw), "{raw}");

    // The new holder writes under epoch 2, and that is what a later claim restores.
    upload(&store, "node-b", claim.epoch, b"state of node B", 13)
        .await
        .expect("the holder's write is taken");
    let dir_c = tempfile::tempdir().expect("temp dir");
    let local_c = CheckpointStore::open(CheckpointStoreConfig::new(dir_c.path())).unwrap();
    let scratch = tempfile::tempdir().expect("temp dir");
    let downloaded = checkpoints::download(&store, &local_c, scratch.path(), "s-1", "id:s-1")
        .await
        .expect("download")
        .expect("the store has a checkpoint");
    assert_eq!(downloaded.node_id, "node-b");
    assert_eq!(downloaded.execution_count, 13, "{downloaded:?}");
    let loaded = local_c
        .load("id:s-1", None)
        .expect("the checkpoint is local now");
    assert_eq!(loaded.payload, b"state of node B");
    assert_eq!(
        loaded.info.meta.execution_count, 13,
        "the session restored from it counts on from its count"
    );
}

/// Alice's session `session_id`, to register under `quota`.
pub(crate) fn new_session(session_id: &str, quota: Option<usize>) -> directory::NewSession<'_> {
    directory::NewSession {
        session_id,
        name: None,
        owner: Some("alice"),
        owner_quota: quota,
        limits: None,
    }
}

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

/// A cluster node's config: the store, its id, a short lease, one warm worker, and the URL
/// where other nodes reach it.
pub(crate) fn advertised_node_config(
    home: &Path,
    db: &postgres::Database,
    node_id: &str,
    url: &str,
) -> std::path::PathBuf {
    node_config_with(home, db, node_id, url, "")
}

/// [`advertised_node_config`] with `extra` TOML sections.
pub(crate) fn node_config_with(
    home: &Path,
    db: &postgres::Database,
    node_id: &str,
    url: &str,
    extra: &str,
) -> std::path::PathBuf {
    std::fs::create_dir_all(home).expect("the node's home");
    let path = home.join("pyvisor.toml");
    let text = format!(
        "[pool]\nmin_idle = 1\n\n[cluster]\nstore = \"{}\"\nnode_id = \"{node_id}\"\n\
         advertise_url = \"{url}\"\nlease_ttl_s = 1.0\n\n{extra}",
        db.url()
    );
    std::fs::write(&path, text).expect("write the node's config");
    path
}

/// A session of alice's on `node` that ran `code`, and the id of the checkpoint of it that
/// the node has uploaded to the store `store` connects to.
pub(crate) async fn checkpointed_session(
    node: &Daemon,
    store: &tokio_postgres::Client,
    code: &str,
) -> (String, String) {
    let mut conn = node.connect().await;
    let created = conn.call("session.create", json!({"owner": "alice"})).await;
    let session = created["session_id"].as_str().expect("an id").to_owned();
    let ran = execute(node, &session, "alice", code).await;
    assert_eq!(ran["result"]["status"], "ok", "{ran}");
    let taken = conn
        .call("session.checkpoint", json!({"session_id": session}))
        .await;
    let checkpoint = taken["checkpoint_id"].as_str().expect("an id").to_owned();
    until("the node uploaded the checkpoint", || async {
        let row = store
            .query_opt(
                "SELECT checkpoint_id FROM pyvisor_checkpoints WHERE session_id = $1",
                &[&session],
            )
            .await
            .expect("query the store");
        row.is_some_and(|row| row.get::<_, String>(0) == checkpoint)
    })
    .await;
    (session, checkpoint)
}

/// Runs `code` in alice's `session` on `node` until the answer is not `-32008`: the lease of
/// the node that held the session ran out, and `node` took it over. That answer.
pub(crate) async fn execute_once_free(node: &Daemon, session: &str, code: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = execute(node, session, "alice", code).await;
        if answer["error"]["code"] != -32008 {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "the lease never ran out: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Nodes `node-a` and `node-b` of the store `db`, their homes under `homes`.
pub(crate) async fn two_nodes(db: &postgres::Database, homes: &Path) -> (Daemon, Daemon) {
    two_nodes_with(db, homes, "").await
}

/// [`two_nodes`] with `extra` TOML sections in both configs.
async fn two_nodes_with(db: &postgres::Database, homes: &Path, extra: &str) -> (Daemon, Daemon) {
    let mut nodes = Vec::new();
    for id in ["node-a", "node-b"] {
        let home = homes.join(id);
        let config = node_config_with(&home, db, id, "http://127.0.0.1:9", extra);
        nodes.push(Daemon::start_in(&home, &["--config", config.to_str().unwrap()], &[]).await);
    }
    let node_b = nodes.pop().expect("two nodes");
    (nodes.pop().expect("two nodes"), node_b)
}

/// `session.execute` of `code` in `session` for `owner`, as the whole response.
pub(crate) async fn execute(daemon: &Daemon, session: &str, owner: &str, code: &str) -> Value {
    let mut conn = daemon.connect().await;
    let params = json!({"session_id": session, "owner": owner, "code": code});
    conn.request("session.execute", params).await.1
}

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

/// Nodes `ids` of the store `db`, their homes under `homes`, each serving HTTP on a port of
/// its own that it advertises: the nodes and their ports.
pub(crate) async fn http_nodes(
    db: &postgres::Database,
    homes: &Path,
    ids: &[&str],
) -> (Vec<Daemon>, Vec<u16>) {
    let (mut nodes, mut ports) = (Vec::new(), Vec::new());
    for id in ids {
        let home = homes.join(id);
        let port = free_port();
        ports.push(port);
        let addr = format!("127.0.0.1:{port}");
        let config = advertised_node_config(&home, db, id, &format!("http://{addr}"));
        let args = ["--config", config.to_str().unwrap(), "--http", &addr];
        nodes.push(Daemon::start_in(&home, &args, &[]).await);
    }
    (nodes, ports)
}

/// A loopback port nobody listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
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

/// The value of the series `series` (name and labels as exported) in a `/metrics` text;
/// 0 when it is absent.
pub(crate) fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.trim().parse().expect("a number"))
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
