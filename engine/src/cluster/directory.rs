//! The session directory and its leases: which node holds which session, until when, under
//! which epoch.
//!
//! Lease expiry is computed from the store's clock (`now()`), never a node's, so nodes whose
//! clocks disagree still agree on whether a lease ran out. A node registers a session it
//! creates under epoch 1; [`claim`] takes a session whose lease ran out (or that the node
//! held already, before a restart) and bumps its epoch; [`renew`] extends every lease a node
//! holds in one statement per heartbeat and tells which it no longer holds; [`lease`] reads
//! one session's lease, for a node waiting for it to run out; [`release`] lets
//! a draining node give a session up with its checkpoint in the store. A session's name is
//! unique per owner across the cluster: [`register`] refuses one taken on any node
//! ([`ClusterError::NameTaken`]), and [`named`] finds the session that has it.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use super::store::Store;
use crate::errors::ClusterError;

/// A session as the directory knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub session_id: String,
    pub name: Option<String>,
    pub owner: Option<String>,
    /// The `limits` it was created with, as `session.create` took them (JSON).
    pub limits: Option<String>,
    /// The node holding it; `None` when it was released.
    pub holder: Option<String>,
    /// Where the holder's HTTP API is.
    pub holder_url: Option<String>,
    pub epoch: i64,
    /// Whether the lease ran out (by the store's clock).
    pub expired: bool,
}

/// A session this node has just claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The new epoch: every write for the session from now on carries it.
    pub epoch: i64,
    /// The node that held it before; `None` when it was released or never held.
    pub from_node: Option<String>,
    /// The executions its holder had reported at its last heartbeat.
    pub execution_count: i64,
}

/// One session in a heartbeat: the epoch it is held under and its execution count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub session_id: String,
    pub epoch: i64,
    pub execution_count: i64,
}

fn failed(what: &'static str) -> impl Fn(tokio_postgres::Error) -> ClusterError {
    move |source| ClusterError::Store { what, source }
}

/// Seconds of a lease, as the store's statements take them.
fn seconds(ttl: Duration) -> f64 {
    ttl.as_secs_f64()
}

/// Records that `node_id`, reachable at `advertise_url`, is up (a node restarting under its
/// id keeps its row and the leases it still holds).
pub async fn join(store: &Store, node_id: &str, advertise_url: &str) -> Result<(), ClusterError> {
    store
        .client()
        .await?
        .execute(
            "INSERT INTO pyvisor_nodes (node_id, advertise_url) VALUES ($1, $2)
             ON CONFLICT (node_id) DO UPDATE
                 SET advertise_url = EXCLUDED.advertise_url, started_at = now(),
                     heartbeat_at = now(), draining = false",
            &[&node_id, &advertise_url],
        )
        .await
        .map_err(failed("record the node in the cluster store"))?;
    Ok(())
}

/// A session a node has just created, to register.
#[derive(Debug, Clone, Copy)]
pub struct NewSession<'a> {
    pub session_id: &'a str,
    pub name: Option<&'a str>,
    pub owner: Option<&'a str>,
    /// The most sessions its owner may have in the directory, this one included.
    pub owner_quota: Option<usize>,
    /// The `limits` it was created with, as `session.create` took them (JSON).
    pub limits: Option<&'a str>,
}

/// Registers a session `node_id` has just created, held by it under epoch 1. With an owner
/// quota, refuses it ([`ClusterError::TooManySessions`]) when its owner has that many in the
/// directory already; a transaction-scoped advisory lock per owner makes two nodes that
/// create for one owner at once count one after the other.
pub async fn register(
    store: &Store,
    node_id: &str,
    ttl: Duration,
    new: NewSession<'_>,
) -> Result<i64, ClusterError> {
    let mut client = store.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(failed("begin registering the session"))?;
    if let (Some(owner), Some(limit)) = (new.owner, new.owner_quota) {
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('pyvisor-owner:' || $1))",
            &[&owner],
        )
        .await
        .map_err(failed("lock the owner's session count"))?;
        let held: i64 = tx
            .query_one(
                "SELECT count(*) FROM pyvisor_sessions WHERE owner = $1",
                &[&owner],
            )
            .await
            .map_err(failed("count the owner's sessions in the cluster store"))?
            .get(0);
        if held >= limit as i64 {
            return Err(ClusterError::TooManySessions {
                owner: owner.to_owned(),
                limit,
            });
        }
    }
    let inserted = tx
        .execute(
            "INSERT INTO pyvisor_sessions
             (session_id, name, owner, holder, lease_expires_at, epoch, limits)
         VALUES ($1, $2, $3, $4, now() + $5 * interval '1 second', 1, $6)
         ON CONFLICT ((coalesce(owner, '')), name) WHERE name IS NOT NULL DO NOTHING",
            &[
                &new.session_id,
                &new.name,
                &new.owner,
                &node_id,
                &seconds(ttl),
                &new.limits,
            ],
        )
        .await
        .map_err(failed("register the session in the cluster store"))?;
    if let (0, Some(name)) = (inserted, new.name) {
        let taken_by = named(&tx, new.owner, name).await?;
        return Err(ClusterError::NameTaken {
            name: name.to_owned(),
            session_id: taken_by.unwrap_or_default(),
        });
    }
    tx.commit()
        .await
        .map_err(failed("commit the session's registration"))?;
    Ok(1)
}

