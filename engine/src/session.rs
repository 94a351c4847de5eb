//! [`Session`]: the caller's handle on one persistent Python namespace, and [`Execution`],
//! the stream of events of one run.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use futures::Stream;
use pyvisor_actors::checkpoint::{CheckpointId, CheckpointInfo};
use pyvisor_actors::session::{
    CheckpointNow, CheckpointSummary, Close, CloseState, Complete, Completion, Execute,
    ExecutionTicket, GetInfo, GetWorkDir, Hint, Interrupt, ListCheckpoints, Progress,
    RestoreCheckpoint, RestoreSummary, SendInput, SessionPhase, SessionSnapshot, WorkDir,
};
use pyvisor_actors::supervisor::{ForkSession, SessionHandle};
use pyvisor_actors::{ExecuteRequest, ExecutionEvent, ExecutionResult, SessionError};
use tokio::sync::mpsc;

use crate::errors::EngineError;
use crate::files::SessionFiles;

/// Most clones one [`Session::fork`] makes.
pub const MAX_FORKS: usize = 16;

/// The sessions a [`Session::fork`] made.
#[derive(Debug)]
pub struct Forked {
    pub sessions: Vec<Session>,
    /// Threads of the source's code that were running at the fork: none of them runs in a
    /// clone, whose first execution says so on its stderr.
    pub threads: u32,
    pub duration: std::time::Duration,
}

/// A persistent Python session. Cheap to clone; every clone talks to the same namespace.
#[derive(Debug, Clone)]
pub struct Session {
    handle: SessionHandle,
}

impl Session {
    pub(crate) fn new(handle: SessionHandle) -> Self {
        Self { handle }
    }

    /// The stable public id of the session.
    pub fn id(&self) -> &str {
        &self.handle.session_id
    }

    /// The name the session was created with.
    pub fn name(&self) -> Option<&str> {
        self.handle.name.as_deref()
    }

    /// The owner the session was created with.
    pub fn owner(&self) -> Option<&str> {
        self.handle.owner.as_deref()
    }

    /// When the session was created.
    pub fn created_at(&self) -> SystemTime {
        self.handle.created_at
    }

    /// Whether the session's first worker came ready from the pool.
    pub fn warm(&self) -> bool {
        self.handle.warm
    }

    /// Whether this handle came from a `create_session` whose name was already taken by
    /// this (older) session.
    pub fn attached(&self) -> bool {
        self.handle.attached
    }

    /// Process id of the worker the session was created with. Known only to the handle
    /// that created it: handles from a lookup or an attach ask [`Self::info`].
    pub fn pid(&self) -> Option<u32> {
        self.handle.worker.as_ref().map(|worker| worker.pid)
    }

    /// Version of the session's Python interpreter, e.g. `3.11.7`; known like [`Self::pid`].
    pub fn python_version(&self) -> Option<&str> {
        self.handle
            .worker
            .as_ref()
            .map(|worker| worker.python_version.as_str())
    }

    /// Queues `request` and returns the stream of its events, ending in its result.
    pub async fn execute(
        &self,
        request: impl Into<ExecuteRequest>,
    ) -> Result<Execution, EngineError> {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        self.handle.addr.do_send(Execute {
            request: request.into(),
            events: events_tx,
        });
        // The session's first word on the channel: the ticket, or why it refused.
        let ticket = match events.recv().await {
            Some(Progress::Accepted(ticket)) => ticket,
            Some(Progress::Refused(refused)) => return Err(refused.into()),
            Some(Progress::Event(_)) | None => return Err(EngineError::Stopped),
        };
        Ok(Execution {
            ticket,
            session_id: self.handle.session_id.clone(),
            events,
            finished: false,
        })
    }

