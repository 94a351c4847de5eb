//! The cluster a newcomer starts (`examples/cluster/run.sh`: a throwaway PostgreSQL, three
//! nodes, HAProxy with `examples/cluster/haproxy.cfg` in front), used the way a client uses
//! it: through HAProxy, and through each node. A session's requests through HAProxy reach the
//! node that created it without a forward; through each node, they reach it by one forward
//! from the two others; the node is killed with SIGKILL and the session's next request
//! through HAProxy answers with its state and says where it came from; Ctrl-C stops
//! everything the script started.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

/// `examples/cluster/run.sh`, running, with what it printed about itself.
struct Cluster {
    script: Child,
    /// HAProxy's port; node n listens on `base + n`.
    base: u16,
    /// Node id → pid.
    nodes: HashMap<String, i32>,
    /// The script's temp dir (in its log lines), removed when it stops.
    work: PathBuf,
}

impl Cluster {
    fn start() -> Cluster {
        let base = free_port_block(4);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster/run.sh");
        let mut command = Command::new("bash");
        command
            .arg(script)
            .env("PYVISOR", env!("CARGO_BIN_EXE_pyvisor"))
            .env("PYVISOR_CLUSTER_PORT", base.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // The script gets Ctrl-C as a terminal gives it. A suite started in the background
        // (`cmd &` in a script) ignores SIGINT, children inherit that, and a shell cannot
        // trap a signal ignored when it started: run.sh would never see the test's Ctrl-C.
        // SAFETY: between fork and exec, only signal(2), which is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = command.spawn().expect("run examples/cluster/run.sh");
        let stdout = child.stdout.take().expect("piped stdout");
        let (lines, printed) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        let (mut nodes, mut work) = (HashMap::new(), None);
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = printed.recv_timeout(left).expect("run.sh says it is ready");
            // "pyvisor cluster: node-1 pid 123 http://… (log /tmp/pyvisor-cluster-x/node-1/…)"
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["pyvisor", "cluster:", node, "pid", pid, _url, "(log", log] = words[..] {
                nodes.insert(node.to_owned(), pid.parse().expect("a pid"));
                work = Path::new(log).ancestors().nth(2).map(Path::to_owned);
            }
            if line.contains("ready at") {
                break;
            }
        }
        assert_eq!(nodes.len(), 3, "three nodes");
        Cluster {
            script: child,
            base,
            nodes,
            work: work.expect("the script's temp dir"),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.base)
    }