/// The session of `owner`'s named `name` in the directory, whichever node holds it.
pub async fn named(
    client: &impl GenericClient,
    owner: Option<&str>,
    name: &str,
) -> Result<Option<String>, ClusterError> {
    let row = client
        .query_opt(
            "SELECT session_id FROM pyvisor_sessions
             WHERE coalesce(owner, '') = coalesce($1, '') AND name = $2",
            &[&owner, &name],
        )
        .await
        .map_err(failed("look the session's name up in the cluster store"))?;
    Ok(row.map(|row| row.get(0)))
}

/// The directory's entry for `session_id`, if it has one.
pub async fn lookup(store: &Store, session_id: &str) -> Result<Option<Entry>, ClusterError> {
    let row = store
        .client()
        .await?
        .query_opt(
            "SELECT s.name, s.owner, s.holder, n.advertise_url, s.epoch,
                    s.holder IS NULL OR s.lease_expires_at < now(), s.limits
             FROM pyvisor_sessions s LEFT JOIN pyvisor_nodes n ON n.node_id = s.holder
             WHERE s.session_id = $1",
            &[&session_id],
        )
        .await
        .map_err(failed("look the session up in the cluster store"))?;
    Ok(row.map(|row| Entry {
        session_id: session_id.to_owned(),
        name: row.get(0),
        owner: row.get(1),
        holder: row.get(2),
        holder_url: row.get(3),
        epoch: row.get(4),
        expired: row.get(5),
        limits: row.get(6),
    }))
}

/// A session's lease as the store sees it now.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    /// The node holding it; `None` when it was released.
    pub holder: Option<String>,
    pub epoch: i64,
    /// When it runs out, in seconds since the epoch by the store's clock: a renewal moves it.
    pub expires_at_s: f64,
    /// How long it still runs, by the store's clock; zero once it ran out.
    pub left: Duration,
}

/// The lease of `session_id`, if the directory has the session.
pub async fn lease(store: &Store, session_id: &str) -> Result<Option<Lease>, ClusterError> {
    let row = store
        .client()
        .await?
        .query_opt(
            "SELECT holder, epoch, extract(epoch FROM lease_expires_at)::float8,
                    greatest(0, extract(epoch FROM lease_expires_at - now()))::float8
             FROM pyvisor_sessions WHERE session_id = $1",
            &[&session_id],
        )
        .await
        .map_err(failed("read the session's lease in the cluster store"))?;
    Ok(row.map(|row| Lease {
        holder: row.get(0),
        epoch: row.get(1),
        expires_at_s: row.get(2),
        left: Duration::try_from_secs_f64(row.get(3)).unwrap_or(Duration::ZERO),
    }))
}

/// Claims `session_id` for `node_id` when its lease ran out, it was released, or `node_id`
/// held it already: bumps its epoch and starts a lease. `None` when another node's lease
/// still runs (or the session is not in the directory).
pub async fn claim(
    store: &Store,
    node_id: &str,
    ttl: Duration,
    session_id: &str,
) -> Result<Option<Claim>, ClusterError> {
    let row = store
        .client()
        .await?
        .query_opt(
            "WITH before AS (
                 SELECT session_id, holder, execution_count FROM pyvisor_sessions
                 WHERE session_id = $1 FOR UPDATE
             )
             UPDATE pyvisor_sessions s
                 SET holder = $2, epoch = s.epoch + 1,
                     lease_expires_at = now() + $3 * interval '1 second'
             FROM before
             WHERE s.session_id = before.session_id
               AND (s.holder IS NULL OR s.holder = $2 OR s.lease_expires_at < now())
             RETURNING s.epoch, before.holder, before.execution_count",
            &[&session_id, &node_id, &seconds(ttl)],
        )
        .await
        .map_err(failed("claim the session in the cluster store"))?;
    Ok(row.map(|row| Claim {
        epoch: row.get(0),
        from_node: row
            .get::<_, Option<String>>(1)
            .filter(|from| from != node_id),
        execution_count: row.get(2),
    }))
}

