//! The session handles a dispatcher looked up before, by the owner scope and the id or name
//! the client used: a call on a known session saves the registry actor a message. (Not the
//! proactive cache.)

use std::collections::HashMap;
use std::sync::Mutex;

use crate::{EngineError, Session, SessionError};

/// Session handles by `(owner scope, id or name)`.
#[derive(Default)]
pub(super) struct SessionHandles {
    sessions: Mutex<HashMap<(Option<String>, String), Session>>,
}

impl SessionHandles {
    /// The handle found before under `key` in `owner`'s scope.
    pub(super) fn looked_up(&self, owner: &Option<String>, key: &str) -> Option<Session> {
        let sessions = self
            .sessions
            .lock()
            .expect("the session handles lock is never poisoned");
        sessions.get(&(owner.clone(), key.to_owned())).cloned()
    }

    /// Keeps `session` for the next call that names it by `key` in `owner`'s scope.
    pub(super) fn remember(&self, owner: &Option<String>, key: &str, session: Session) {
        let mut sessions = self
            .sessions
            .lock()
            .expect("the session handles lock is never poisoned");
        sessions.insert((owner.clone(), key.to_owned()), session);
    }

    /// Forgets the handle of the session `session_id`, whatever keys found it.
    pub(super) fn forget(&self, session_id: &str) {
        let mut sessions = self
            .sessions
            .lock()
            .expect("the session handles lock is never poisoned");
        sessions.retain(|_, session| session.id() != session_id);
    }

    /// A handle that answers `Closed` belongs to a closed session: look it up anew next time.
    pub(super) fn forget_if_closed(&self, err: &EngineError) {
        if let EngineError::Session(SessionError::Closed { session_id }) = err {
            self.forget(session_id);
        }
    }
}
