//! Several nodes, one PostgreSQL (docs/cluster.md), against a real throwaway PostgreSQL: the
//! store itself, at its API: the schema migrated once by two nodes starting together, an
//! unreachable store a clear error, and the store refusing a checkpoint written under a stale
//! epoch (in SQL, whoever writes). And the helpers the `cluster_*` modules share to start nodes
//! and run code on them; the directory across nodes is tested in `cluster_directory`, which node
//! serves a session (forwarding, failover, draining) in `cluster_takeover`.

use crate::common;
use crate::common::postgres;

use std::path::Path;
use std::time::{Duration, Instant};

use pyvisor::cluster::checkpoints::{self, Writer};
use pyvisor::cluster::{directory, migrations, Store};
use pyvisor::errors::ClusterError;
use pyvisor_actors::checkpoint::{CheckpointMeta, CheckpointStore, CheckpointStoreConfig};
use serde_json::{json, Value};

use common::Daemon;
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
pub(crate) async fn two_nodes_with(
    db: &postgres::Database,
    homes: &Path,
    extra: &str,
) -> (Daemon, Daemon) {
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

/// The value of the series `series` (name and labels as exported) in a `/metrics` text;
/// 0 when it is absent.
pub(crate) fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.trim().parse().expect("a number"))
}