/// The heartbeat of `node_id`: one statement that marks the node alive and extends the lease
/// of every session in `held` that it still holds under the same epoch, recording their
/// execution counts. The holder's count replaces the one recorded before: after a take-over
/// the store's count is the old holder's, which may be ahead of the state the new holder
/// restored, and a later failover would admit executions as lost that were never run. Returns the ids of the sessions whose leases it extended; a session of
/// `held` missing from them was taken over by another node.
pub async fn renew(
    store: &Store,
    node_id: &str,
    ttl: Duration,
    held: &[Held],
) -> Result<Vec<String>, ClusterError> {
    let ids: Vec<&str> = held.iter().map(|h| h.session_id.as_str()).collect();
    let epochs: Vec<i64> = held.iter().map(|h| h.epoch).collect();
    let counts: Vec<i64> = held.iter().map(|h| h.execution_count).collect();
    let rows = store
        .client()
        .await?
        .query(
            "WITH node AS (
                 UPDATE pyvisor_nodes SET heartbeat_at = now() WHERE node_id = $1
             )
             UPDATE pyvisor_sessions s
                 SET lease_expires_at = now() + $2 * interval '1 second',
                     execution_count = v.execution_count
             FROM unnest($3::text[], $4::bigint[], $5::bigint[])
                  AS v (session_id, epoch, execution_count)
             WHERE s.session_id = v.session_id AND s.holder = $1 AND s.epoch = v.epoch
             RETURNING s.session_id",
            &[&node_id, &seconds(ttl), &ids, &epochs, &counts],
        )
        .await
        .map_err(failed("renew the leases in the cluster store"))?;
    Ok(rows.into_iter().map(|row| row.get(0)).collect())
}

/// Removes a session `node_id` holds under `epoch` (closed), with its checkpoints; returns
/// whether it was there to remove.
pub async fn remove(
    store: &Store,
    node_id: &str,
    session_id: &str,
    epoch: i64,
) -> Result<bool, ClusterError> {
    let removed = store
        .client()
        .await?
        .execute(
            "DELETE FROM pyvisor_sessions WHERE session_id = $1 AND holder = $2 AND epoch = $3",
            &[&session_id, &node_id, &epoch],
        )
        .await
        .map_err(failed("remove the session from the cluster store"))?;
    Ok(removed > 0)
}

/// Records that `node_id` drains: it takes no new session and releases those it holds.
pub async fn mark_draining(store: &Store, node_id: &str) -> Result<(), ClusterError> {
    store
        .client()
        .await?
        .execute(
            "UPDATE pyvisor_nodes SET draining = true WHERE node_id = $1",
            &[&node_id],
        )
        .await
        .map_err(failed("mark the node draining in the cluster store"))?;
    Ok(())
}

/// Lets go of a session `node_id` holds under `epoch`, its checkpoint in the store: the
/// session stays in the directory, held by no node, and the next request for it on any node
/// claims it at once. Returns whether this node still held it.
pub async fn release(store: &Store, node_id: &str, held: &Held) -> Result<bool, ClusterError> {
    let released = store
        .client()
        .await?
        .execute(
            "UPDATE pyvisor_sessions
                 SET holder = NULL, lease_expires_at = now(),
                     execution_count = greatest(execution_count, $4)
             WHERE session_id = $1 AND holder = $2 AND epoch = $3",
            &[
                &held.session_id,
                &node_id,
                &held.epoch,
                &held.execution_count,
            ],
        )
        .await
        .map_err(failed("release the session in the cluster store"))?;
    Ok(released > 0)
}

/// Whether `err` is the store refusing a write under a stale epoch.
pub fn is_fenced(err: &tokio_postgres::Error) -> bool {
    err.code() == Some(&SqlState::from_code(super::migrations::FENCED))
}
