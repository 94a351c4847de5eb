//! A cluster the harness runs itself (`[target] kind = "cluster"`), as
//! `examples/cluster/run.sh` does: a throwaway PostgreSQL (`postgres`), `nodes` `pyvisor
//! serve` nodes sharing it, each with its own config, socket, state directory and log in a
//! temporary directory and its HTTP API on a loopback port, and, when asked, HAProxy in front
//! with `examples/cluster/haproxy.cfg` (its ports and server lines made this run's). The
//! `node_kill` fault SIGKILLs a node and starts it again on the same state under the same id,
//! as systemd would. Everything is stopped, and the directories removed, at the end of the
//! run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::daemon::{log_tail, program, spawn};
use super::http::Http;
use super::postgres::{Postgres, ROLE};
use super::target::Totals;
use crate::rpc::wire::Stats;
use crate::DurabilityMode;

/// The database the nodes share.
const DATABASE: &str = "pyvisor";

/// How long a started node, or HAProxy, has to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// HAProxy's configuration of `examples/cluster/run.sh`, which this run's is made from.
const HAPROXY_CFG: &str = include_str!("../../../examples/cluster/haproxy.cfg");

/// What the scenario asks of the cluster.
pub struct ClusterSpec<'a> {
    pub nodes: usize,
    pub haproxy: bool,
    pub binary: Option<&'a Path>,
    pub lease_ttl_s: f64,
    pub durability: DurabilityMode,
}

/// One `pyvisor serve` of the cluster.
struct ClusterNode {
    id: String,
    url: String,
    dir: PathBuf,
    child: Mutex<Child>,
    /// A client of this node alone.
    http: Http,
}

/// The processes of a cluster the harness runs.
pub struct HarnessCluster {
    binary: PathBuf,
    nodes: Vec<ClusterNode>,
    /// HAProxy and its URL.
    haproxy: Option<(Mutex<Child>, String)>,
    /// The totals of nodes' processes that were killed, as they were just before.
    retired: Mutex<Totals>,
    dir: tempfile::TempDir,
    /// Dropped after the nodes (see `Drop`).
    _postgres: Postgres,
}

impl HarnessCluster {
    /// Starts PostgreSQL, the nodes and HAProxy when asked, and waits until all are ready.
    pub async fn start(spec: &ClusterSpec<'_>) -> Result<HarnessCluster, String> {
        let binary = program(spec.binary)?;
        let postgres = Postgres::start()?;
        postgres.create_database(DATABASE).await?;
        let dir = tempfile::Builder::new()
            .prefix("pyvisor-loadtest-cluster-")
            .tempdir()
            .map_err(|err| format!("create the cluster's directory: {err}"))?;
        let mut cluster = HarnessCluster {
            binary,
            nodes: Vec::new(),
            haproxy: None,
            retired: Mutex::default(),
            dir,
            _postgres: postgres,
        };
        for n in 1..=spec.nodes {
            let node = cluster.new_node(n, spec)?;
            cluster.nodes.push(node);
        }
        for index in 0..cluster.nodes.len() {
            cluster.ready(index).await?;
        }
        if spec.haproxy {
            cluster.start_haproxy().await?;
        }
        Ok(cluster)
    }

    /// Node `n` (from 1) configured and started.
    fn new_node(&self, n: usize, spec: &ClusterSpec<'_>) -> Result<ClusterNode, String> {
        let id = format!("node-{n}");
        let dir = self.dir.path().join(&id);
        std::fs::create_dir_all(&dir).map_err(|err| format!("create {id}'s directory: {err}"))?;
        let url = format!("http://127.0.0.1:{}", free_port()?);
        let config = format!(
            "[server]\nsocket = {socket:?}\nhttp = {http:?}\n\n\
             [state]\ndir = {state:?}\ndurability = \"{mode}\"\n\n\
             [cluster]\nstore = {store:?}\nnode_id = \"{id}\"\nadvertise_url = \"{url}\"\n\
             lease_ttl_s = {ttl:?}\n",
            socket = dir.join("pyvisor.sock"),
            http = url.trim_start_matches("http://"),
            state = dir.join("state"),
            mode = spec.durability.name(),
            store = format!(
                "host={} user={ROLE} dbname={DATABASE}",
                self._postgres.socket_dir().display()
            ),
            ttl = spec.lease_ttl_s,
        );
        std::fs::write(dir.join("config.toml"), config)
            .map_err(|err| format!("write {id}'s config: {err}"))?;
        let child = spawn(&self.binary, &dir)?;
        let http = Http::new(&url, None)?;
        Ok(ClusterNode {
            id,
            url,
            dir,
            child: Mutex::new(child),
            http,
        })
    }

    /// `(node id, url)` of every node.
    pub fn nodes(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .map(|node| (node.id.clone(), node.url.clone()))
            .collect()
    }

