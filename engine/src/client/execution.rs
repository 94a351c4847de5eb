//! [`ClientExecution`]: the events of one streaming `session.execute`, as the server's
//! notifications and then its response deliver them.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

use super::connection::Updates;
use super::Client;
use crate::errors::ClientError;
use crate::{ExecutionResult, OutputStream};

/// Something that happened during a streaming execution, in the order it happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Text the code wrote to stdout or stderr.
    Output { stream: OutputStream, data: String },
    /// The code waits in `input()`; answer with [`Client::send_input`].
    InputRequest {
        execution_id: String,
        prompt: String,
        password: bool,
    },
    /// Rich output (`data` is base64 for binary types).
    Display { mime: String, data: String },
    /// The execution is over; always the last event.
    Finished(Box<ExecutionResult>),
}

/// An event with the execution it belongs to.
#[derive(Debug)]
pub(super) struct Update {
    pub execution_id: String,
    pub event: Event,
}

/// The events of one streaming execution: a [`Stream`] of [`Event`]s that ends after
/// [`Event::Finished`], or after an error (the server refused the request, or the connection
/// closed). Dropping it does not stop the execution.
#[must_use = "a streaming execution is only observed through its events"]
pub struct ClientExecution {
    /// Keeps the connection open while the events are read.
    _client: Client,
    session_id: String,
    execution_id: Option<String>,
    updates: Updates,
    done: bool,
}

impl ClientExecution {
    pub(super) fn new(client: Client, session_id: String, updates: Updates) -> Self {
        Self {
            _client: client,
            session_id,
            execution_id: None,
            updates,
            done: false,
        }
    }

    /// The id of the session the code runs in (an id, also when it was named by name).
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The execution's id (`e-N`), once its first event has been read.
    pub fn execution_id(&self) -> Option<&str> {
        self.execution_id.as_deref()
    }

    /// Skips the remaining events and returns the result.
    pub async fn result(mut self) -> Result<ExecutionResult, ClientError> {
        use futures::StreamExt;
        while let Some(event) = self.next().await {
            if let Event::Finished(result) = event? {
                return Ok(*result);
            }
        }
        Err(ClientError::Closed)
    }
}

impl Stream for ClientExecution {
    type Item = Result<Event, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let item = match self.updates.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(update))) => {
                self.done = matches!(update.event, Event::Finished(_));
                self.execution_id = Some(update.execution_id);
                Ok(update.event)
            }
            Poll::Ready(Some(Err(err))) => {
                self.done = true;
                Err(err)
            }
            // The connection went away without a word (its reader was stopped).
            Poll::Ready(None) => {
                self.done = true;
                Err(ClientError::Closed)
            }
        };
        Poll::Ready(Some(item))
    }
}

impl std::fmt::Debug for ClientExecution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientExecution")
            .field("session_id", &self.session_id)
            .field("execution_id", &self.execution_id)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
