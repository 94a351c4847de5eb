//! [`Session`]: the caller's handle on one persistent Python namespace, and [`Execution`],
//! the stream of events of one run.

use std::pin::Pin;
use std::task::{Context, Poll};

use actix::Addr;
use futures::Stream;
use pyvisor_actors::session::{
    Close, Execute, ExecutionTicket, GetInfo, Interrupt, SendInput, SessionActor, SessionSnapshot,
};
use pyvisor_actors::supervisor::SessionHandle;
use pyvisor_actors::{ExecuteRequest, ExecutionEvent, ExecutionResult, SessionError};
use tokio::sync::mpsc;

use crate::errors::EngineError;

/// A persistent Python session. Cheap to clone; every clone talks to the same namespace.
#[derive(Debug, Clone)]
pub struct Session {
    id: String,
    pid: u32,
    python_version: String,
    addr: Addr<SessionActor>,
}

impl Session {
    pub(crate) fn new(handle: SessionHandle) -> Self {
        Self {
            id: handle.session_id,
            pid: handle.worker.pid,
            python_version: handle.worker.python_version,
            addr: handle.addr,
        }
    }

    /// The stable public id of the session.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Process id of the worker the session started with.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Version of the session's Python interpreter, e.g. `3.11.7`.
    pub fn python_version(&self) -> &str {
        &self.python_version
    }

    /// Queues `request` and returns the stream of its events, ending in its result.
    pub async fn execute(
        &self,
        request: impl Into<ExecuteRequest>,
    ) -> Result<Execution, EngineError> {
        let (events_tx, events) = mpsc::unbounded_channel();
        let ticket = self
            .addr
            .send(Execute {
                request: request.into(),
                events: events_tx,
            })
            .await??;
        Ok(Execution {
            ticket,
            session_id: self.id.clone(),
            events,
            finished: false,
        })
    }

    /// Runs `code` to completion (no input forwarding: `input()` raises `EOFError`).
    ///
    /// Unlike [`Self::execute`] it does not wait for the session to accept the request
    /// before waiting for the result: a refusal arrives on the same channel as the result,
    /// which saves a round trip to the actor thread on the hot path.
    pub async fn run(&self, code: impl Into<String>) -> Result<ExecutionResult, EngineError> {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        self.addr.do_send(Execute {
            request: ExecuteRequest::new(code),
            events: events_tx,
        });
        while let Some(event) = events.recv().await {
            match event {
                Ok(ExecutionEvent::Finished(result)) => return Ok(*result),
                Ok(_) => {}
                Err(refused) => return Err(refused.into()),
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
        self.addr
            .send(SendInput {
                execution_id: execution_id.to_owned(),
                value,
            })
            .await??;
        Ok(())
    }

    /// Raises `KeyboardInterrupt` in the running code; false if nothing was running.
    pub async fn interrupt(&self) -> Result<bool, EngineError> {
        Ok(self.addr.send(Interrupt).await?)
    }

    /// A snapshot of the session's state.
    pub async fn info(&self) -> Result<SessionSnapshot, EngineError> {
        Ok(self.addr.send(GetInfo).await?)
    }

    /// Ends the session and its worker; returns once the worker is gone.
    pub async fn close(self) -> Result<(), EngineError> {
        Ok(self.addr.send(Close { graceful: true }).await?)
    }
}

/// The events of one execution, in order; the last one is [`ExecutionEvent::Finished`].
#[derive(Debug)]
pub struct Execution {
    ticket: ExecutionTicket,
    session_id: String,
    events: mpsc::UnboundedReceiver<Result<ExecutionEvent, SessionError>>,
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
        while let Some(event) = self.events.recv().await {
            if let Ok(ExecutionEvent::Finished(result)) = event {
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
        // An accepted execution is never refused later, so only events arrive here.
        match self.events.poll_recv(cx) {
            Poll::Ready(Some(Ok(event))) => {
                self.finished = matches!(event, ExecutionEvent::Finished(_));
                Poll::Ready(Some(event))
            }
            Poll::Ready(Some(Err(_)) | None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
