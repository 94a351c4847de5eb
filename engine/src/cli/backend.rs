//! Where the command line runs code: a session of the daemon whose socket answers, through
//! [`pyvisor::client`], or a session of an engine embedded in this process for the one
//! command. `exec` and `repl` use both through [`Backend`] and see one event type,
//! [`ExecutionEvent`], so that they are written once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use pyvisor::client::{Client, ClientError, ClientExecution, Event};
use pyvisor::config::Settings;
use pyvisor::errors::ConfigError;
use pyvisor::rpc::wire::{CreateParams, ExecuteParams};
use pyvisor::{
    Engine, EngineConfig, EngineError, ExecuteRequest, Execution, ExecutionEvent, PoolConfig,
    SandboxConfig, Session, StateConfig,
};
use thiserror::Error;

/// How long the daemon's socket may take to answer `engine.health` before the command runs
/// an embedded engine instead.
const DAEMON_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a command could not run code where it wanted to.
#[derive(Debug, Error)]
pub enum BackendError {
    #[error(transparent)]
    Daemon(#[from] ClientError),
    #[error(transparent)]
    Embedded(#[from] EngineError),
    /// An execution's events stopped before its result (the engine went away).
    #[error("follow the execution: its events ended before its result")]
    Ended,
}

/// What a command that runs code asks for.
pub struct Open<'a> {
    /// The config file to use instead of the search order's (`--config`).
    pub config: Option<&'a Path>,
    /// The daemon's socket, instead of the configured one (`--socket`).
    pub socket: Option<&'a Path>,
    /// The daemon's session to use; a temporary one when `None`.
    pub session: Option<&'a str>,
    /// Without a daemon, refuse a named session (`exec`: its state would be lost) rather
    /// than warn and run it embedded (`repl`: the state lasts as long as the REPL).
    pub session_needs_daemon: bool,
    /// Say on stderr which way the code runs.
    pub verbose: bool,
    /// Embedded, keep checkpoints (in a temporary state directory) so that a crashed
    /// interpreter comes back with its namespace: worth it for a REPL, not for one `exec`.
    pub recover_crashes: bool,
}

/// Why a command could not get a session; each is a usage or configuration error.
#[derive(Debug, Error)]
pub enum OpenError {
    #[error("load the configuration: {0}")]
    Config(#[from] ConfigError),
    #[error(
        "use --session: it needs a running daemon, and there is {0}; start one with `pyvisor daemon start`"
    )]
    NeedsDaemon(NoDaemon),
    #[error(transparent)]
    Start(#[from] BackendError),
}

/// Why no daemon will run the code.
#[derive(Debug, Error)]
#[error("no daemon at {} ({reason})", socket.display())]
pub struct NoDaemon {
    socket: PathBuf,
    reason: String,
}

/// A session of the daemon at the configured socket when it answers `engine.health` with
/// `ok` in time, else of an embedded engine with the configured engine settings.
pub async fn open(open: Open<'_>) -> Result<Backend, OpenError> {
    let settings = Settings::load(open.config)?.settings;
    let socket = daemon_socket(&settings, open.socket);
    match connect_daemon(&socket).await {
        Ok(client) => {
            if open.verbose {
                eprintln!("pyvisor: using the daemon at {}", socket.display());
            }
            Ok(Backend::daemon(client, open.session).await?)
        }
        Err(reason) => {
            let absent = NoDaemon { socket, reason };
            match open.session {
                Some(_) if open.session_needs_daemon => {
                    return Err(OpenError::NeedsDaemon(absent));
                }
                Some(name) => eprintln!(
                    "pyvisor: warning: {absent}; session {name:?} lasts only as long as this \
                     command"
                ),
                None if open.verbose => {
                    eprintln!("pyvisor: {absent}; running an embedded engine");
                }
                None => {}
            }
            Ok(Backend::embedded(settings.engine_config(), open.recover_crashes).await?)
        }
    }
}

/// Where clients look for the daemon: `--socket`, else `$PYVISOR_SOCKET`, else the
/// configured or default socket.
pub fn daemon_socket(settings: &Settings, flag: Option<&Path>) -> PathBuf {
    let from_env = std::env::var_os("PYVISOR_SOCKET")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from);
    match (flag, from_env) {
        (Some(socket), _) => socket.to_owned(),
        (None, Some(socket)) => socket,
        (None, None) => settings.socket_path(),
    }
}

