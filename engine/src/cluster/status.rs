//! `cluster.status`: the nodes sharing the store, how long ago each one's heartbeat reached
//! it, the sessions each one holds and whether it drains, as the store sees them now.

use serde::Serialize;

use super::store::Store;
use crate::errors::ClusterError;

/// The cluster as the store sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterStatus {
    /// Every node that ever joined, by id.
    pub nodes: Vec<NodeStatus>,
    /// Sessions in the directory, held or not.
    pub sessions: i64,
}

/// One node of [`ClusterStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    pub node_id: String,
    pub advertise_url: String,
    /// Milliseconds since its last heartbeat reached the store, by the store's clock.
    pub heartbeat_age_ms: i64,
    /// Sessions it holds under a lease that still runs.
    pub sessions: i64,
    /// Whether it drains: it takes no new session and releases those it holds.
    pub draining: bool,
}

/// Reads the cluster's status from the store.
pub async fn status(store: &Store) -> Result<ClusterStatus, ClusterError> {
    let client = store.client().await?;
    let failed = |source| ClusterError::Store {
        what: "read the cluster's status",
        source,
    };
    let nodes = client
        .query(
            "SELECT n.node_id, n.advertise_url,
                    (extract(epoch FROM now() - n.heartbeat_at) * 1000)::bigint,
                    count(s.session_id) FILTER (WHERE s.lease_expires_at >= now()),
                    n.draining
             FROM pyvisor_nodes n LEFT JOIN pyvisor_sessions s ON s.holder = n.node_id
             GROUP BY n.node_id ORDER BY n.node_id",
            &[],
        )
        .await
        .map_err(failed)?
        .into_iter()
        .map(|row| NodeStatus {
            node_id: row.get(0),
            advertise_url: row.get(1),
            heartbeat_age_ms: row.get::<_, i64>(2).max(0),
            sessions: row.get(3),
            draining: row.get(4),
        })
        .collect();
    let sessions = client
        .query_one("SELECT count(*) FROM pyvisor_sessions", &[])
        .await
        .map_err(failed)?
        .get(0);
    Ok(ClusterStatus { nodes, sessions })
}
