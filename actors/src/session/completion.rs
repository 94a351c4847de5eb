//! Tab completion: [`Complete`] asks the worker for the names and attributes that can finish
//! the word before the cursor (the worker's `completion` module says what it looks up and
//! what it never runs). It never waits for the session's code: while an execution runs or
//! waits, the answer is at once no matches and `busy`; otherwise the worker serves it on its
//! main thread, in order with executions, so a lookup never races the session's code.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use pyvisor_protocol::HostMessage;
use tokio::sync::oneshot;

use super::{SessionActor, State};
use crate::errors::SessionError;

/// How long a completion waits for the worker (an attribute lookup that hangs, say); then
/// it has no matches.
const COMPLETE_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest code a completion takes, in bytes: a REPL line or cell, not a file.
pub const MAX_COMPLETE_BYTES: usize = 1 << 20;

/// Complete the word that ends at character `cursor` of `code`.
#[derive(Message)]
#[rtype(result = "Result<Completion, SessionError>")]
pub struct Complete {
    pub code: String,
    /// In characters (Unicode code points) of `code`, at most its length.
    pub cursor: usize,
}

/// The answer to [`Complete`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    /// Each replaces the word before the cursor: the run of identifier characters and dots
    /// that ends there. Sorted; a callable ends with `(`.
    pub matches: Vec<String>,
    /// The session was running code (or about to): nothing was looked up.
    pub busy: bool,
}

/// Completions the worker has not answered yet.
#[derive(Default)]
pub(super) struct Completions {
    pending: HashMap<String, oneshot::Sender<Vec<String>>>,
    next: u64,
}

impl Completions {
    /// The worker is gone: its completions get no matches.
    pub(super) fn forget(&mut self) {
        self.pending.clear();
    }
}

impl SessionActor {
    /// The worker answered completion `id`.
    pub(super) fn complete_done(&mut self, id: &str, matches: Vec<String>) {
        if let Some(reply) = self.completions.pending.remove(id) {
            let _ = reply.send(matches);
        }
    }
}

impl Handler<Complete> for SessionActor {
    type Result = ResponseFuture<Result<Completion, SessionError>>;

    fn handle(&mut self, msg: Complete, _: &mut Context<Self>) -> Self::Result {
        let chars = msg.code.chars().count();
        let refused = if msg.code.len() > MAX_COMPLETE_BYTES {
            Some(SessionError::TooLarge {
                bytes: msg.code.len(),
                limit: MAX_COMPLETE_BYTES,
            })
        } else if msg.cursor > chars {
            Some(SessionError::CursorOutOfRange {
                cursor: msg.cursor,
                chars,
            })
        } else if let State::Closing | State::Closed = self.state {
            Some(SessionError::Closed {
                session_id: self.session_id.clone(),
            })
        } else {
            None
        };
        if let Some(err) = refused {
            return Box::pin(async move { Err(err) });
        }
        let idle = matches!(self.state, State::Idle) && self.queue.is_empty();
        let busy = Completion {
            matches: Vec::new(),
            busy: true,
        };
        let Some(worker) = self.worker.as_ref().filter(|_| idle) else {
            return Box::pin(async move { Ok(busy) });
        };
        self.completions.next += 1;
        let id = format!("k-{}", self.completions.next);
        let request = HostMessage::Complete {
            id: id.clone(),
            text: msg.code,
            cursor: msg.cursor,
        };
        if worker.writer.send(&request).is_err() {
            return Box::pin(async move { Ok(busy) });
        }
        let (reply, answer) = oneshot::channel();
        // After a timeout the entry stays until the worker answers, or dies.
        self.completions.pending.insert(id, reply);
        Box::pin(async move {
            let matches = tokio::time::timeout(COMPLETE_TIMEOUT, answer).await;
            Ok(Completion {
                matches: matches.ok().and_then(Result::ok).unwrap_or_default(),
                busy: false,
            })
        })
    }
}
