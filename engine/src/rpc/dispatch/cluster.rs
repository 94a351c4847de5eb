//! The dispatcher's side of a cluster (docs/cluster.md): a session created here is registered
//! in the shared store, a session this engine does not have is taken over when its holder's
//! lease ran out, a closed one leaves the store, and the first result of a session taken over
//! says where it came from. Without `[cluster]` each hook does nothing.

use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Dispatcher, Scope};
use crate::cluster::directory;
use crate::cluster::forward::{Forwarder, Unanswered};
use crate::cluster::status::status;
use crate::cluster::{ClusterStatus, Node};
use crate::errors::ClusterError;
use crate::rpc::caller::Caller;
use crate::rpc::errors::{code, RpcError};
use crate::rpc::outbound::Outbound;
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

    /// A call that is sent on if another node holds its session: with `[cluster]`, not
    /// forwarded already, a method with a route, params that name a session (the one a
    /// WebSocket is pinned to, if it is) and an owner the caller may act for. `None` for a
    /// session this dispatcher has looked up here before.
    pub(super) fn forwardable(
        &self,
        caller: &Caller,
        method: &str,
        params: &Option<Value>,
    ) -> Option<Target> {
        let node = self.cluster.get()?;
        if caller.forwarded() || !Forwarder::forwards(method) {
            return None;
        }
        let Some(Value::Object(params)) = params else {
            return None;
        };
        let key = params.get("session_id").and_then(Value::as_str)?;
        if caller.pinned().is_some_and(|pinned| pinned != key) {
            return None;
        }
        let owner = caller
            .scope(params.get("owner").and_then(Value::as_str))
            .ok()?;
        if self.sessions.looked_up(&owner, key).is_some() {
            return None;
        }
        Some(Target {
            node: node.clone(),
            owner,
            key: key.to_owned(),
        })
    }

    /// The answer of the node that answered for `target`'s session before, when it still
    /// holds it; `None` when no node did, or that one says (or shows, by not answering) that
    /// it no longer holds it, and the call takes the long way.
    pub(super) async fn forward_to_known_holder(
        &self,
        target: &Target,
        method: &str,
        params: &Option<Value>,
        out: &Outbound,
    ) -> Option<Result<Box<RawValue>, RpcError>> {
        let holders = target.node.forwarder().holders();
        let url = holders.get(target.owner(), &target.key)?;
        let Some(Value::Object(params)) = params else {
            return None;
        };
        match target.forward(&url, method, params, out).await {
            // Refused: the call takes the long way and is counted there, once.
            Some(Err(err)) if NOT_THE_HOLDER.contains(&err.code) => {}
            Some(answer) => {
                crate::cluster::metrics::forwarded();
                return Some(answer);
            }
            None => {}
        }
        holders.forget(&target.key);
        None
    }

    /// Whether a call of `caller` that failed here with `err` is sent on: `err` says a live
    /// node holds the session, and the call did not come from another node.
    pub(super) fn forwards_to_holder(&self, caller: &Caller, err: &RpcError) -> bool {
        self.cluster.get().is_some() && !caller.forwarded() && holder_url(err).is_some()
    }

    /// Sends a call that failed here with `err` on to the node holding its session, when
    /// `err` names a live holder; otherwise `err` stands, and when that node cannot be
    /// reached, it stands as [`Sent::Unreachable`].
    pub(super) async fn forward(
        &self,
        target: &Target,
        method: &str,
        params: &Option<Value>,
        err: RpcError,
        out: &Outbound,
    ) -> Sent {
        let (Some(url), Some(Value::Object(params))) = (holder_url(&err), params) else {
            return Sent::Answer(Err(err));
        };
        match target.forward(url, method, params, out).await {
            Some(answer) => {
                crate::cluster::metrics::forwarded();
                target
                    .node
                    .forwarder()
                    .holders()
                    .remember(target.owner(), &target.key, url);
                Sent::Answer(answer)
            }
            None => Sent::Unreachable(err),
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

    /// The id of the cluster node this dispatcher serves, if it is one.
    pub(super) fn node_id(&self) -> Option<String> {
        self.cluster.get().map(|node| node.node_id().to_owned())
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

/// The URL of the live node that holds the session, when `err` says one does.
fn holder_url(err: &RpcError) -> Option<&str> {
    (err.data.as_ref())
        .filter(|_| err.code == code::HELD_ELSEWHERE)
        .and_then(|data| data.get("advertise_url"))
        .and_then(Value::as_str)
        .filter(|url| !url.is_empty())
}

/// How a call that failed here fared with the node holding its session.
pub(super) enum Sent {
    /// The holder's answer; or the call's own error, when it named no live holder.
    Answer(Result<Box<RawValue>, RpcError>),
    /// The holder could not be reached: the call's own error (`-32008`, naming it) stands.
    Unreachable(RpcError),
}

impl Sent {
    /// What the caller gets.
    pub(super) fn answer(self) -> Result<Box<RawValue>, RpcError> {
        match self {
            Sent::Answer(answer) => answer,
            Sent::Unreachable(err) => Err(err),
        }
    }
}

/// A call that may be sent on to the node holding its session.
pub(super) struct Target {
    node: Arc<Node>,
    /// The owner the caller is confined to, which goes along so that the holder applies the
    /// same owner rule; `None` for an admin who named nobody.
    owner: Option<String>,
    /// The session, as the caller named it.
    key: String,
}

impl Target {
    fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// Waits for the lease of the session, whose holder cannot be reached, to run out
    /// ([`Node::wait_out_lease`]): whether the call is worth one more try here.
    pub(super) async fn wait_out_lease(&self) -> bool {
        self.node.wait_out_lease(&self.key).await
    }

    /// The answer of the node at `url` to `method` with `params`; `None` when that node
    /// cannot be reached. Its caller counts it as forwarded when it is the call's answer.
    async fn forward(
        &self,
        url: &str,
        method: &str,
        params: &Map<String, Value>,
        out: &Outbound,
    ) -> Option<Result<Box<RawValue>, RpcError>> {
        let forwarder = self.node.forwarder();
        let answer = match forwarder
            .forward(url, method, params, self.owner(), out)
            .await
        {
            Ok(answer) => answer,
            Err(Unanswered::NotForwarded | Unanswered::Unreachable) => return None,
        };
        if answer.is_ok() && method == crate::rpc::wire::method::CLOSE {
            forwarder.holders().forget(&self.key);
        }
        Some(answer)
    }
}

/// The codes of a holder's refusal that says the session is not its own (held elsewhere,
/// unknown there, or the node drains): the call ran nowhere, and the store says where the
/// session is now.
const NOT_THE_HOLDER: [i64; 3] = [
    code::HELD_ELSEWHERE,
    code::UNKNOWN_SESSION,
    code::SHUTTING_DOWN,
];
