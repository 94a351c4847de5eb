//! The connection under a [`super::Client`]: a writer task sends request lines, a reader
//! task routes response and notification lines, and a table of pending calls joins the two.
//!
//! Streaming executions need care: their notifications arrive before their response and carry
//! an `execution_id` the caller does not know yet. So the connection keeps at most one
//! streaming `session.execute` in flight per session; later executes of that session
//! (streaming or not, so that they keep their order) wait in a per-session queue here and are
//! sent when the running one's response arrives. A notification then belongs to the one
//! streaming execute in flight for its `session_id`: routing is exact, with no guessing.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::execution::{Event, Update};
use crate::errors::ClientError;
use crate::rpc::framing::{self, Frame};
use crate::rpc::wire::{self, method, notification, ExecuteParams};
use crate::rpc::{code, RpcError};
use crate::ExecutionResult;

/// Longest line accepted from the server. A result holds at most `limits.output_bytes` of
/// each stream (10 MiB by default), JSON-escaped; this leaves room for generous limits.
const MAX_LINE_BYTES: usize = 1 << 30;

/// The answer to one plain call.
pub(super) type Reply = oneshot::Receiver<Result<Value, ClientError>>;
/// The events of one streaming execution, ending with `Finished` or an error.
pub(super) type Updates = mpsc::UnboundedReceiver<Result<Update, ClientError>>;

/// One open connection; dropping it stops the reader and lets the writer drain and close.
pub(super) struct Connection {
    shared: Arc<Mutex<State>>,
    writer: mpsc::UnboundedSender<String>,
    next_id: AtomicU64,
    reader: JoinHandle<()>,
}

#[derive(Default)]
struct State {
    /// Why the connection ended; `None` while it is open.
    ended: Option<Ended>,
    /// Requests sent or queued, by id, waiting for their response.
    calls: HashMap<u64, Pending>,
    /// Sessions with a streaming execute in flight, by session id.
    sessions: HashMap<String, SessionQueue>,
    /// Session ids by the ids and names callers used for them.
    ids: HashMap<String, String>,
    /// Where the `task.step` notifications of a streaming `task.run` go, by task id.
    tasks: HashMap<String, mpsc::UnboundedSender<Value>>,
}

enum Ended {
    Eof,
    Io(io::ErrorKind, String),
}

enum Pending {
    Call(oneshot::Sender<Result<Value, ClientError>>),
    Stream {
        session_id: String,
        events: mpsc::UnboundedSender<Result<Update, ClientError>>,
    },
}

/// The streaming execute in flight for one session and the executes waiting behind it.
struct SessionQueue {
    active: Option<u64>,
    waiting: VecDeque<Queued>,
}

struct Queued {
    id: u64,
    line: String,
    streaming: bool,
}

