//! Failover: a node takes over a session whose holder's lease ran out (the holder died, was
//! cut off, or released it in a drain), on the first request for it that reaches this node.
//!
//! The request claims the session in the store (a new epoch), the store's checkpoint comes
//! down into the local store, and the engine starts the session under the same id from it;
//! its next result says what it came back with ([`Recovered`]). Two requests for one session
//! wait for one take-over, and take-overs of different sessions run side by side, up to
//! [`TAKE_OVERS_AT_ONCE`] at once with the store (the checkpoint's local save and the
//! session's start run outside that bound). A request that finds the holder unreachable before its lease ran out waits for the
//! lease to run out rather than being refused ([`Node::wait_out_lease`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyvisor_actors::session::StateSetup;
use pyvisor_actors::SessionLimits;

use super::checkpoints;
use super::directory;
use super::metrics::{self, LeaseEvent};
#[cfg(doc)]
use super::node::TAKE_OVERS_AT_ONCE;
use super::node::{Holding, Node};
use crate::errors::ClusterError;
use crate::{Recovered, Session, SessionOptions};

/// How long after a lease's end, by its own clock, a node waiting for it looks again: the
/// store's clock and this node's may be a little apart.
const EXPIRY_MARGIN: Duration = Duration::from_millis(10);

impl Node {
    /// Takes over the session `session_id` for a caller whose scope is `owner` (`None`: every
    /// owner): claims it when its holder's lease ran out, restores its last checkpoint from
    /// the store and starts it here under the same id, with the limits `limits` makes of
    /// those it was created with (`None`: this node's defaults). `None` when the directory
    /// has no such session for that owner; [`ClusterError::HeldElsewhere`] when a live node
    /// holds it.
    pub async fn take_over(
        &self,
        session_id: &str,
        owner: Option<&str>,
        limits: impl FnOnce(Option<&str>) -> Option<SessionLimits>,
    ) -> Result<Option<Session>, ClusterError> {
        let asked = Instant::now();
        let _turn = self.turn_to_take_over(session_id).await;
        if self.lock_held().contains_key(session_id) {
            // Taken over by a request that came first.
            return Ok(self.engine.session(session_id, owner).await.ok());
        }
        self.refuse_when_draining()?;
        let slot = self
            .take_over_slots
            .acquire()
            .await
            .expect("the take-over slots are never closed");
        let Some(entry) = directory::lookup(&self.store, session_id).await? else {
            return Ok(None);
        };
        // Another owner's session is unknown, like a missing one.
        if owner.is_some() && entry.owner.as_deref() != owner {
            return Ok(None);
        }
        let held_elsewhere = |entry: directory::Entry| ClusterError::HeldElsewhere {
            session_id: session_id.to_owned(),
            node: entry.holder.unwrap_or_default(),
            advertise_url: entry.holder_url.unwrap_or_default(),
        };
        let mine = entry.holder.as_deref() == Some(self.node_id());
        if !entry.expired && !mine {
            return Err(held_elsewhere(entry));
        }
        let claiming = Instant::now();
        let claim = directory::claim(
            &self.store,
            &self.config.node_id,
            self.config.lease_ttl,
            session_id,
        );
        let claim = metrics::timed("claim", claim).await?;
        let Some(claim) = claim else {
            // Another node claimed it first.
            return match directory::lookup(&self.store, session_id).await? {
                Some(entry) => Err(held_elsewhere(entry)),
                None => Ok(None),
            };
        };
        let key = StateSetup::key_for(entry.owner.as_deref(), entry.name.as_deref(), session_id);
        // Held from the claim on, so the heartbeat renews the new lease while a large
        // checkpoint comes down.
        self.lock_held().insert(
            session_id.to_owned(),
            Holding {
                epoch: claim.epoch,
                key: key.clone(),
                count: 0,
                uploaded: None,
                restoring: true,
                valid_until: claiming + self.config.lease_ttl,
                releasing: false,
                expired: false,
            },
        );
        let claimed = Instant::now();
        let downloaded = match self.engine.checkpoint_store() {
            Some((local, scratch)) => {
                let download = async {
                    let fetched = checkpoints::fetch(&self.store, scratch, session_id).await?;
                    // The store's part is done: the local save (its fsyncs) and the session's
                    // start run beside the other take-overs.
                    drop(slot);
                    match fetched {
                        Some(fetched) => fetched.save(local, &key).await.map(Some),
                        None => Ok(None),
                    }
                };
                metrics::timed("download", download).await
            }
            None => {
                drop(slot);
                Ok(None)
            }
        };
        let downloaded = match downloaded {
            Ok(downloaded) => downloaded,
            Err(err) => {
                self.lock_held().remove(session_id);
                return Err(err);
            }
        };
        // The execution count the session comes back to: its restored engine counts on from it.
        let base = downloaded.as_ref().map_or(0, |d| d.execution_count);
        if let Some(holding) = self.lock_held().get_mut(session_id) {
            holding.count = base;
            holding.uploaded = downloaded.as_ref().map(|d| d.local_id.sequence());
            holding.restoring = false;
        }
        let restoring = Instant::now();
        let options = SessionOptions {
            name: entry.name.clone(),
            owner: entry.owner.clone(),
            limits: limits(entry.limits.as_deref()),
            take_over: Some(session_id.to_owned()),
            ..SessionOptions::default()
        };
        let session = match self.engine.create_session(options).await {
            Ok(session) => session,
            Err(err) => {
                self.lock_held().remove(session_id);
                return Err(err.into());
            }
        };
        let still_held = self.lock_held().get(session_id).map(|h| h.epoch) == Some(claim.epoch);
        if !still_held {
            // Another node claimed it while it was restored here.
            if let Err(err) = session.close().await {
                tracing::warn!(session = session_id, error = %err, "cannot close a lost session");
            }
            return Err(ClusterError::Fenced {
                session_id: session_id.to_owned(),
                epoch: claim.epoch,
            });
        }
        let reported = u64::try_from(claim.execution_count).unwrap_or(0);
        let from_node = claim.from_node.clone().or(entry.holder.clone());
        let recovered = Recovered {
            checkpoint_id: downloaded.as_ref().map(|d| d.checkpoint_id.clone()),
            lost_executions: reported.saturating_sub(base),
            execution_count: Some(base),
            fresh_namespace: downloaded.is_none(),
            // What the dead holder acknowledged after its last heartbeat is not counted; with
            // replies sent after their checkpoint is in the store, nothing acknowledged is lost.
            lost_may_be_more: from_node.is_some() && !self.engine.replies_after_checkpoint(),
            from_node,
        };
        metrics::leases(LeaseEvent::Claimed, 1);
        if recovered.from_node.is_some() {
            metrics::failover();
        }
        let ms = |from: Instant, to: Instant| to.duration_since(from).as_millis() as u64;
        tracing::info!(
            session = session_id,
            from = ?recovered.from_node,
            checkpoint = ?recovered.checkpoint_id,
            epoch = claim.epoch,
            waited_ms = ms(asked, claiming),
            claim_ms = ms(claiming, claimed),
            download_ms = ms(claimed, restoring),
            start_ms = ms(restoring, Instant::now()),
            "took the session over"
        );
        self.recovered
            .lock()
            .expect("the recovered sessions lock is never poisoned")
            .insert(session_id.to_owned(), recovered);
        Ok(Some(session))
    }