    /// Runs `request` (or code) to completion, without input forwarding: `input()` raises
    /// `EOFError`.
    ///
    pub async fn run(
        &self,
        request: impl Into<ExecuteRequest>,
    ) -> Result<ExecutionResult, EngineError> {
        let mut request = request.into();
        request.input = false;
        // Nobody reads them: the result carries all the output.
        request.stream = false;
        let (events_tx, mut events) = mpsc::unbounded_channel();
        self.handle.addr.do_send(Execute {
            request,
            events: events_tx,
        });
        while let Some(progress) = events.recv().await {
            match progress {
                Progress::Event(ExecutionEvent::Finished(result)) => return Ok(*result),
                Progress::Refused(refused) => return Err(refused.into()),
                Progress::Accepted(_) | Progress::Event(_) => {}
            }
        }
        Err(EngineError::Stopped)
    }

    /// Answers the pending `input()` of `execution_id`; `None` makes it raise `EOFError`.
    pub async fn send_input(
        &self,
        execution_id: &str,
        value: Option<String>,
    ) -> Result<(), EngineError> {
        self.handle
            .addr
            .send(SendInput {
                execution_id: execution_id.to_owned(),
                value,
            })
            .await??;
        Ok(())
    }

    /// Raises `KeyboardInterrupt` in the running code; false if nothing was running.
    pub async fn interrupt(&self) -> Result<bool, EngineError> {
        Ok(self.handle.addr.send(Interrupt).await?)
    }

    /// The names and attributes that can finish the word ending at character `cursor` of
    /// `code` (the end when `None`), from the session's namespace, as `rlcompleter` finds
    /// them: no call or subscript is evaluated. While code runs the answer is at once empty
    /// and `busy`.
    pub async fn complete(
        &self,
        code: impl Into<String>,
        cursor: Option<usize>,
    ) -> Result<Completion, EngineError> {
        let code = code.into();
        let cursor = cursor.unwrap_or_else(|| code.chars().count());
        Ok(self.handle.addr.send(Complete { code, cursor }).await??)
    }

    /// Tells the engine that the session will likely run `code` soon: while the session is
    /// idle, it is computed ahead (in a fork of the worker, never in the namespace) and
    /// answers the request for it if nothing it read has changed. Returns how many snippets
    /// were taken; 0 when the session is not proactive.
    pub async fn hint(&self, code: Vec<String>) -> Result<usize, EngineError> {
        if self.handle.predictor.is_none() {
            return Ok(0);
        }
        Ok(self.handle.addr.send(Hint { code }).await?)
    }

    /// Whether the engine computes ahead of this session's requests.
    pub fn proactive(&self) -> bool {
        self.handle.predictor.is_some()
    }

    /// A snapshot of the session's state; a closed session (closed by anyone, or for being
    /// idle) answers [`SessionError::Closed`], as it does to everything else.
    pub async fn info(&self) -> Result<SessionSnapshot, EngineError> {
        let snapshot = self.handle.addr.send(GetInfo).await?;
        if snapshot.phase == SessionPhase::Closed {
            return Err(SessionError::Closed {
                session_id: snapshot.session_id,
            }
            .into());
        }
        Ok(snapshot)
    }

    /// The files of the session's work directory (`session.files.*`).
    pub fn files(&self) -> SessionFiles {
        SessionFiles::new(self.clone())
    }

    /// Where the session's files are, as its current worker has them.
    pub(crate) async fn work_dir(&self) -> Result<WorkDir, EngineError> {
        Ok(self.handle.addr.send(GetWorkDir).await??)
    }

