//! The cluster as a node runs it: `[cluster]` resolved, with the store's password read and the
//! node id and advertised URL defaulted (see `config::ClusterSettings`).

use std::time::Duration;

/// How a node joins the cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The shared PostgreSQL, password included.
    pub store: tokio_postgres::Config,
    /// This node's name in the store.
    pub node_id: String,
    /// Where the other nodes reach this node's HTTP API; empty when it serves no HTTP.
    pub advertise_url: String,
    /// How long a hold on a session lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// The admin token (`[server] token`), which every node of the cluster shares: this node
    /// presents it when it forwards a request to another.
    pub token: Option<String>,
    /// `limits.max_sessions_per_owner`, counted across the cluster: every session in the
    /// directory, whichever node holds it (or none).
    pub max_sessions_per_owner: Option<usize>,
}

impl ClusterConfig {
    /// How often the node renews its leases: three times per lease, so that one late
    /// heartbeat does not lose them.
    pub fn heartbeat(&self) -> Duration {
        self.lease_ttl / 3
    }
}