    /// Waits, at most about one lease, for the lease of the session `session_id` to run out by
    /// the store's clock, when its holder cannot be reached from here: so that the request
    /// that found the holder gone takes the session over the moment it may, rather than being
    /// refused and sent again. True when the lease ran out or the session moved (the request
    /// is worth one more try); false when the holder renewed the lease (it lives, and only
    /// this node cannot reach it) or the store cannot tell. Waiting changes nothing of the
    /// fencing: the claim still takes only a lease that ran out.
    pub async fn wait_out_lease(&self, session_id: &str) -> bool {
        let deadline = Instant::now() + self.config.lease_ttl + self.config.heartbeat();
        let mut first: Option<directory::Lease> = None;
        loop {
            let lease = match directory::lease(&self.store, session_id).await {
                Ok(Some(lease)) => lease,
                // Gone: the next try says so.
                Ok(None) => return true,
                Err(err) => {
                    tracing::debug!(session = session_id, error = %err, "cannot read the lease");
                    return false;
                }
            };
            if lease.left.is_zero() {
                return true;
            }
            match &first {
                None => first = Some(lease.clone()),
                Some(seen) if (&seen.holder, seen.epoch) != (&lease.holder, lease.epoch) => {
                    return true
                }
                Some(seen) if seen.expires_at_s != lease.expires_at_s => return false,
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                return false;
            }
            // A live holder renews once per heartbeat: look again by then at the latest.
            let pause = lease.left.min(self.config.heartbeat()) + EXPIRY_MARGIN;
            tokio::time::sleep(pause).await;
        }
    }

    /// Waits until no other request takes the session `session_id` over, and holds it so
    /// until the turn is dropped.
    async fn turn_to_take_over(&self, session_id: &str) -> TakeOverTurn<'_> {
        let lock = self
            .lock_taking_over()
            .entry(session_id.to_owned())
            .or_default()
            .clone();
        TakeOverTurn {
            node: self,
            session_id: session_id.to_owned(),
            guard: Some(lock.lock_owned().await),
        }
    }

    fn lock_taking_over(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.taking_over
            .lock()
            .expect("the take-over locks' lock is never poisoned")
    }
}

/// One request's turn to take a session over; the session's lock is forgotten with the last
/// turn (one that ends early, its caller gone, included).
struct TakeOverTurn<'a> {
    node: &'a Node,
    session_id: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for TakeOverTurn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = self.node.lock_taking_over();
        // Only the map refers to it: no request waits for it.
        if locks
            .get(&self.session_id)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            locks.remove(&self.session_id);
        }
    }
}