impl Connection {
    /// Starts the reader and writer tasks over a connected transport (needs a tokio runtime).
    pub fn start<R, W>(reader: R, writer: W) -> Connection
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let shared = Arc::new(Mutex::new(State::default()));
        let (lines_tx, lines_rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(writer, lines_rx, shared.clone()));
        let reader = tokio::spawn(read_loop(reader, shared.clone(), lines_tx.clone()));
        Connection {
            shared,
            writer: lines_tx,
            next_id: AtomicU64::new(1),
            reader,
        }
    }

    /// Sends a request and returns where its answer will arrive.
    pub fn call(
        &self,
        method: &str,
        params: Option<&impl Serialize>,
    ) -> Result<Reply, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let line = request_line(Some(id), method, params)?;
        let (tx, rx) = oneshot::channel();
        let mut state = self.state();
        state.check_open()?;
        state.calls.insert(id, Pending::Call(tx));
        self.send(&mut state, line)?;
        Ok(rx)
    }

    /// The `task.step` notifications of task `task_id`, from now until [`Self::unwatch_task`].
    pub fn watch_task(&self, task_id: &str) -> mpsc::UnboundedReceiver<Value> {
        let (steps, watched) = mpsc::unbounded_channel();
        self.state().tasks.insert(task_id.to_owned(), steps);
        watched
    }

    pub fn unwatch_task(&self, task_id: &str) {
        self.state().tasks.remove(task_id);
    }

    /// Sends a notification (no id, no response).
    pub fn notify(&self, method: &str, params: Option<&impl Serialize>) -> Result<(), ClientError> {
        let line = request_line(None, method, params)?;
        let mut state = self.state();
        state.check_open()?;
        self.send(&mut state, line)
    }

    /// Sends (or queues behind the session's streaming execute) a non-streaming execute.
    /// `session_id` is the resolved session id, or `None` when no streaming execute is in
    /// flight on this connection and there is nothing to wait behind.
    pub fn execute(
        &self,
        session_id: Option<&str>,
        params: &ExecuteParams,
    ) -> Result<Reply, ClientError> {
        debug_assert!(
            !params.stream,
            "streaming executes go through execute_streaming"
        );
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let line = request_line(Some(id), method::EXECUTE, Some(params))?;
        let (tx, rx) = oneshot::channel();
        let mut guard = self.state();
        let state = &mut *guard;
        state.check_open()?;
        let queue = session_id.and_then(|session_id| state.sessions.get_mut(session_id));
        match queue {
            Some(queue) => {
                refuse_if_no_queue(session_id.unwrap_or_default(), params)?;
                queue.waiting.push_back(Queued {
                    id,
                    line,
                    streaming: false,
                });
                state.calls.insert(id, Pending::Call(tx));
            }
            None => {
                state.calls.insert(id, Pending::Call(tx));
                self.send(state, line)?;
            }
        }
        Ok(rx)
    }

    /// Sends (or queues) a streaming execute of the session `session_id` (resolved).
    pub fn execute_streaming(
        &self,
        session_id: &str,
        params: &ExecuteParams,
    ) -> Result<Updates, ClientError> {
        debug_assert!(params.stream, "a streaming execute asks for notifications");
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let line = request_line(Some(id), method::EXECUTE, Some(params))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Pending::Stream {
            session_id: session_id.to_owned(),
            events: tx,
        };
        let mut guard = self.state();
        let state = &mut *guard;
        state.check_open()?;
        match state.sessions.get_mut(session_id) {
            Some(queue) => {
                refuse_if_no_queue(session_id, params)?;
                queue.waiting.push_back(Queued {
                    id,
                    line,
                    streaming: true,
                });
                state.calls.insert(id, pending);
            }
            None => {
                state.calls.insert(id, pending);
                let queue = SessionQueue {
                    active: Some(id),
                    waiting: VecDeque::new(),
                };
                state.sessions.insert(session_id.to_owned(), queue);
                self.send(state, line)?;
            }
        }
        Ok(rx)
    }

    /// The session id `key` (an id or a name) was last seen to stand for.
    pub fn known_session(&self, key: &str) -> Option<String> {
        self.state().ids.get(key).cloned()
    }

    /// Records that `key` names the session `session_id`.
    pub fn learn_session(&self, key: &str, session_id: &str) {
        let mut state = self.state();
        state.ids.insert(key.to_owned(), session_id.to_owned());
        state
            .ids
            .insert(session_id.to_owned(), session_id.to_owned());
    }

    /// Forgets what `key` stood for, and every other key of the same session.
    pub fn forget_session(&self, key: &str) {
        self.state().forget(key);
    }

    /// Whether any streaming execute is in flight, so that executes may have to queue.
    pub fn has_streams(&self) -> bool {
        !self.state().sessions.is_empty()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }

    /// Hands `line` to the writer; the caller holds the state lock, which keeps lines in the
    /// order the queues decided.
    fn send(&self, state: &mut State, line: String) -> Result<(), ClientError> {
        if self.writer.send(line).is_err() {
            state.end(Ended::Eof);
            return Err(ClientError::Closed);
        }
        Ok(())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The writer still sends what is queued, then closes the socket.
        self.reader.abort();
    }
}

impl State {
    fn check_open(&self) -> Result<(), ClientError> {
        match &self.ended {
            None => Ok(()),
            Some(Ended::Eof) => Err(ClientError::Closed),
            Some(Ended::Io(kind, message)) => Err(io::Error::new(*kind, message.clone()).into()),
        }
    }

    /// Marks the connection ended and fails every pending call with `Closed`.
    fn end(&mut self, why: Ended) {
        if self.ended.is_some() {
            return;
        }
        self.ended = Some(why);
        for (_, pending) in self.calls.drain() {
            match pending {
                Pending::Call(tx) => {
                    let _ = tx.send(Err(ClientError::Closed));
                }
                Pending::Stream { events, .. } => {
                    let _ = events.send(Err(ClientError::Closed));
                }
            }
        }
        self.sessions.clear();
    }

    fn forget(&mut self, key: &str) {
        if let Some(session_id) = self.ids.remove(key) {
            self.ids.retain(|_, id| *id != session_id);
        }
    }

