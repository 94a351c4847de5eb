//! The node at run time: the sessions it holds, its heartbeat, and the upload of their
//! checkpoints (taking over a session whose holder's lease ran out is `failover`).
//!
//! The daemon's dispatcher tells the node about the sessions it creates, the executions they
//! run and the sessions it closes; none of that waits for the store except registering and
//! removing a session. Two tasks run beside the requests, each once per heartbeat
//! ([`ClusterConfig::heartbeat`]): the heartbeat renews every lease the node holds in one
//! statement, and the uploader sends each held session's newest local checkpoint to the store
//! under the session's epoch. A session whose lease another node took (the renewal skips it,
//! or the store fences its upload) is closed here at once: its worker ends, and the next
//! request for it finds it held elsewhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use pyvisor_actors::session::StateSetup;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::ClusterConfig;
use super::directory::{self, Held};
use super::forward::Forwarder;
use super::metrics::{self, LeaseEvent};
use super::store::{Store, POOL_SIZE, WAIT};
use crate::errors::ClusterError;
use crate::{Engine, Recovered, Session};

/// The most sessions a node takes over at once (each holds a store connection while its
/// checkpoint comes down): half the store's pool, so that the heartbeat, the uploader and new
/// sessions still get connections while a dead node's sessions arrive together.
pub const TAKE_OVERS_AT_ONCE: usize = POOL_SIZE / 2;

/// A node of the cluster.
pub struct Node {
    pub(super) config: ClusterConfig,
    pub(super) store: Store,
    pub(super) engine: Engine,
    /// The sessions this node holds, by id.
    pub(super) held: Mutex<HashMap<String, Holding>>,
    /// What sessions taken over from another node came back with, for their next result.
    pub(super) recovered: Mutex<HashMap<String, Recovered>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The sessions being taken over, each with the lock its take-over holds: a second
    /// request for one of them waits for the first and finds it held, so a session is
    /// claimed and restored once, while take-overs of different sessions run at once.
    pub(super) taking_over: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Bounds the take-overs that run at once ([`TAKE_OVERS_AT_ONCE`]).
    pub(super) take_over_slots: tokio::sync::Semaphore,
    /// Whether the last heartbeat reached the store.
    store_reachable: AtomicBool,
    forwarder: Forwarder,
    /// Held by the uploader for a pass and by a drain for each session it hands over, so
    /// that an older checkpoint is never uploaded after the one a drain handed over.
    pub(super) uploading: tokio::sync::Mutex<()>,
    /// Set by `node.drain`; true once every held session has been handed over.
    pub(super) draining: AtomicBool,
    pub(super) drained: watch::Sender<bool>,
}

/// A session this node holds.
#[derive(Debug, Clone)]
pub(super) struct Holding {
    pub(super) epoch: i64,
    /// Its key in the local checkpoint store.
    pub(super) key: String,
    /// The session's execution count, across nodes: the engine's count, which goes on from
    /// the checkpoint's a take-over restored.
    pub(super) count: u64,
    /// The local checkpoint last uploaded (its sequence).
    pub(super) uploaded: Option<u64>,
    /// The store's checkpoint is on its way into the local store: nothing local is newer
    /// than it, so nothing is uploaded meanwhile.
    pub(super) restoring: bool,
    /// Until when this node can prove it holds the session, by its own clock: the lease's
    /// length after the last renewal was sent, never later than the store's expiry.
    pub(super) valid_until: Instant,
    /// A drain is handing it over: its requests are refused and nothing uploads it but the
    /// drain.
    pub(super) releasing: bool,
    /// Its lease ran out by this node's clock and was counted so; cleared by a renewal.
    pub(super) expired: bool,
}

