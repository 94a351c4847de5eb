//! `session.fork` in the registry: [`ForkSession`] checks what the clones would take (the
//! owner's quota, their names, places under the pool's `max_total`), has the source session
//! fork its worker ([`ForkWorkers`]), and makes a session of each clone: a new id, the
//! source's owner and limits, its own process group and cgroup (given as its worker was
//! adopted), its own checkpoints (a first one is taken in the background at once, so that a
//! crash of the clone comes back to the fork rather than to nothing; seeded with the source's
//! latest checkpoint when it can be) and its own crash recovery, by its own worker kind; it
//! counts its executions on from its source's (see `session::forking`).

use std::time::Instant;

use actix::prelude::*;

use super::messages::{SessionHandle, SessionOptions};
use super::RegistryActor;
use crate::errors::{SessionError, SupervisorError};
use crate::pool::{Lease, Release, ReserveClones};
use crate::session::ForkWorkers;

/// Fork the session `session` (an id or a name within `owner`'s reach) into `names.len()`
/// clones, or `count` unnamed ones when `names` is empty.
#[derive(Message)]
#[rtype(result = "Result<ForkedSessions, SupervisorError>")]
pub struct ForkSession {
    pub session: String,
    pub owner: Option<String>,
    pub count: usize,
    pub names: Vec<String>,
}

/// The sessions a [`ForkSession`] made.
#[derive(Debug)]
pub struct ForkedSessions {
    pub sessions: Vec<SessionHandle>,
    /// Threads of the source's code that were running at the fork (none run in a clone).
    pub threads: u32,
    pub duration: std::time::Duration,
}

impl Handler<ForkSession> for RegistryActor {
    type Result = ResponseActFuture<Self, Result<ForkedSessions, SupervisorError>>;

    fn handle(&mut self, msg: ForkSession, _: &mut Context<Self>) -> Self::Result {
        let began = Instant::now();
        let refused = |err| -> Self::Result { Box::pin(fut::ready(Err(err))) };
        if self.stopping {
            return refused(SupervisorError::ShuttingDown);
        }
        let Some(source) = self
            .registry
            .find(&msg.session, msg.owner.as_deref())
            .cloned()
        else {
            return refused(SupervisorError::UnknownSession {
                session: msg.session,
            });
        };
        let owner = source.owner.clone();
        for name in &msg.names {
            let taken = self.registry.named(owner.as_deref(), name).is_some()
                || self.creating.contains_key(&(owner.clone(), name.clone()));
            if taken {
                return refused(SupervisorError::CloneNameTaken { name: name.clone() });
            }
        }
        let count = msg.count;
        for counted in 0..count {
            if let Err(err) = self.count_against_quota(owner.as_deref()) {
                (0..counted).for_each(|_| self.created_for(owner.as_deref()));
                return refused(err);
            }
        }
        let pool = self.pool().clone();
        let source_addr = source.addr.clone();
        let source_id = source.session_id.clone();
        let forked = async move {
            let base = pool
                .send(ReserveClones { count })
                .await
                .map_err(|_| SupervisorError::ShuttingDown)??;
            let forked = source_addr.send(ForkWorkers {
                count: count as u32,
                base,
            });
            match forked.await {
                Ok(Ok(forked)) => Ok(forked),
                failed => {
                    (0..count).for_each(|_| pool.do_send(Release));
                    Err(match failed {
                        Ok(Err(SessionError::Clone { source: cause, .. })) => {
                            SupervisorError::Clone {
                                session: source.session_id,
                                source: cause,
                            }
                        }
                        Ok(Err(err)) => SupervisorError::Fork {
                            session: source.session_id,
                            reason: err.to_string(),
                        },
                        _ => SupervisorError::ShuttingDown,
                    })
                }
            }
        };
        Box::pin(forked.into_actor(self).map(move |forked, act, ctx| {
            (0..count).for_each(|_| act.created_for(owner.as_deref()));
            let forked = forked?;
            // Places reserved for clones that did not come to be are given back.
            (forked.workers.len()..count).for_each(|_| act.pool().do_send(Release));
            if forked.workers.is_empty() {
                return Err(SupervisorError::Fork {
                    session: source_id,
                    reason: forked.failures.join("; "),
                });
            }
            if !forked.failures.is_empty() {
                tracing::warn!(failures = ?forked.failures, "some clones of a fork failed");
            }
            let mut names = msg.names.into_iter();
            let mut sessions = Vec::new();
            for worker in forked.workers {
                let lease = Lease {
                    worker,
                    arbiter: forked.arbiter.clone(),
                    warm: false,
                };
                let options = SessionOptions {
                    name: names.next(),
                    owner: owner.clone(),
                    limits: Some(forked.limits.clone()),
                    ..SessionOptions::default()
                };
                match act.start_session(lease, options, forked.spec.clone(), None, ctx) {
                    Ok(handle) => {
                        handle.addr.do_send(forked.start.clone());
                        sessions.push(handle);
                    }
                    Err(err) => tracing::warn!(error = %err, "a clone could not become a session"),
                }
            }
            Ok(ForkedSessions {
                sessions,
                threads: forked.threads,
                duration: began.elapsed(),
            })
        }))
    }
}