    /// The response to request `id` arrived.
    fn respond(
        &mut self,
        id: u64,
        outcome: Result<Value, ClientError>,
        writer: &mpsc::UnboundedSender<String>,
    ) {
        match self.calls.remove(&id) {
            None => tracing::debug!(id, "a response to no pending call"),
            Some(Pending::Call(tx)) => {
                let _ = tx.send(outcome);
            }
            Some(Pending::Stream { session_id, events }) => {
                if let Err(ClientError::Rpc(err)) = &outcome {
                    if err.code == code::UNKNOWN_SESSION {
                        self.forget(&session_id);
                    }
                }
                let update = outcome
                    .and_then(|value| decode::<ExecutionResult>(method::EXECUTE, value))
                    .map(|result| Update {
                        execution_id: result.execution_id.clone(),
                        event: Event::Finished(Box::new(result)),
                    });
                let _ = events.send(update);
                self.advance(&session_id, writer);
            }
        }
    }

    /// The streaming execute of `session_id` is over: send what waited behind it, up to and
    /// including the next streaming one.
    fn advance(&mut self, session_id: &str, writer: &mpsc::UnboundedSender<String>) {
        let Some(queue) = self.sessions.get_mut(session_id) else {
            return;
        };
        queue.active = None;
        while let Some(next) = queue.waiting.pop_front() {
            // A send fails only when the writer is gone; the reader then ends the connection.
            let _ = writer.send(next.line);
            if next.streaming {
                queue.active = Some(next.id);
                break;
            }
        }
        if queue.active.is_none() {
            self.sessions.remove(session_id);
        }
    }

    /// A notification arrived: hand it to the streaming execute in flight for its session,
    /// or a task's step to whoever watches that task.
    fn route(&mut self, method: &str, params: Value) {
        let (session_id, execution_id, event) = match method {
            crate::rpc::task::STEP => {
                let task = params["task_id"].as_str().unwrap_or_default();
                if let Some(steps) = self.tasks.get(task) {
                    let _ = steps.send(params);
                }
                return;
            }
            notification::OUTPUT => match decode::<wire::OutputNote>(method, params) {
                Ok(note) => (
                    note.session_id,
                    note.execution_id,
                    Event::Output {
                        stream: note.stream,
                        data: note.data,
                    },
                ),
                Err(err) => return tracing::warn!(%err, "dropped a notification"),
            },
            notification::INPUT_REQUEST => match decode::<wire::InputRequestNote>(method, params) {
                Ok(note) => (
                    note.session_id,
                    note.execution_id.clone(),
                    Event::InputRequest {
                        execution_id: note.execution_id,
                        prompt: note.prompt,
                        password: note.password,
                    },
                ),
                Err(err) => return tracing::warn!(%err, "dropped a notification"),
            },
            notification::DISPLAY => match decode::<wire::DisplayNote>(method, params) {
                Ok(note) => (
                    note.session_id,
                    note.execution_id,
                    Event::Display {
                        mime: note.mime,
                        data: note.data,
                    },
                ),
                Err(err) => return tracing::warn!(%err, "dropped a notification"),
            },
            other => return tracing::debug!(method = other, "ignored a notification"),
        };
        let active = self
            .sessions
            .get(&session_id)
            .and_then(|queue| queue.active);
        match active.and_then(|id| self.calls.get(&id)) {
            Some(Pending::Stream { events, .. }) => {
                let _ = events.send(Ok(Update {
                    execution_id,
                    event,
                }));
            }
            _ => tracing::debug!(%session_id, "a notification for no streaming execute"),
        }
    }
}

/// Fails an execute that must not wait (`queue: false`) while the session is busy with a
/// streaming execute of this connection.
fn refuse_if_no_queue(session_id: &str, params: &ExecuteParams) -> Result<(), ClientError> {
    if params.queue == Some(false) {
        return Err(RpcError::new(
            code::SESSION_BUSY,
            format!("session busy: {session_id} runs an execution of this connection"),
        )
        .into());
    }
    Ok(())
}

fn lock(shared: &Mutex<State>) -> MutexGuard<'_, State> {
    // Nothing panics while holding the lock, and the state stays consistent if it did.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One request or notification, as a line.