    /// Ctrl-C: the script stops what it started; its exit status, `None` if it has not
    /// stopped within two minutes.
    fn interrupt(&mut self) -> Option<std::process::ExitStatus> {
        let pid = Pid::from_raw(self.script.id() as i32);
        kill(pid, Signal::SIGINT).expect("interrupt run.sh");
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some(status) = self.script.try_wait().expect("wait for run.sh") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Cluster {
    /// A test that failed before its Ctrl-C still stops the script, without a second panic.
    fn drop(&mut self) {
        if let Ok(None) = self.script.try_wait() {
            if self.interrupt().is_none() {
                let _ = self.script.kill();
                let _ = self.script.wait();
            }
        }
    }
}

/// The first port of `count` consecutive loopback ports nobody listens on now.
fn free_port_block(count: u16) -> u16 {
    let start = 20_000 + (std::process::id() % 20_000) as u16;
    (start..60_000)
        .step_by(usize::from(count))
        .find(|&base| {
            (base..base + count)
                .all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        })
        .expect("a block of free ports")
}

fn client() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish()
}

/// `POST /v1/sessions/{session}/execute` with `code` through HAProxy: the status and body.
async fn execute(cluster: &Cluster, session: &str, code: &str) -> (u16, Value) {
    execute_at(cluster.base, session, code).await
}

/// The same at the loopback `port` (HAProxy's, or a node's): the status and body.
async fn execute_at(port: u16, session: &str, code: &str) -> (u16, Value) {
    let url = format!("http://127.0.0.1:{port}/v1/sessions/{session}/execute");
    match client().post(url).send_json(&json!({"code": code})).await {
        Ok(mut response) => {
            let body = response.body().limit(1 << 20).await.unwrap_or_default();
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            (response.status().as_u16(), body)
        }
        // HAProxy closing a connection while a node dies: as good as a 502.
        Err(_) => (502, Value::Null),
    }
}

/// The value of `series` in node `port`'s `/metrics` (0 when absent).
async fn metric(port: u16, series: &str) -> f64 {
    let url = format!("http://127.0.0.1:{port}/metrics");
    let mut response = client().get(url).send().await.expect("GET /metrics");
    let text = response.body().limit(1 << 22).await.expect("the metrics");
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|line| {
            line.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[actix_rt::test]
async fn a_session_through_haproxy_survives_the_death_of_its_node() {
    let mut cluster = Cluster::start();
    let mut created = client()
        .post(cluster.url("/v1/sessions"))
        .send_json(&json!({}))
        .await
        .expect("POST /v1/sessions through HAProxy");
    assert_eq!(created.status().as_u16(), 201);
    let named = created.headers().get("x-pyvisor-session").cloned();
    let body: Value = created.json().await.expect("the new session");
    let session = body["session_id"].as_str().expect("an id").to_owned();
    assert_eq!(
        named.as_ref().and_then(|h| h.to_str().ok()),
        Some(session.as_str())
    );

    // HAProxy learned the session's node from the create: its requests go there directly.
    let mut holder = None;
    for code in ["x = 41", "x", "x"] {
        let (status, result) = execute(&cluster, &session, code).await;
        assert_eq!((status, &result["status"]), (200, &json!("ok")), "{result}");
        let node = result["node"].as_str().expect("a node").to_owned();
        assert_eq!(
            *holder.get_or_insert(node.clone()),
            node,
            "one node serves it"
        );
    }
    let holder = holder.expect("a holder");
    for n in 1..=3 {
        let forwarded = metric(cluster.base + n, "pyvisor_cluster_forwarded_total").await;
        assert_eq!(forwarded, 0.0, "node-{n} forwarded nothing");
    }
    // Through every node: the holder answers each request, the two others forwarding it.
    // (Reads only: the state the failover below brings back is the one uploaded.)
    for n in 1..=3u16 {
        let (status, result) = execute_at(cluster.base + n, &session, "x").await;
        assert_eq!(
            (status, &result["status"]),
            (200, &json!("ok")),
            "node-{n}: {result}"
        );
        assert_eq!(result["node"], holder.as_str(), "node-{n}: {result}");
        assert_eq!(result["result"]["repr"], "41", "node-{n}: {result}");
        let forwarded = metric(cluster.base + n, "pyvisor_cluster_forwarded_total").await;
        let by_another = u8::from(format!("node-{n}") != holder);
        assert_eq!(forwarded, f64::from(by_another), "node-{n}");
    }
    // In the default durability mode the holder uploads at its next heartbeat.
    let holder_port = cluster.base + holder.trim_start_matches("node-").parse::<u16>().unwrap();
    let uploads = r#"pyvisor_cluster_store_seconds_count{op="upload"}"#;
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(holder_port, uploads).await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the holder never uploaded a checkpoint"
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }

    // The holder dies; through HAProxy, the session comes back on another node once the
    // holder's lease has run out.
    kill(Pid::from_raw(cluster.nodes[&holder]), Signal::SIGKILL).expect("kill -9 the holder");
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let (status, result) = execute(&cluster, &session, "x + 1").await;
        if status == 200 {
            break result;
        }
        assert!(
            Instant::now() < deadline,
            "never answered: {status} {result}"
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(answer["status"], "ok", "{answer}");
    assert_eq!(answer["result"]["repr"], "42", "{answer}");
    assert_eq!(
        answer["recovered"]["from_node"],
        holder.as_str(),
        "{answer}"
    );
    assert_ne!(answer["node"], holder.as_str(), "{answer}");

    // Ctrl-C stops every process the script started and removes its temp dir.
    let status = cluster.interrupt().expect("run.sh stops on Ctrl-C");
    assert!(status.code().is_some(), "run.sh exits: {status}");
    for pid in cluster.nodes.values() {
        let gone = kill(Pid::from_raw(*pid), None).is_err();
        assert!(gone, "node pid {pid} still runs after Ctrl-C");
    }
    assert!(!cluster.work.exists(), "{} is left", cluster.work.display());
}