    /// Forks the session: `count` (1 to [`MAX_FORKS`]) new sessions, each starting with a
    /// copy-on-write copy of this one's namespace as it is between executions (a running
    /// execution is waited for), with its owner and limits, its own id (and the name of
    /// `names` at its place, when given: then `count` is their number), its own process,
    /// process group, cgroup, checkpoints and crash recovery. This session is untouched. A
    /// clone shares this session's uid and work directory (see docs/protocol.md).
    pub async fn fork(&self, count: usize, names: Vec<String>) -> Result<Forked, EngineError> {
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(EngineError::InvalidFork(format!(
                "count: from 1 to {MAX_FORKS}, got {count}"
            )));
        }
        if !names.is_empty() && names.len() != count {
            return Err(EngineError::InvalidFork(format!(
                "names: {} names for {count} clones",
                names.len()
            )));
        }
        let fork = ForkSession {
            session: self.id().to_owned(),
            owner: self.owner().map(str::to_owned),
            count,
            names,
        };
        let forked = self.handle.registry.send(fork).await??;
        Ok(Forked {
            sessions: forked.sessions.into_iter().map(Session::new).collect(),
            threads: forked.threads,
            duration: forked.duration,
        })
    }

    /// Whether the session came back from checkpoints an earlier engine left on disk.
    pub fn restored(&self) -> bool {
        self.handle.restored
    }

    /// Checkpoints the namespace as it is once the running execution (if any) ends.
    pub async fn checkpoint(&self) -> Result<CheckpointSummary, EngineError> {
        Ok(self.handle.addr.send(CheckpointNow).await??)
    }

    /// Puts the namespace back as checkpoint `checkpoint_id` (`c-N`; the latest when `None`)
    /// saved it. Names the session has now and the checkpoint does not are removed.
    pub async fn restore(
        &self,
        checkpoint_id: Option<&str>,
    ) -> Result<RestoreSummary, EngineError> {
        let checkpoint_id = checkpoint_id
            .map(str::parse::<CheckpointId>)
            .transpose()
            .map_err(|err| SessionError::Checkpoint {
                session_id: self.id().to_owned(),
                source: Arc::new(err),
            })?;
        Ok(self
            .handle
            .addr
            .send(RestoreCheckpoint { checkpoint_id })
            .await??)
    }

    /// The session's checkpoints, newest first.
    pub async fn checkpoints(&self) -> Result<Vec<CheckpointInfo>, EngineError> {
        Ok(self.handle.addr.send(ListCheckpoints).await??)
    }

    /// Ends the session and its worker, and deletes its checkpoints; returns once the worker
    /// is gone.
    pub async fn close(self) -> Result<(), EngineError> {
        let close = Close {
            graceful: true,
            state: CloseState::Forget,
        };
        Ok(self.handle.addr.send(close).await?)
    }

    /// Ends the session and its worker at once, without waiting; for a task's session whose
    /// loop ended or was dropped.
    pub(crate) fn close_in_background(&self) {
        self.handle.addr.do_send(Close {
            graceful: false,
            state: CloseState::Forget,
        });
    }

    /// Takes a last checkpoint, then ends the session and its worker. A named session's
    /// checkpoints stay on disk, so that a later engine brings it back on first use.
    pub async fn close_with_checkpoint(self) -> Result<(), EngineError> {
        let close = Close {
            graceful: true,
            state: CloseState::Checkpoint,
        };
        Ok(self.handle.addr.send(close).await?)
    }
}

/// The events of one execution, in order; the last one is [`ExecutionEvent::Finished`].
#[derive(Debug)]
pub struct Execution {
    ticket: ExecutionTicket,
    session_id: String,
    events: mpsc::UnboundedReceiver<Progress>,
    finished: bool,
}

impl Execution {
    /// The execution's id (`e-N`), for [`Session::send_input`].
    pub fn id(&self) -> &str {
        &self.ticket.execution_id
    }

    /// The execution's number within its session.
    pub fn count(&self) -> u64 {
        self.ticket.execution_count
    }

    /// Skips the remaining events and returns the result.
    pub async fn result(mut self) -> Result<ExecutionResult, EngineError> {
        while let Some(progress) = self.events.recv().await {
            if let Progress::Event(ExecutionEvent::Finished(result)) = progress {
                return Ok(*result);
            }
        }
        Err(EngineError::Session(SessionError::Closed {
            session_id: self.session_id,
        }))
    }
}

impl Stream for Execution {
    type Item = ExecutionEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ExecutionEvent>> {
        if self.finished {
            return Poll::Ready(None);
        }
        // The ticket was taken before, and an accepted execution is never refused later,
        // so only events arrive here.
        match self.events.poll_recv(cx) {
            Poll::Ready(Some(Progress::Event(event))) => {
                self.finished = matches!(event, ExecutionEvent::Finished(_));
                Poll::Ready(Some(event))
            }
            Poll::Ready(Some(_) | None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