    /// The process of each node (a killed one's until it is started again).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .map(|node| lock(&node.child).id())
            .collect()
    }

    /// HAProxy's URL, when it runs.
    pub fn front(&self) -> Option<&str> {
        self.haproxy.as_ref().map(|(_, url)| url.as_str())
    }

    /// Polls node `index`'s `/readyz` until it answers 200.
    async fn ready(&self, index: usize) -> Result<(), String> {
        let node = &self.nodes[index];
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if node.http.get_once::<Value>("/readyz").await.is_ok() {
                return Ok(());
            }
            let exited = lock(&node.child).try_wait().ok().flatten();
            if let Some(status) = exited {
                return Err(format!(
                    "{} exited ({status}) before it was ready; its log: {}",
                    node.id,
                    log_tail(&node.dir)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} was not ready at {} within {READY_TIMEOUT:?}",
                    node.id, node.url
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// HAProxy on a loopback port in front of the nodes, once it says it is ready.
    async fn start_haproxy(&mut self) -> Result<(), String> {
        let port = free_port()?;
        let ports: Vec<(String, String)> = self.nodes();
        let config = haproxy_config(port, &ports);
        let path = self.dir.path().join("haproxy.cfg");
        std::fs::write(&path, config).map_err(|err| format!("write haproxy.cfg: {err}"))?;
        let log = std::fs::File::create(self.dir.path().join("haproxy.log"))
            .map_err(|err| format!("create HAProxy's log: {err}"))?;
        let binary = ["/usr/sbin/haproxy", "/usr/local/sbin/haproxy"]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .unwrap_or("haproxy");
        let child = Command::new(binary)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|err| {
                format!(
                    "start {binary}: {err} (scripts/cluster-packages.sh installs Debian's \
                     haproxy)"
                )
            })?;
        let url = format!("http://127.0.0.1:{port}");
        let front = Http::new(&url, None)?;
        self.haproxy = Some((Mutex::new(child), url));
        let deadline = Instant::now() + READY_TIMEOUT;
        while front.get_once::<Value>("/readyz").await.is_err() {
            let log = std::fs::read_to_string(self.dir.path().join("haproxy.log"));
            if Instant::now() >= deadline {
                return Err(format!(
                    "HAProxy was not ready within {READY_TIMEOUT:?}; its log: {}",
                    log.unwrap_or_default().trim()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// The index and id of the node `id`.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|node| node.id == id)
    }

    pub fn node_id(&self, index: usize) -> &str {
        &self.nodes[index].id
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// SIGKILLs node `index` (its totals kept first); its pid.
    pub async fn kill_node(&self, index: usize) -> Result<u32, String> {
        let node = &self.nodes[index];
        if let Ok(totals) = node_totals(&node.http).await {
            let mut retired = lock(&self.retired);
            *retired = retired.plus(totals);
        }
        let mut child = lock(&node.child);
        let pid = child.id();
        child
            .kill()
            .map_err(|err| format!("SIGKILL to {} ({pid}): {err}", node.id))?;
        // Reaped before the next one starts, so its socket and ports are free.
        let _ = child.wait();
        Ok(pid)
    }

    /// Starts node `index` again on the same config and state, and waits until it is ready;
    /// its new pid.
    pub async fn restart_node(&self, index: usize) -> Result<u32, String> {
        let node = &self.nodes[index];
        let pid = {
            let mut child = lock(&node.child);
            *child = spawn(&self.binary, &node.dir)?;
            child.id()
        };
        self.ready(index).await?;
        Ok(pid)
    }

    /// The engines' totals: of every node now, and of every killed process before its kill.
    pub async fn totals(&self) -> Result<Totals, String> {
        let mut sum = *lock(&self.retired);
        for node in &self.nodes {
            sum = sum.plus(node_totals(&node.http).await?);
        }
        Ok(sum)
    }
}

impl Drop for HarnessCluster {
    /// HAProxy and the nodes go first, PostgreSQL (a field) after them.
    fn drop(&mut self) {
        if let Some((child, _)) = &self.haproxy {
            let mut child = lock(child);
            let _ = child.kill();
            let _ = child.wait();
        }
        for node in &self.nodes {
            let mut child = lock(&node.child);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A node's pool hits, crashes and restores.
async fn node_totals(node: &Http) -> Result<Totals, String> {
    let stats: Stats = node.get_once("/v1/stats").await?;
    Ok(Totals::of(&stats))
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|err| format!("find a free port: {err}"))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|err| format!("find a free port: {err}"))
}

/// `examples/cluster/haproxy.cfg` with its front on `port` and, in each backend, one server
/// line per node of `nodes` (`(id, url)`, on loopback) in place of the example's: HAProxy's
/// configuration for this run's nodes (the cluster bench uses it too).
pub fn haproxy_config(port: u16, nodes: &[(String, String)]) -> String {
    let mut config = String::new();
    let mut in_servers = false;
    for line in HAPROXY_CFG.lines() {
        if line.trim_start().starts_with("server ") {
            if !in_servers {
                for (number, (id, url)) in nodes.iter().enumerate() {
                    let address = url.trim_start_matches("http://");
                    config.push_str(&format!("    server {id} {address} id {}\n", number + 1));
                }
            }
            in_servers = true;
            continue;
        }
        in_servers = false;
        config.push_str(&line.replace("127.0.0.1:8800", &format!("127.0.0.1:{port}")));
        config.push('\n');
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_haproxy_config_names_this_runs_nodes_and_port() {
        let nodes = [
            ("node-1".to_owned(), "http://127.0.0.1:4001".to_owned()),
            ("node-2".to_owned(), "http://127.0.0.1:4002".to_owned()),
        ];
        let config = haproxy_config(4000, &nodes);
        assert!(config.contains("bind 127.0.0.1:4000\n"), "{config}");
        assert!(
            !config.contains("8800") && !config.contains("8803"),
            "{config}"
        );
        let servers: Vec<&str> = config
            .lines()
            .filter(|line| line.trim_start().starts_with("server "))
            .collect();
        assert_eq!(
            servers,
            [
                "    server node-1 127.0.0.1:4001 id 1",
                "    server node-2 127.0.0.1:4002 id 2",
            ]
            .repeat(2),
            "each backend names each node once"
        );
    }
}