impl Node {
    /// Joins the cluster: opens the store (migrating its schema), records the node and starts
    /// its heartbeat and uploader on the current tokio runtime.
    pub async fn start(config: ClusterConfig, engine: Engine) -> Result<Arc<Node>, ClusterError> {
        let forwarder = Forwarder::new(&config.node_id, config.token.clone())?;
        let store = Store::open(&config.store).await?;
        directory::join(&store, &config.node_id, &config.advertise_url).await?;
        let node = Arc::new(Node {
            config,
            store,
            engine,
            held: Mutex::default(),
            recovered: Mutex::default(),
            tasks: Mutex::default(),
            taking_over: Mutex::default(),
            take_over_slots: tokio::sync::Semaphore::new(TAKE_OVERS_AT_ONCE),
            store_reachable: AtomicBool::new(true),
            forwarder,
            uploading: tokio::sync::Mutex::new(()),
            draining: AtomicBool::new(false),
            drained: watch::channel(false).0,
        });
        let heartbeat = tokio::spawn(every_heartbeat(Arc::downgrade(&node), |node| {
            Box::pin(async move { node.heartbeat().await })
        }));
        let uploader = tokio::spawn(every_heartbeat(Arc::downgrade(&node), |node| {
            Box::pin(async move { node.upload_checkpoints().await })
        }));
        node.lock_tasks().extend([heartbeat, uploader]);
        tracing::info!(node = %node.config.node_id, url = %node.config.advertise_url, "joined the cluster");
        Ok(node)
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.config.node_id
    }

    /// The shared store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// What sends requests on to the nodes that hold their sessions.
    pub fn forwarder(&self) -> &Forwarder {
        &self.forwarder
    }

    pub(super) fn lock_held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Holding>> {
        self.held
            .lock()
            .expect("the held sessions lock is never poisoned")
    }

    fn lock_tasks(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.tasks
            .lock()
            .expect("the node's task list lock is never poisoned")
    }

    /// Registers a session this node's engine has just created with `limits` (the JSON of
    /// `session.create`'s `limits`); an attach to a live one is registered already.
    pub async fn created(
        &self,
        session: &Session,
        limits: Option<&str>,
    ) -> Result<(), ClusterError> {
        if session.attached() || self.lock_held().contains_key(session.id()) {
            return Ok(());
        }
        self.refuse_when_draining()?;
        let registering = Instant::now();
        let new = directory::NewSession {
            session_id: session.id(),
            name: session.name(),
            owner: session.owner(),
            owner_quota: self.config.max_sessions_per_owner,
            limits,
        };
        let registration = directory::register(
            &self.store,
            &self.config.node_id,
            self.config.lease_ttl,
            new,
        );
        let epoch = metrics::timed("register", registration).await?;
        metrics::leases(LeaseEvent::Claimed, 1);
        let valid_until = registering + self.config.lease_ttl;
        let key = StateSetup::key_for(session.owner(), session.name(), session.id());
        self.lock_held().insert(
            session.id().to_owned(),
            Holding {
                epoch,
                key,
                count: 0,
                uploaded: None,
                restoring: false,
                valid_until,
                releasing: false,
                expired: false,
            },
        );
        Ok(())
    }

    /// Whether the last heartbeat reached the store (`/readyz`).
    pub fn store_reachable(&self) -> bool {
        self.store_reachable.load(Ordering::SeqCst)
    }

