//! The dispatcher's side of a cluster (docs/cluster.md): a session created here is registered
//! in the shared store, a session this engine does not have is taken over when its holder's
//! lease ran out, a closed one leaves the store, and the first result of a session taken over
//! says where it came from. Without `[cluster]` each hook does nothing.

use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Dispatcher, Scope};
use crate::cluster::directory;
use crate::cluster::forward::Forwarder;
use crate::cluster::status::status;
use crate::cluster::{ClusterStatus, Node};
use crate::errors::ClusterError;
use crate::rpc::caller::Caller;
use crate::rpc::errors::{code, RpcError};
use crate::rpc::wire::{self, LimitParams};
use crate::{EngineError, ExecutionResult, Session, SupervisorError};

impl Dispatcher {
    /// Makes this dispatcher's sessions part of the cluster `node` belongs to.
    pub fn join_cluster(&self, node: Arc<Node>) {
        if self.cluster.set(node).is_err() {
            tracing::warn!("the dispatcher has joined a cluster already");
        }
    }

    /// Registers a session the engine has just created with `limits` (as `session.create`
    /// took them); one the store would not take is closed again, so that no node serves a
    /// session the store does not know.
    pub(super) async fn register(
        &self,
        session: &Session,
        limits: Option<&LimitParams>,
    ) -> Result<(), ClusterError> {
        let Some(node) = self.cluster.get() else {
            return Ok(());
        };
        let limits = limits.map(|limits| serde_json::to_string(limits).expect("plain JSON"));
        if let Err(err) = node.created(session, limits.as_deref()).await {
            if let Err(closing) = session.clone().close().await {
                tracing::warn!(session = session.id(), error = %closing, "cannot close an unregistered session");
            }
            return Err(err);
        }
        Ok(())
    }

    /// The session of `owner`'s named `name` that another node of the cluster has (or had,
    /// and may be taken over), if any: a create of that name attaches to it.
    pub(super) async fn named_in_cluster(
        &self,
        owner: Option<&str>,
        name: &str,
    ) -> Result<Option<String>, RpcError> {
        match self.cluster.get() {
            Some(node) => Ok(directory::named(&node.store().client().await?, owner, name).await?),
            None => Ok(None),
        }
    }

    /// `session.create`'s answer for a name taken on another node: that session, attached
    /// to as a create here attaches to a session of this node. Taken over here when its
    /// holder's lease ran out; a session another live node holds has no pid to tell here.
    pub(super) async fn attach_in_cluster(
        &self,
        at: &Scope<'_>,
        session_id: String,
    ) -> Result<wire::Created, RpcError> {
        let session = match self.session(at, &session_id).await {
            Ok(session) => session,
            Err(err) if err.code == code::HELD_ELSEWHERE => {
                return Ok(wire::Created {
                    session_id,
                    pid: None,
                    python_version: None,
                    warm: false,
                    attached: true,
                    restored: false,
                })
            }
            Err(err) => return Err(err),
        };
        let info = session.info().await?;
        Ok(wire::Created {
            session_id,
            pid: info.pid,
            python_version: info.python_version,
            warm: false,
            attached: true,
            restored: session.restored(),
        })
    }

    /// The session `key` for `owner`, taken over from the cluster; `not_here` (the engine's
    /// answer) when the cluster does not have it either.
    pub(super) async fn take_over(
        &self,
        key: &str,
        owner: Option<&str>,
        not_here: EngineError,
    ) -> Result<Session, RpcError> {
        let Some(node) = self.cluster.get() else {
            return Err(not_here.into());
        };
        // The limits it was created with, as this node's policy makes them; a node whose
        // ceilings refuse them gives the session its defaults (and says so in its log).
        let limits = |created: Option<&str>| {
            let asked: LimitParams = serde_json::from_str(created?).ok()?;
            match self.limit_policy().session_limits(&asked) {
                Ok(limits) => Some(limits),
                Err(err) => {
                    tracing::warn!(session = key, error = %err.message,
                        "the session's limits are refused here; it takes this node's defaults");
                    None
                }
            }
        };
        match node.take_over(key, owner, limits).await? {
            Some(session) => Ok(session),
            None => Err(not_here.into()),
        }
    }

    /// `session`, found here under `key` for `owner`, if this node still holds it; else what
    /// the cluster says of it (another node holds it, or it is gone). Refuses a session this
    /// node can no longer prove it holds (docs/cluster.md).
    pub(super) async fn held_here(
        &self,
        session: Session,
        key: &str,
        owner: Option<&str>,
    ) -> Result<Session, RpcError> {
        let Some(node) = self.cluster.get() else {
            return Ok(session);
        };
        if node.check_lease(session.id())? {
            return Ok(session);
        }
        // Another node took the session over: this handle is of the copy this node closed.
        self.sessions.forget(session.id());
        let not_here = EngineError::Supervisor(SupervisorError::UnknownSession {
            session: key.to_owned(),
        });
        self.take_over(key, owner, not_here).await
    }

