//! A Rust client of the daemon's JSON-RPC API (docs/protocol.md) over its Unix socket.
//!
//! [`Client::connect`] opens one connection. The client is cheap to clone, every clone shares
//! that connection, and any number of calls may be in flight on it at once: a background task
//! reads the connection and hands each response to the call with its id, and the
//! notifications of a streaming execution to its [`ClientExecution`]. Params and results are
//! the types of [`crate::rpc::wire`], which the server uses too, so both ends agree by
//! construction.
//!
//! ```no_run
//! # async fn demo() -> Result<(), pyvisor::client::ClientError> {
//! use futures::StreamExt;
//! use pyvisor::client::{Client, Event};
//! use pyvisor::rpc::wire::{CreateParams, ExecuteParams};
//!
//! let client = Client::connect("/run/user/1000/pyvisor/pyvisor.sock").await?;
//! let session = client.create_session(CreateParams::default()).await?;
//! let result = client
//!     .execute(ExecuteParams::new(&session.session_id, "6 * 7"))
//!     .await?;
//! assert_eq!(result.result.unwrap().repr, "42");
//!
//! let code = "for i in range(3): print(i)";
//! let mut execution = client
//!     .execute_streaming(ExecuteParams::new(&session.session_id, code))
//!     .await?;
//! while let Some(event) = execution.next().await {
//!     match event? {
//!         Event::Output { data, .. } => print!("{data}"),
//!         Event::Finished(result) => println!("status: {}", result.status.as_str()),
//!         _ => {}
//!     }
//! }
//! client.close(&session.session_id, false).await?;
//! # Ok(()) }
//! ```

mod connection;
mod execution;
mod files;

use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use self::connection::{decode, Connection};
pub use self::execution::{ClientExecution, Event};
pub use self::files::FileRange;
pub use crate::errors::ClientError;
use crate::rpc::code;
use crate::rpc::wire::{
    self, method, CheckpointEntry, CheckpointTaken, CreateParams, Created, ExecuteParams, Health,
    SessionInfo, Stats,
};
use crate::task::{TaskMessage, TaskOutcome, TaskRequest};
use crate::ExecutionResult;

/// A connection to a pyvisor daemon. Cheap to clone; the last clone dropped closes it.
#[derive(Clone)]
pub struct Client {
    connection: Arc<Connection>,
}