    /// Whether this node holds the session `session_id` (false: it lost it to another node,
    /// or never held it). Refuses a held session once this node can no longer prove it holds
    /// it: its lease ran out by this node's clock because the store could not renew it. The
    /// worker stays: a renewal once the store is back lets the session go on, unless another
    /// node claimed it meanwhile.
    pub fn check_lease(&self, session_id: &str) -> Result<bool, ClusterError> {
        match self.lock_held().get(session_id) {
            Some(holding) if holding.releasing => Err(self.draining_error()),
            Some(holding) if holding.valid_until < Instant::now() => {
                Err(ClusterError::LeaseExpired {
                    session_id: session_id.to_owned(),
                })
            }
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    /// Notes the execution count a session's engine reported, for the next heartbeat.
    pub fn executed(&self, session_id: &str, execution_count: u64) {
        if let Some(holding) = self.lock_held().get_mut(session_id) {
            holding.count = holding.count.max(execution_count);
        }
    }

    /// What the session `session_id` came back with when this node took it over, once.
    pub fn take_recovered(&self, session_id: &str) -> Option<Recovered> {
        self.recovered
            .lock()
            .expect("the recovered sessions lock is never poisoned")
            .remove(session_id)
    }

    /// Removes a session this node closed from the directory, with its checkpoints.
    pub async fn closed(&self, session_id: &str) -> Result<(), ClusterError> {
        let Some(holding) = self.lock_held().remove(session_id) else {
            return Ok(());
        };
        directory::remove(&self.store, &self.config.node_id, session_id, holding.epoch).await?;
        Ok(())
    }

    /// Renews every lease this node holds, and lets go of those another node took.
    async fn heartbeat(&self) {
        let held: Vec<Held> = self
            .lock_held()
            .iter()
            .map(|(id, holding)| Held {
                session_id: id.clone(),
                epoch: holding.epoch,
                execution_count: holding.count as i64,
            })
            .collect();
        let sent = Instant::now();
        let renewal = directory::renew(
            &self.store,
            &self.config.node_id,
            self.config.lease_ttl,
            &held,
        );
        let renewed = match metrics::timed("heartbeat", tokio::time::timeout(WAIT, renewal)).await {
            Ok(Ok(renewed)) => renewed,
            Ok(Err(err)) => {
                self.store_lost();
                return tracing::warn!(error = %err, "heartbeat failed");
            }
            Err(_) => {
                self.store_lost();
                return tracing::warn!("heartbeat failed: the store did not answer in time");
            }
        };
        self.store_reachable.store(true, Ordering::SeqCst);
        {
            let mut holdings = self.lock_held();
            for id in &renewed {
                if let Some(holding) = holdings.get_mut(id) {
                    holding.valid_until = sent + self.config.lease_ttl;
                    holding.expired = false;
                }
            }
        }
        metrics::leases(LeaseEvent::Renewed, renewed.len() as u64);
        for lost in held.iter().filter(|h| !renewed.contains(&h.session_id)) {
            self.lose(&lost.session_id, lost.epoch).await;
        }
    }

    /// A heartbeat did not reach the store: `/readyz` says so, and leases that ran out by
    /// this node's clock meanwhile are counted once.
    fn store_lost(&self) {
        self.store_reachable.store(false, Ordering::SeqCst);
        let now = Instant::now();
        let mut expired = 0;
        for holding in self.lock_held().values_mut() {
            if holding.valid_until < now && !holding.expired {
                holding.expired = true;
                expired += 1;
            }
        }
        metrics::leases(LeaseEvent::Expired, expired);
    }

    /// Another node claimed the session held under `epoch`: stop serving it here.
    pub(super) async fn lose(&self, session_id: &str, epoch: i64) {
        {
            let mut held = self.lock_held();
            if held.get(session_id).map(|h| h.epoch) != Some(epoch) {
                return;
            }
            held.remove(session_id);
        }
        metrics::leases(LeaseEvent::Lost, 1);
        tracing::warn!(
            session = session_id,
            epoch,
            "lost the session's lease to another node"
        );
        if let Ok(session) = self.engine.session(session_id, None).await {
            // Its checkpoints here are older than the new holder's: they go with it.
            if let Err(err) = session.close().await {
                tracing::warn!(session = session_id, error = %err, "cannot close a lost session");
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for task in self.lock_tasks().drain(..) {
            task.abort();
        }
    }
}

/// Runs `beat` on the node once per heartbeat for as long as the node lives.
async fn every_heartbeat(
    node: Weak<Node>,
    beat: impl Fn(Arc<Node>) -> futures::future::BoxFuture<'static, ()>,
) {
    let period = match node.upgrade() {
        Some(node) => node.config.heartbeat(),
        None => return,
    };
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(node) = node.upgrade() else { return };
        beat(node).await;
    }
}
