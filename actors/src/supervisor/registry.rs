//! The registry of live sessions: slotmap keys inside, stable string ids and names unique per
//! owner outside, and the owner rule (a caller that states an owner sees only that owner's).

use std::collections::HashMap;

use slotmap::{new_key_type, SlotMap};

use super::messages::SessionHandle;

new_key_type! {
    /// Internal key of a registered session.
    struct SessionKey;
}

#[derive(Default)]
pub(super) struct Registry {
    sessions: SlotMap<SessionKey, SessionHandle>,
    by_id: HashMap<String, SessionKey>,
    /// Names are per owner: `(owner, name)`; `None` is the namespace of sessions without one.
    by_name: HashMap<(Option<String>, String), SessionKey>,
}

impl Registry {
    pub fn insert(&mut self, handle: SessionHandle) {
        let id = handle.session_id.clone();
        let name = handle.name.clone().map(|name| (handle.owner.clone(), name));
        let key = self.sessions.insert(handle);
        self.by_id.insert(id, key);
        if let Some(name) = name {
            self.by_name.insert(name, key);
        }
    }

    pub fn remove(&mut self, session_id: &str) -> Option<SessionHandle> {
        let key = self.by_id.remove(session_id)?;
        let handle = self.sessions.remove(key)?;
        if let Some(name) = &handle.name {
            self.by_name.remove(&(handle.owner.clone(), name.clone()));
        }
        Some(handle)
    }

    /// The session `owner` called `name` (`None`: the sessions without an owner).
    pub fn named(&self, owner: Option<&str>, name: &str) -> Option<&SessionHandle> {
        self.by_name
            .get(&(owner.map(str::to_owned), name.to_owned()))
            .and_then(|key| self.sessions.get(*key))
    }

    /// The session with id `session` if `owner` may reach it, else the one `owner` named
    /// `session`.
    pub fn find(&self, session: &str, owner: Option<&str>) -> Option<&SessionHandle> {
        let by_id = self
            .by_id
            .get(session)
            .and_then(|key| self.sessions.get(*key))
            .filter(|handle| reachable(handle, owner));
        by_id.or_else(|| self.named(owner, session))
    }

    /// Every session `owner` may reach, oldest first.
    pub fn list(&self, owner: Option<&str>) -> Vec<SessionHandle> {
        let mut handles: Vec<_> = self
            .sessions
            .values()
            .filter(|handle| reachable(handle, owner))
            .cloned()
            .collect();
        handles.sort_by_key(|handle| handle.created_at);
        handles
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn handles(&self) -> impl Iterator<Item = &SessionHandle> {
        self.sessions.values()
    }
}

/// A caller that states no owner reaches every session; one that does, only its own.
pub(super) fn reachable(handle: &SessionHandle, owner: Option<&str>) -> bool {
    owner.is_none() || handle.owner.as_deref() == owner
}