impl Client {
    /// Connects to the daemon listening on the Unix socket at `path`.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::Connect {
                path: path.to_owned(),
                source,
            })?;
        let (reader, writer) = stream.into_split();
        Ok(Client::from_io(reader, writer))
    }

    /// A client over any byte transport that speaks the same line protocol, e.g. the
    /// stdin/stdout of a `pyvisor serve --stdio` child. Needs a tokio runtime.
    pub fn from_io<R, W>(reader: R, writer: W) -> Client
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        Client {
            connection: Arc::new(Connection::start(reader, writer)),
        }
    }

    /// Calls `method` with `params` (omitted when `null`) and returns the raw result.
    ///
    /// A streaming `session.execute` made this way gets no notifications routed to it; use
    /// [`Self::execute_streaming`].
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        let params = (!params.is_null()).then_some(params);
        self.request(method, params.as_ref()).await
    }

    /// Sends `method` with `params` as a notification: no id, no response.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), ClientError> {
        let params = (!params.is_null()).then_some(params);
        self.connection.notify(method, params.as_ref())
    }

    /// Runs a task (`task.run` with `stream: true`), sending each step to `steps` as it
    /// arrives; the request's `task_id` is set to a fresh one when it has none.
    pub async fn run_task(
        &self,
        mut request: TaskRequest,
        steps: mpsc::UnboundedSender<TaskMessage>,
    ) -> Result<TaskOutcome, ClientError> {
        let task_id = request.task_id.get_or_insert_with(fresh_task_id).clone();
        let mut params = serde_json::to_value(&request)
            .map_err(|err| ClientError::Protocol(format!("encode the task: {err}")))?;
        params["stream"] = Value::Bool(true);
        let mut notes = self.connection.watch_task(&task_id);
        let outcome = self.typed::<TaskOutcome>(crate::rpc::task::RUN, Some(&params));
        tokio::pin!(outcome);
        let forward = |note: Value| {
            if let Ok(note) = serde_json::from_value::<crate::rpc::task::StepNote>(note) {
                let _ = steps.send(note.message);
            }
        };
        let outcome = loop {
            tokio::select! {
                biased;
                Some(note) = notes.recv() => forward(note),
                outcome = &mut outcome => break outcome,
            }
        };
        // Steps come before the result on the connection: those read with it are here.
        while let Ok(note) = notes.try_recv() {
            forward(note);
        }
        self.connection.unwatch_task(&task_id);
        outcome
    }

    /// Creates a session, or attaches to the live session with the same `name`.
    pub async fn create_session(&self, params: CreateParams) -> Result<Created, ClientError> {
        let created: Created = self.typed(method::CREATE, Some(&params)).await?;
        self.connection
            .learn_session(&created.session_id, &created.session_id);
        if let Some(name) = &params.name {
            self.connection.learn_session(name, &created.session_id);
        }
        Ok(created)
    }

    /// Runs code to completion and returns its result. `params.stream` is ignored: nothing
    /// is streamed, and `input()` raises `EOFError` once the server finds nobody to ask.
    pub async fn execute(&self, params: ExecuteParams) -> Result<ExecutionResult, ClientError> {
        let params = ExecuteParams {
            stream: false,
            ..params
        };
        // Executes keep their order behind a streaming one of the same session.
        let session_id = if self.connection.has_streams() {
            Some(self.session_id(&params.session_id).await?)
        } else {
            None
        };
        let reply = self.connection.execute(session_id.as_deref(), &params)?;
        let outcome = reply.await.map_err(|_| ClientError::Closed)?;
        let value = self.forget_if_unknown(&params.session_id, outcome)?;
        decode(method::EXECUTE, value)
    }

    /// Starts code and returns its events: output as it is printed, `input()` requests,
    /// displays, and the result last. Sets `params.stream`.
    ///
    /// Executions of one session that this client starts run in the order they were started.
    /// A session named by a name this client has not seen costs one `session.info` first.
    pub async fn execute_streaming(
        &self,
        params: ExecuteParams,
    ) -> Result<ClientExecution, ClientError> {
        let params = ExecuteParams {
            stream: true,
            ..params
        };
        let session_id = self.session_id(&params.session_id).await?;
        let updates = self.connection.execute_streaming(&session_id, &params)?;
        Ok(ClientExecution::new(self.clone(), session_id, updates))
    }

    /// Answers the pending `input()` of an execution; `None` makes it raise `EOFError`.
    pub async fn send_input(
        &self,
        session_id: &str,
        execution_id: &str,
        value: Option<String>,
    ) -> Result<(), ClientError> {
        let params = wire::InputParams {
            session_id: session_id.to_owned(),
            execution_id: execution_id.to_owned(),
            value,
        };
        let _: wire::Empty = self.typed(method::INPUT, Some(&params)).await?;
        Ok(())
    }

    /// Raises `KeyboardInterrupt` in the session's running code; false if nothing ran.
    pub async fn interrupt(&self, session_id: &str) -> Result<bool, ClientError> {
        let interrupted: wire::Interrupted = self
            .typed(method::INTERRUPT, Some(&session_ref(session_id)))
            .await?;
        Ok(interrupted.interrupted)
    }

    /// Checkpoints the session's namespace.
    pub async fn checkpoint(&self, session_id: &str) -> Result<CheckpointTaken, ClientError> {
        self.typed(method::CHECKPOINT, Some(&session_ref(session_id)))
            .await
    }

    /// Puts the namespace back as a checkpoint saved it (the latest when `None`).
    pub async fn restore(
        &self,
        session_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<wire::Restored, ClientError> {
        let params = wire::RestoreParams {
            session_id: session_id.to_owned(),
            checkpoint_id: checkpoint_id.map(str::to_owned),
        };
        self.typed(method::RESTORE, Some(&params)).await
    }

    /// The session's checkpoints, newest first.
    pub async fn checkpoints(&self, session_id: &str) -> Result<Vec<CheckpointEntry>, ClientError> {
        self.typed(method::CHECKPOINTS, Some(&session_ref(session_id)))
            .await
    }

    /// The session's state and namespace.
    pub async fn info(&self, session_id: &str) -> Result<SessionInfo, ClientError> {
        let outcome = self
            .request(method::INFO, Some(&session_ref(session_id)))
            .await;
        let value = self.forget_if_unknown(session_id, outcome)?;
        let info: SessionInfo = decode(method::INFO, value)?;
        self.connection.learn_session(session_id, &info.session_id);
        Ok(info)
    }

    /// The live sessions, oldest first; with an `owner`, only that owner's.
    pub async fn list(&self, owner: Option<&str>) -> Result<Vec<SessionInfo>, ClientError> {
        let params = wire::ListParams {
            owner: owner.map(str::to_owned),
        };
        let sessions: Vec<SessionInfo> = self.typed(method::LIST, Some(&params)).await?;
        for session in &sessions {
            self.connection
                .learn_session(&session.session_id, &session.session_id);
            if let Some(name) = &session.name {
                self.connection.learn_session(name, &session.session_id);
            }
        }
        Ok(sessions)
    }

    /// Ends the session; with `checkpoint`, takes a last checkpoint and keeps it on disk.
    pub async fn close(&self, session_id: &str, checkpoint: bool) -> Result<(), ClientError> {
        let params = wire::CloseParams {
            session_id: session_id.to_owned(),
            checkpoint,
        };
        let outcome = self.request(method::CLOSE, Some(&params)).await;
        self.connection.forget_session(session_id);
        let _: wire::Empty = decode(method::CLOSE, outcome?)?;
        Ok(())
    }

    /// The names and attributes that can finish the word ending at character `cursor` of
    /// `code` (its end when `None`), from the session's namespace.
    pub async fn complete(
        &self,
        session_id: &str,
        code: &str,
        cursor: Option<usize>,
    ) -> Result<wire::Completed, ClientError> {
        let params = wire::CompleteParams {
            session_id: session_id.to_owned(),
            code: code.to_owned(),
            cursor,
        };
        self.typed(method::COMPLETE, Some(&params)).await
    }

    /// Forks the session into `count` clones (named `names`, when given): `session.fork`.
    pub async fn fork(
        &self,
        session_id: &str,
        count: Option<usize>,
        names: Vec<String>,
    ) -> Result<wire::ForkResult, ClientError> {
        let params = wire::ForkParams {
            session_id: session_id.to_owned(),
            count,
            names: (!names.is_empty()).then_some(names),
        };
        self.typed(method::FORK, Some(&params)).await
    }

    /// The pool's figures and the engine's totals.
    pub async fn stats(&self) -> Result<Stats, ClientError> {
        self.typed(method::STATS, None::<&Value>).await
    }

    /// Whether the server is serving (`ok`) or stopping, its version and uptime.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.typed(method::HEALTH, None::<&Value>).await
    }

    async fn request(
        &self,
        method: &str,
        params: Option<&impl Serialize>,
    ) -> Result<Value, ClientError> {
        let reply = self.connection.call(method, params)?;
        reply.await.map_err(|_| ClientError::Closed)?
    }

    async fn typed<T: DeserializeOwned>(
        &self,
        method: &str,
        params: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        decode(method, self.request(method, params).await?)
    }

    /// The session id that `key` (an id or a name) stands for, asking the server once.
    async fn session_id(&self, key: &str) -> Result<String, ClientError> {
        match self.connection.known_session(key) {
            Some(session_id) => Ok(session_id),
            None => Ok(self.info(key).await?.session_id),
        }
    }

    /// Passes `outcome` on; an "unknown session" error also drops what `key` stood for, so
    /// that a name reused for a new session is looked up anew.
    fn forget_if_unknown(
        &self,
        key: &str,
        outcome: Result<Value, ClientError>,
    ) -> Result<Value, ClientError> {
        if let Err(ClientError::Rpc(err)) = &outcome {
            if err.code == code::UNKNOWN_SESSION {
                self.connection.forget_session(key);
            }
        }
        outcome
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

fn session_ref(session_id: &str) -> wire::SessionRef {
    wire::SessionRef {
        session_id: session_id.to_owned(),
    }
}

/// A task id no other client is likely to use: the process, the time and a count.
fn fresh_task_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let count = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t-{}-{nanos:x}-{count}", std::process::id())
}
