//! Several nodes, one PostgreSQL (docs/cluster.md): the `[cluster]` part of the daemon.
//!
//! PostgreSQL is the one shared store and the source of truth for which node holds which
//! session. A node holds a session by a lease that its heartbeat renews; every claim of a
//! session bumps the session's fencing epoch, and the store refuses a checkpoint written under
//! an older epoch, so a node that was paused cannot overwrite what another node took over. A
//! request for a session whose holder's lease expired claims it on the node that received it,
//! which restores the session's last checkpoint from the store.
//!
//! - [`config`]: the resolved `[cluster]` settings.
//! - [`store`]: the connection pool, opened with the schema migrated.
//! - [`migrations`]: the schema, versioned in code, applied under an advisory lock.
//! - [`directory`]: the session directory and its leases (register, claim, renew, remove).
//! - [`checkpoints`]: checkpoints copied between a node's local store and the shared one.
//! - [`forward`]: requests sent on to the node that holds their session.
//! - [`memory`]: the memory feature's outcomes and patterns, shared by the nodes.
//! - [`metrics`]: leases, forwarded requests, failovers, the store's latency.
//! - [`status`]: `cluster.status`, the nodes and their sessions as the store sees them.
//! - [`node`]: the node at run time: the sessions it holds, its heartbeat.
//! - [`failover`]: taking over a session whose holder's lease ran out.
//! - [`upload`]: checkpoints sent to the store, per heartbeat and before a durable reply.
//! - [`drain`]: `node.drain`, each held session handed over to the store before the node stops.

pub mod checkpoints;
pub mod config;
pub mod directory;
pub mod drain;
pub mod failover;
pub mod forward;
pub mod memory;
pub mod metrics;
pub mod migrations;
pub mod node;
pub mod status;
pub mod store;
pub mod upload;

pub use config::ClusterConfig;
pub use directory::{Claim, Entry};
pub use node::Node;
pub use status::{ClusterStatus, NodeStatus};
pub use store::Store;