/// A client of the daemon at `socket`, or why there is none.
pub async fn connect_daemon(socket: &Path) -> Result<Client, String> {
    let probe = async {
        let client = Client::connect(socket).await?;
        let health = client.health().await?;
        Ok::<_, ClientError>((client, health))
    };
    match tokio::time::timeout(DAEMON_PROBE_TIMEOUT, probe).await {
        Ok(Ok((client, health))) if health.status == "ok" => Ok(client),
        Ok(Ok((_, health))) => Err(format!("it is {}", health.status)),
        Ok(Err(ClientError::Connect { source, .. })) => Err(source.to_string()),
        Ok(Err(err)) => Err(format!("failed to {err}")),
        Err(_) => Err(format!(
            "it did not answer within {} s",
            DAEMON_PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// One session to run code in, on the daemon or embedded.
pub enum Backend {
    Daemon {
        client: Client,
        session_id: String,
        /// A named session outlives the command; a temporary one is closed by [`Self::finish`].
        keep: bool,
    },
    Embedded {
        session: Box<Session>,
        /// Keeps the engine, and so the session's worker, alive; dropped after `session`.
        _engine: Engine,
        /// The engine's own state directory, if it keeps checkpoints; removed after it.
        _state_dir: Option<tempfile::TempDir>,
    },
}

impl Backend {
    /// A new session of the daemon, or its session `name` (created on first use).
    async fn daemon(client: Client, name: Option<&str>) -> Result<Backend, BackendError> {
        let params = CreateParams {
            name: name.map(str::to_owned),
            ..CreateParams::default()
        };
        let created = client.create_session(params).await?;
        Ok(Backend::Daemon {
            client,
            session_id: created.session_id,
            keep: name.is_some(),
        })
    }

    /// A session of an engine started with `config` for this command alone, with
    /// checkpoints in a temporary state directory of its own when `recover_crashes` (the
    /// configured one may belong to a running daemon, which holds its lock).
    async fn embedded(
        config: EngineConfig,
        recover_crashes: bool,
    ) -> Result<Backend, BackendError> {
        let state_dir = match recover_crashes {
            true => Some(
                tempfile::Builder::new()
                    .prefix("pyvisor-state-")
                    .tempdir()
                    .map_err(|err| {
                        EngineError::Start(format!("create a temporary state directory: {err}"))
                    })?,
            ),
            false => None,
        };
        // One session for one command: ready workers or a zygote would only cost time. It
        // runs the user's own code as the user, in the current directory: `[sandbox]`
        // confines the daemon's sessions, not this one.
        let config = EngineConfig {
            sandbox: SandboxConfig::default(),
            pool: PoolConfig {
                min_idle: 0,
                ..config.pool
            },
            zygote: false,
            state: StateConfig {
                enabled: state_dir.is_some(),
                dir: state_dir.as_ref().map(|dir| dir.path().to_owned()),
                ..config.state
            },
            ..config
        };
        let engine = Engine::start(config).await?;
        let session = engine.create_session(Default::default()).await?;
        Ok(Backend::Embedded {
            session: Box::new(session),
            _engine: engine,
            _state_dir: state_dir,
        })
    }

    /// The session's id.
    pub fn session_id(&self) -> &str {
        match self {
            Backend::Daemon { session_id, .. } => session_id,
            Backend::Embedded { session, .. } => session.id(),
        }
    }

    /// Starts `code`; its `input()` calls come back as events to answer.
    pub async fn execute(
        &self,
        code: String,
        timeout: Option<Duration>,
    ) -> Result<Run, BackendError> {
        match self {
            Backend::Daemon {
                client, session_id, ..
            } => {
                let params = ExecuteParams {
                    timeout_s: timeout.map(|timeout| timeout.as_secs_f64()),
                    ..ExecuteParams::new(session_id, code)
                };
                Ok(Run::Daemon(client.execute_streaming(params).await?))
            }
            Backend::Embedded { session, .. } => {
                let mut request = ExecuteRequest::new(code).with_input();
                request.timeout = timeout;
                Ok(Run::Embedded(session.execute(request).await?))
            }
        }
    }

    /// Answers the pending `input()` of `run`; `None` raises `EOFError`.
    pub async fn send_input(&self, run: &Run, value: Option<String>) -> Result<(), BackendError> {
        let Some(execution_id) = run.execution_id() else {
            // An input request is an event, so the id is known by now.
            return Ok(());
        };
        match self {
            Backend::Daemon {
                client, session_id, ..
            } => Ok(client.send_input(session_id, execution_id, value).await?),
            Backend::Embedded { session, .. } => {
                Ok(session.send_input(execution_id, value).await?)
            }
        }
    }

    /// Raises `KeyboardInterrupt` in the running code.
    pub async fn interrupt(&self) -> Result<bool, BackendError> {
        match self {
            Backend::Daemon {
                client, session_id, ..
            } => Ok(client.interrupt(session_id).await?),
            Backend::Embedded { session, .. } => Ok(session.interrupt().await?),
        }
    }

    /// A handle that completes names in this session, for the line editor's thread.
    pub fn completer(&self) -> Completer {
        match self {
            Backend::Daemon {
                client, session_id, ..
            } => Completer::Daemon {
                client: client.clone(),
                session_id: session_id.clone(),
            },
            Backend::Embedded { session, .. } => {
                Completer::Embedded(Box::new(session.as_ref().clone()))
            }
        }
    }

    /// Closes a temporary daemon session; a named one stays, an embedded one ends with the
    /// engine.
    pub async fn finish(self) -> Result<(), BackendError> {
        if let Backend::Daemon {
            client,
            session_id,
            keep: false,
        } = self
        {
            client.close(&session_id, false).await?;
        }
        Ok(())
    }
}

/// Completes names in a [`Backend`]'s session (`session.complete`).
pub enum Completer {
    Daemon { client: Client, session_id: String },
    Embedded(Box<Session>),
}

impl Completer {
    /// What can finish the word ending at character `cursor` of `code`; none when the
    /// session is busy or cannot answer.
    pub async fn complete(&self, code: &str, cursor: usize) -> Vec<String> {
        let matches = match self {
            Completer::Daemon { client, session_id } => client
                .complete(session_id, code, Some(cursor))
                .await
                .map(|done| done.matches)
                .map_err(BackendError::from),
            Completer::Embedded(session) => session
                .complete(code, Some(cursor))
                .await
                .map(|done| done.matches)
                .map_err(BackendError::from),
        };
        matches.unwrap_or_else(|err| {
            tracing::debug!(%err, "no completion");
            Vec::new()
        })
    }
}

/// One execution's events, from either kind of session.
pub enum Run {
    Daemon(ClientExecution),
    Embedded(Execution),
}

impl Run {
    /// The next event; `None` after `Finished`.
    pub async fn next(&mut self) -> Option<Result<ExecutionEvent, BackendError>> {
        match self {
            Run::Daemon(execution) => {
                let event = match execution.next().await? {
                    Ok(event) => event,
                    Err(err) => return Some(Err(err.into())),
                };
                Some(Ok(match event {
                    Event::Output { stream, data } => ExecutionEvent::Output { stream, data },
                    Event::InputRequest {
                        prompt, password, ..
                    } => ExecutionEvent::InputRequest { prompt, password },
                    Event::Display { mime, data } => {
                        ExecutionEvent::Display(pyvisor::DisplayData { mime, data })
                    }
                    Event::Finished(result) => ExecutionEvent::Finished(result),
                }))
            }
            Run::Embedded(execution) => execution.next().await.map(Ok),
        }
    }

    fn execution_id(&self) -> Option<&str> {
        match self {
            Run::Daemon(execution) => execution.execution_id(),
            Run::Embedded(execution) => Some(execution.id()),
        }
    }
}