fn request_line(
    id: Option<u64>,
    method: &str,
    params: Option<&impl Serialize>,
) -> Result<String, ClientError> {
    #[derive(Serialize)]
    struct Request<'a, P> {
        jsonrpc: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        method: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        params: Option<P>,
    }
    let request = Request {
        jsonrpc: "2.0",
        id,
        method,
        params,
    };
    let mut line = serde_json::to_string(&request)
        .map_err(|err| ClientError::Protocol(format!("encode the {method} params: {err}")))?;
    // A server answers an oversized line with an error that has no id (it never read one),
    // which no call could be matched with: refuse it here instead.
    if line.len() > MAX_REQUEST_BYTES {
        return Err(ClientError::Rpc(RpcError::new(
            code::LIMIT_EXCEEDED,
            format!(
                "send a {method} request of {} bytes: the limit is {MAX_REQUEST_BYTES} bytes",
                line.len()
            ),
        )));
    }
    line.push('\n');
    Ok(line)
}

/// The largest request line the client sends: the server's default
/// `server.max_request_bytes`.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// Decodes the result or params of `method`.
pub(super) fn decode<T: DeserializeOwned>(method: &str, value: Value) -> Result<T, ClientError> {
    serde_json::from_value(value)
        .map_err(|err| ClientError::Protocol(format!("decode the {method} message: {err}")))
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut lines: mpsc::UnboundedReceiver<String>,
    shared: Arc<Mutex<State>>,
) {
    while let Some(line) = lines.recv().await {
        let written = async {
            writer.write_all(line.as_bytes()).await?;
            // Write what queued up meanwhile before flushing once.
            while let Ok(line) = lines.try_recv() {
                writer.write_all(line.as_bytes()).await?;
            }
            writer.flush().await
        };
        if let Err(err) = written.await {
            lock(&shared).end(Ended::Io(err.kind(), err.to_string()));
            return;
        }
    }
    let _ = writer.shutdown().await;
}

async fn read_loop<R: AsyncRead + Unpin>(
    reader: R,
    shared: Arc<Mutex<State>>,
    writer: mpsc::UnboundedSender<String>,
) {
    let mut lines = framing::lines(reader, MAX_LINE_BYTES);
    let why = loop {
        match lines.next().await {
            Some(Ok(Frame::Line(line))) => dispatch(&line, &shared, &writer),
            Some(Ok(Frame::Oversized)) => {
                // Its call can never be answered; failing everything beats a silent hang.
                tracing::warn!(limit = MAX_LINE_BYTES, "the server sent an oversized line");
                let err = io::Error::new(io::ErrorKind::InvalidData, "oversized line");
                break Ended::Io(err.kind(), err.to_string());
            }
            None => break Ended::Eof,
            Some(Err(err)) => break Ended::Io(err.kind(), err.to_string()),
        }
    };
    lock(&shared).end(why);
}

/// Routes one line from the server: a response, a notification, or a batch of them.
fn dispatch(line: &[u8], shared: &Mutex<State>, writer: &mpsc::UnboundedSender<String>) {
    let message: Value = match serde_json::from_slice(line) {
        Ok(message) => message,
        Err(err) => return tracing::warn!(%err, "the server sent a line that is not JSON"),
    };
    let mut state = lock(shared);
    match message {
        Value::Array(messages) => {
            for message in messages {
                dispatch_one(message, &mut state, writer);
            }
        }
        message => dispatch_one(message, &mut state, writer),
    }
}

fn dispatch_one(message: Value, state: &mut State, writer: &mpsc::UnboundedSender<String>) {
    let Value::Object(mut message) = message else {
        return tracing::warn!("the server sent a message that is not an object");
    };
    if let Some(Value::String(method)) = message.remove("method") {
        let params = message.remove("params").unwrap_or(Value::Null);
        return state.route(&method, params);
    }
    let id = message.remove("id").unwrap_or(Value::Null);
    let outcome = outcome(message);
    match id.as_u64() {
        Some(id) => state.respond(id, outcome, writer),
        // An error about a request the server could not read (it has no id to answer).
        None => tracing::warn!(?id, ?outcome, "a response to no request of this client"),
    }
}

/// The result or error of a response object.
fn outcome(mut response: Map<String, Value>) -> Result<Value, ClientError> {
    match (response.remove("error"), response.remove("result")) {
        (Some(error), _) if !error.is_null() => match serde_json::from_value::<RpcError>(error) {
            Ok(error) => Err(ClientError::Rpc(error)),
            Err(err) => Err(ClientError::Protocol(format!(
                "decode an error object: {err}"
            ))),
        },
        (_, Some(result)) => Ok(result),
        _ => Err(ClientError::Protocol(
            "a response with neither result nor error".into(),
        )),
    }
}