    /// Whether the cluster's store answered the last heartbeat; true without a cluster.
    pub fn store_reachable(&self) -> bool {
        self.cluster.get().is_none_or(|node| node.store_reachable())
    }

    /// The params of a call that may be forwarded if another node holds its session, kept
    /// before the call consumes them; `None` for a call that is never forwarded.
    pub(super) fn forwardable(
        &self,
        caller: &Caller,
        method: &str,
        params: &Option<Value>,
    ) -> Option<Map<String, Value>> {
        let forwarding = self.cluster.get().is_some() && !caller.forwarded();
        match params {
            Some(Value::Object(params)) if forwarding && Forwarder::forwards(method) => {
                Some(params.clone())
            }
            _ => None,
        }
    }

    /// Sends a call that failed with `err` on to the node holding its session, when `err`
    /// names a live holder; otherwise, or when that node cannot be reached, `err` stands.
    pub(super) async fn forward(
        &self,
        caller: &Caller,
        method: &str,
        params: Map<String, Value>,
        err: RpcError,
    ) -> Result<Box<RawValue>, RpcError> {
        let url = (err.data.as_ref())
            .filter(|_| err.code == code::HELD_ELSEWHERE)
            .and_then(|data| data.get("advertise_url"))
            .and_then(Value::as_str)
            .filter(|url| !url.is_empty());
        let (Some(url), Some(node)) = (url, self.cluster.get()) else {
            return Err(err);
        };
        // The owner the caller is confined to goes along, so the holder applies the same rule.
        let owner = caller.scope(params.get("owner").and_then(Value::as_str))?;
        match node
            .forwarder()
            .forward(url, method, params, owner.as_deref())
            .await
        {
            Some(answer) => {
                crate::cluster::metrics::forwarded();
                answer
            }
            None => Err(err),
        }
    }

    /// `cluster.status`, for admins who reach every session (it counts every owner's).
    pub(super) async fn cluster_status(&self, at: &Scope<'_>) -> Result<ClusterStatus, RpcError> {
        let node = self.admin_node(at, "cluster.status counts every owner's sessions")?;
        Ok(status(node.store()).await?)
    }

    /// `node.drain`, for admins: starts handing every session over and stops the daemon
    /// once none is left (docs/cluster.md#draining).
    pub(super) async fn drain(&self, at: &Scope<'_>) -> Result<(), RpcError> {
        let node = self.admin_node(at, "node.drain hands every owner's sessions over")?;
        Ok(node.drain().await?)
    }

    /// This dispatcher's node, for a call only admins may make (`why` says why).
    fn admin_node(&self, at: &Scope<'_>, why: &str) -> Result<&Arc<Node>, RpcError> {
        if at.owner().is_some() {
            return Err(RpcError::new(
                code::UNAUTHORIZED,
                format!("unauthorized: {why}; admins only"),
            ));
        }
        self.cluster.get().ok_or_else(|| {
            RpcError::new(
                code::ENGINE_ERROR,
                "this node is not part of a cluster (no [cluster] store)",
            )
        })
    }

    /// Refuses a new session while this node drains.
    pub(super) fn refuse_when_draining(&self) -> Result<(), RpcError> {
        match self.cluster.get() {
            Some(node) => Ok(node.refuse_when_draining()?),
            None => Ok(()),
        }
    }

    /// Whether this node drains (`/readyz`); false without a cluster.
    pub fn is_draining(&self) -> bool {
        self.cluster.get().is_some_and(|node| node.is_draining())
    }

    /// Notes a result's execution count for the heartbeat, says which node ran it, and gives
    /// the first result of a session taken over what it came back with. With `[state]
    /// durability = "reply"`, the result waits for its checkpoint to reach the store, and
    /// warns when it could not.
    pub(super) async fn note_result(&self, session_id: &str, result: &mut ExecutionResult) {
        let Some(node) = self.cluster.get() else {
            return;
        };
        node.executed(session_id, result.execution_count);
        if let Err(err) = node.upload_before_reply(session_id).await {
            result.warnings.push(format!(
                "state not saved in the cluster store (a death of this node loses it): {err}"
            ));
        }
        result.node = Some(node.node_id().to_owned());
        if let Some(recovered) = node.take_recovered(session_id) {
            // A crash of the new worker says more than where the session came from.
            result.recovered.get_or_insert(recovered);
        }
    }

    /// Removes a closed session from the store.
    pub(super) async fn unregister(&self, session_id: &str) -> Result<(), RpcError> {
        match self.cluster.get() {
            Some(node) => Ok(node.closed(session_id).await?),
            None => Ok(()),
        }
    }
}
