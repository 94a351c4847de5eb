//! What a cluster costs and how fast it recovers, from one run against a throwaway
//! PostgreSQL and real `pyvisor serve` nodes (docs/cluster.md, "Measuring it"):
//!
//! - `x = 1` over the Unix socket on a node with `[cluster]`, against a node without it;
//! - the same session's `x = 1` sent to another node, which forwards it to the holder;
//! - `x = 1` over HTTP (keep-alive) straight to the holder, and the same through HAProxy
//!   (the routing of `examples/cluster/haproxy.cfg`, started on loopback by the bench): what
//!   HAProxy adds;
//! - a durable reply (`[state] durability = "reply"`, `x += 1`): with `[cluster]` it waits
//!   for the checkpoint's commit in PostgreSQL, without it for the local file;
//! - failover: SIGKILL of the node holding a session, then the time until another node
//!   answers for it with its state (the default lease, 5 s, plus the restore).
//!
//! Run: `cargo bench -p pyvisor --bench cluster` (`PYVISOR_BENCH_QUICK=1` for a short run).
//! It needs PostgreSQL's server binaries and HAProxy (`scripts/cluster-packages.sh`).

#[path = "../tests/suite/common/postgres.rs"]
mod postgres;

mod common;
mod daemon_process;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use pyvisor::client::Client;
use pyvisor::rpc::wire::{CreateParams, ExecuteParams};

use common::{quantile, sorted};
use daemon_process::{connect, start_daemon, DaemonGuard};

/// p50 and p99 of `samples`, as the README quotes them.
fn summary(samples: Vec<Duration>) -> (Duration, Duration) {
    let samples = sorted(samples);
    (quantile(&samples, 0.5), quantile(&samples, 0.99))
}

