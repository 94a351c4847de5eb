//! The connection pool to the shared PostgreSQL (`deadpool-postgres` over `tokio-postgres`).
//!
//! [`Store::open`] connects, applies the schema migrations and hands out pooled clients. Every
//! wait on the store is bounded: a connection that cannot be made or taken from the pool
//! within [`WAIT`] fails as [`ClusterError::Unreachable`], so a node whose store is gone
//! learns it instead of hanging.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use super::migrations;
use crate::errors::ClusterError;

/// Connections a node keeps to the store: the heartbeat, the checkpoint upload and the
/// requests that claim or register sessions.
pub const POOL_SIZE: usize = 8;

/// The longest a node waits to connect to the store or for a pooled connection.
pub const WAIT: Duration = Duration::from_secs(3);

/// The shared store, as a pool of connections.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
}

impl Store {
    /// Connects to the store at `config` and brings its schema up to date.
    pub async fn open(config: &tokio_postgres::Config) -> Result<Store, ClusterError> {
        let mut config = config.clone();
        config.connect_timeout(WAIT);
        if config.get_application_name().is_none() {
            config.application_name("pyvisor");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(WAIT))
            .create_timeout(Some(WAIT))
            .recycle_timeout(Some(WAIT))
            .build()
            .map_err(|err| ClusterError::Unreachable(err.to_string()))?;
        let store = Store { pool };
        let mut client = store.client().await?;
        let applied = migrations::apply(&mut client).await?;
        if !applied.is_empty() {
            tracing::info!(versions = ?applied, "migrated the cluster store");
        }
        Ok(store)
    }

    /// A connection from the pool.
    pub async fn client(&self) -> Result<Object, ClusterError> {
        self.pool
            .get()
            .await
            .map_err(|err| ClusterError::Unreachable(err.to_string()))
    }
}
