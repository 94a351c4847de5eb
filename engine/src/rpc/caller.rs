//! Who sent a request, as its transport established it (never from a param): an admin, who
//! sees every session or acts for the owner it names, or an owner, confined to its own
//! sessions. A WebSocket caller is also pinned to the one session of its path.

use super::errors::RpcError;

/// The longest owner a caller may name, in bytes.
pub const MAX_OWNER_BYTES: usize = 128;

/// The identity behind one connection or HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    identity: Identity,
    /// The only session this caller may address (a WebSocket's path), by session id.
    pinned: Option<String>,
    /// Another node of the cluster sent the request on (docs/cluster.md): it is served
    /// here or refused, never sent on again.
    forwarded: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Identity {
    Admin,
    Owner(String),
}

impl Caller {
    /// Root, `server.admin_uids`, the daemon's own user, `server.token`, a stdio host.
    pub fn admin() -> Self {
        Self {
            identity: Identity::Admin,
            pinned: None,
            forwarded: false,
        }
    }

    /// A caller who is `owner` and nobody else.
    pub fn owner(owner: impl Into<String>) -> Self {
        Self {
            identity: Identity::Owner(owner.into()),
            pinned: None,
            forwarded: false,
        }
    }

    /// This caller, allowed to address only the session with id `session_id`.
    pub fn pinned_to(mut self, session_id: impl Into<String>) -> Self {
        self.pinned = Some(session_id.into());
        self
    }

    /// This caller, as another node of the cluster that forwards a request; only an admin
    /// (a node presents the admin token) can be one.
    pub fn forwarded_by_node(mut self) -> Self {
        self.forwarded = self.is_admin();
        self
    }

    /// Whether another node of the cluster sent this request on.
    pub fn forwarded(&self) -> bool {
        self.forwarded
    }

    /// Whether the caller is an admin.
    pub fn is_admin(&self) -> bool {
        self.identity == Identity::Admin
    }

    /// The session id this caller is pinned to, if any.
    pub fn pinned(&self) -> Option<&str> {
        self.pinned.as_deref()
    }

    /// The owner whose sessions a request with the `owner` param `requested` reaches:
    /// `None` for an admin who names nobody (every session, and the names of sessions
    /// without an owner). An owner naming anyone else gets -32007.
    pub fn scope(&self, requested: Option<&str>) -> Result<Option<String>, RpcError> {
        if let Some(owner) = requested {
            check_owner(owner)?;
        }
        match (&self.identity, requested) {
            (Identity::Admin, requested) => Ok(requested.map(str::to_owned)),
            (Identity::Owner(own), None) => Ok(Some(own.clone())),
            (Identity::Owner(own), Some(requested)) if requested == own => Ok(Some(own.clone())),
            (Identity::Owner(_), Some(requested)) => Err(RpcError::not_your_owner(requested)),
        }
    }
}

/// Refuses an owner that is empty or longer than [`MAX_OWNER_BYTES`].
fn check_owner(owner: &str) -> Result<(), RpcError> {
    if owner.is_empty() {
        return Err(RpcError::invalid_params("owner: must not be empty"));
    }
    if owner.len() > MAX_OWNER_BYTES {
        return Err(RpcError::invalid_params(format!(
            "owner: at most {MAX_OWNER_BYTES} bytes, got {}",
            owner.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::code;

    #[test]
    fn an_admin_sees_everything_or_acts_for_the_owner_it_names() {
        let admin = Caller::admin();
        assert_eq!(admin.scope(None).unwrap(), None);
        assert_eq!(admin.scope(Some("bob")).unwrap().as_deref(), Some("bob"));
    }

    #[test]
    fn an_owner_is_itself_and_nobody_else() {
        let alice = Caller::owner("alice");
        assert_eq!(alice.scope(None).unwrap().as_deref(), Some("alice"));
        assert_eq!(
            alice.scope(Some("alice")).unwrap().as_deref(),
            Some("alice")
        );
        let err = alice.scope(Some("bob")).unwrap_err();
        assert_eq!(err.code, code::UNAUTHORIZED);
        assert!(err.message.contains("\"bob\""), "{}", err.message);
    }

    #[test]
    fn owners_that_are_empty_or_too_long_are_invalid_params() {
        let long = "x".repeat(MAX_OWNER_BYTES + 1);
        for caller in [Caller::admin(), Caller::owner("alice")] {
            for owner in ["", long.as_str()] {
                let err = caller.scope(Some(owner)).unwrap_err();
                assert_eq!(err.code, code::INVALID_PARAMS, "{owner:?}");
            }
        }
    }
}