fn print(name: &str, (p50, p99): (Duration, Duration), against: Option<(Duration, Duration)>) {
    let ratio = against
        .map(|(base, _)| {
            format!(
                "  ({:.2}× the first row)",
                p50.as_secs_f64() / base.as_secs_f64()
            )
        })
        .unwrap_or_default();
    println!(
        "{name:<52} p50 {:>9.1} µs   p99 {:>9.1} µs{ratio}",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
}

/// Counters of the bench's database, from PostgreSQL's cumulative statistics.
struct StoreWork {
    commits: i64,
    /// Rows inserted, updated and deleted.
    rows: i64,
    /// Bytes of write-ahead log the server wrote (all its databases: the bench's only).
    wal_bytes: i64,
}

/// The store's counters now. PostgreSQL publishes a backend's statistics within a second of
/// its transactions; the wait lets the last ones arrive.
async fn store_work(stats: &tokio_postgres::Client) -> StoreWork {
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stats
        .execute("SELECT pg_stat_clear_snapshot()", &[])
        .await
        .expect("a fresh statistics snapshot");
    let row = stats
        .query_one(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
             FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("read pg_stat_database");
    StoreWork {
        commits: row.get(0),
        rows: row.get(1),
        wal_bytes: row.get(2),
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// A node's home, config and HTTP port; `cluster` is the store's connection string, or
/// `None` for a daemon alone.
struct Node {
    home: PathBuf,
    config: PathBuf,
    port: u16,
}

impl Node {
    fn new(root: &Path, id: &str, cluster: Option<&str>, durable: bool) -> Node {
        let home = root.join(id);
        std::fs::create_dir_all(&home).expect("the node's home");
        let port = free_port();
        let mut text = String::from("[pool]\nmin_idle = 2\n");
        if durable {
            text.push_str("\n[state]\ndurability = \"reply\"\n");
        }
        if let Some(store) = cluster {
            text.push_str(&format!(
                "\n[cluster]\nstore = \"{store}\"\nnode_id = \"{id}\"\n\
                 advertise_url = \"http://127.0.0.1:{port}\"\n"
            ));
        }
        let config = home.join("pyvisor.toml");
        std::fs::write(&config, text).expect("write the node's config");
        Node { home, config, port }
    }

    fn start(&self) -> DaemonGuard {
        let args = [
            "--config".to_owned(),
            self.config.display().to_string(),
            "--http".to_owned(),
            format!("127.0.0.1:{}", self.port),
        ];
        // Warnings of forwards to a killed node would bury the figures.
        start_daemon(&self.home, &args, &[("PYVISOR_LOG", "error")])
    }

    fn socket(&self) -> PathBuf {
        self.home.join("pyvisor.sock")
    }
}

/// Round trips of `code` in `session` through `client`, after a warm-up.
async fn round_trips(client: &Client, session: &str, code: &str, rounds: usize) -> Vec<Duration> {
    let params = ExecuteParams::new(session.to_owned(), code);
    for _ in 0..rounds.min(100) {
        client.execute(params.clone()).await.expect("warm up");
    }
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let result = client.execute(params.clone()).await.expect("execute");
        samples.push(start.elapsed());
        assert!(result.error.is_none(), "{:?}", result.error);
    }
    samples
}

/// HAProxy on a free loopback port in front of `nodes` (`(id, url)`), configured as the
/// load-test harness configures it (`examples/cluster/haproxy.cfg`); killed when dropped.
struct Haproxy {
    child: Child,
    port: u16,
}

impl Haproxy {
    async fn start(root: &Path, nodes: &[(String, String)]) -> Haproxy {
        let port = free_port();
        let config = root.join("haproxy.cfg");
        let text = pyvisor::loadtest::haproxy_config(port, nodes);
        std::fs::write(&config, text).expect("write haproxy.cfg");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy (scripts/cluster-packages.sh installs it)");
        let haproxy = Haproxy { child, port };
        let ready = haproxy.url("/readyz");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !reqwest::get(&ready)
            .await
            .is_ok_and(|answer| answer.status().is_success())
        {
            assert!(Instant::now() < deadline, "HAProxy never became ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        haproxy
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `POST url` of `body` with `http`: the answer's JSON.
async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Value {
    let answer = http.post(url).json(body).send().await.expect("POST");
    assert!(answer.status().is_success(), "{url}: {}", answer.status());
    answer.json().await.expect("a JSON answer")
}

/// Round trips of `x = 1` posted to `url` (a session's `/execute`) on one keep-alive
/// connection, after a warm-up.
async fn http_round_trips(http: &reqwest::Client, url: &str, rounds: usize) -> Vec<Duration> {
    let body = json!({"code": "x = 1"});
    for _ in 0..rounds.min(100) {
        post(http, url, &body).await;
    }
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let result = post(http, url, &body).await;
        samples.push(start.elapsed());
        assert_eq!(result["status"], "ok", "{result}");
    }
    samples
}

async fn new_session(client: &Client) -> String {
    client
        .create_session(CreateParams::default())
        .await
        .expect("create a session")
        .session_id
}

fn main() {
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let rounds = if quick { 200 } else { 2_000 };
    let failovers = if quick { 3 } else { 10 };
    let root = tempfile::TempDir::new().expect("create a temp dir");
    // reqwest is built without a TLS provider of its own (the engine hands one to each of
    // its clients); the bench's plain-HTTP client still needs one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the runtime");
    runtime.block_on(async {
        let db = postgres::database().await;
        let store = db.url();
        let stats = db.connect().await;

        // x = 1: alone, as a cluster node, and forwarded from another node.
        let alone = Node::new(root.path(), "alone", None, false);
        let node_a = Node::new(root.path(), "node-a", Some(&store), false);
        let node_b = Node::new(root.path(), "node-b", Some(&store), false);
        let _daemons = [alone.start(), node_a.start(), node_b.start()];
        let on_alone = connect(&alone.socket()).await;
        let session = new_session(&on_alone).await;
        let base = summary(round_trips(&on_alone, &session, "x = 1", rounds).await);
        print("x = 1, socket, a node without [cluster]", base, None);
        let on_a = connect(&node_a.socket()).await;
        let held = new_session(&on_a).await;
        let clustered = summary(round_trips(&on_a, &held, "x = 1", rounds).await);
        print(
            "x = 1, socket, a node with [cluster]",
            clustered,
            Some(base),
        );
        let on_b = connect(&node_b.socket()).await;
        let forwarded = summary(round_trips(&on_b, &held, "x = 1", rounds).await);
        print(
            "x = 1, socket, forwarded by another node",
            forwarded,
            Some(base),
        );

        // x = 1 over HTTP: straight to the holder, and through HAProxy. The session is made
        // through HAProxy, which remembers its node (the stick table) and sends its requests
        // there; the first result says which node that is.
        let nodes = [("node-a", node_a.port), ("node-b", node_b.port)]
            .map(|(id, port)| (id.to_owned(), format!("http://127.0.0.1:{port}")));
        let haproxy = Haproxy::start(root.path(), &nodes).await;
        let http = reqwest::Client::new();
        let created = post(&http, &haproxy.url("/v1/sessions"), &json!({})).await;
        let session = created["session_id"].as_str().expect("a session id");
        let path = format!("/v1/sessions/{session}/execute");
        let first = post(&http, &haproxy.url(&path), &json!({"code": "x = 1"})).await;
        let holder = nodes
            .iter()
            .find(|(id, _)| first["node"] == id.as_str())
            .unwrap_or_else(|| panic!("a node of the bench answered: {first}"));
        let straight_url = format!("{}{path}", holder.1);
        let straight = summary(http_round_trips(&http, &straight_url, rounds).await);
        print(
            "x = 1, HTTP keep-alive, straight to the holder",
            straight,
            Some(base),
        );
        let through = summary(http_round_trips(&http, &haproxy.url(&path), rounds).await);
        print(
            "x = 1, HTTP keep-alive, through HAProxy",
            through,
            Some(base),
        );
        println!(
            "{:<52} p50 {:>+9.1} µs   p99 {:>+9.1} µs",
            "HAProxy's added latency (through - straight)",
            (through.0.as_secs_f64() - straight.0.as_secs_f64()) * 1e6,
            (through.1.as_secs_f64() - straight.1.as_secs_f64()) * 1e6
        );
        drop(haproxy);

        // Durable replies: the local file against the store's commit.
        let durable_alone = Node::new(root.path(), "durable-alone", None, true);
        let node_c = Node::new(root.path(), "node-c", Some(&store), true);
        let _durable = [durable_alone.start(), node_c.start()];
        let client = connect(&durable_alone.socket()).await;
        let session = new_session(&client).await;
        let setup = ExecuteParams::new(session.clone(), "x = 0");
        client.execute(setup).await.expect("x = 0");
        let local = summary(round_trips(&client, &session, "x += 1", rounds / 5).await);
        print("x += 1, durable reply, without [cluster]", local, None);
        let on_c = connect(&node_c.socket()).await;
        let session = new_session(&on_c).await;
        let setup = ExecuteParams::new(session.clone(), "x = 0");
        on_c.execute(setup).await.expect("x = 0");
        let before = store_work(&stats).await;
        let replies = rounds / 5;
        let shared = summary(round_trips(&on_c, &session, "x += 1", replies).await);
        let after = store_work(&stats).await;
        print("x += 1, durable reply, with [cluster]", shared, Some(local));
        // Warm-up included: round_trips runs up to 100 more before it measures.
        let sent = (replies + replies.min(100)) as f64;
        println!(
            "{:<52} {:.1} commits, {:.1} rows, {:.0} WAL bytes per durable reply",
            "the store's work (pg_stat_database)",
            (after.commits - before.commits) as f64 / sent,
            (after.rows - before.rows) as f64 / sent,
            (after.wal_bytes - before.wal_bytes) as f64 / sent,
        );

        // The heartbeats of four idle nodes (A, B, C and the lone one has none).
        let idle = Duration::from_secs(if quick { 3 } else { 10 });
        let before = store_work(&stats).await;
        tokio::time::sleep(idle).await;
        let after = store_work(&stats).await;
        let seconds = idle.as_secs_f64();
        println!(
            "{:<52} {:.1} commits/s, {:.0} WAL bytes/s for 3 idle nodes holding 3 sessions",
            "the store's background work",
            (after.commits - before.commits) as f64 / seconds,
            (after.wal_bytes - before.wal_bytes) as f64 / seconds
        );

        // Failover: node D holds a session whose state is in the store (a durable reply);
        // it is killed, and node B is asked until it answers for the session.
        let node_d = Node::new(root.path(), "node-d", Some(&store), true);
        let mut gaps = Vec::new();
        for _ in 0..failovers {
            let daemon = node_d.start();
            let on_d = connect(&node_d.socket()).await;
            let session = new_session(&on_d).await;
            let state = ExecuteParams::new(session.clone(), "x = 41");
            on_d.execute(state).await.expect("x = 41");
            drop(on_d);
            let killed = Instant::now();
            drop(daemon); // SIGKILL, and reaped
            let ask = ExecuteParams::new(session.clone(), "x + 1");
            loop {
                match on_b.execute(ask.clone()).await {
                    Ok(result) if result.error.is_none() => {
                        let value = result.result.map(|value| value.repr);
                        assert_eq!(value.as_deref(), Some("42"), "the state came back");
                        break;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
            gaps.push(killed.elapsed());
        }
        let (p50, p99) = summary(gaps);
        println!(
            "{:<52} p50 {:>9.0} ms   p99 {:>9.0} ms  ({failovers} kills, lease 5 s)",
            "failover: SIGKILL of the holder to the next answer",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    });
}
