//! Where `pyvisor replay` runs its sessions: an engine embedded in the command (with
//! checkpoints in a temporary state directory, as the daemon would keep them), or the
//! daemon at a socket.

use std::path::Path;

use pyvisor::client::Client;
use pyvisor::config::Settings;
use pyvisor::rpc::wire::{CreateParams, ExecuteParams};
use pyvisor::ProactiveStats;
use pyvisor::{
    Engine, EngineConfig, ExecuteRequest, ExecutionResult, Session, SessionOptions, StateConfig,
};
use tempfile::TempDir;

/// The engine that runs the replay.
pub enum Target {
    Embedded {
        engine: Engine,
        /// The state directory, removed when the replay ends.
        _state: TempDir,
    },
    Daemon(Client),
}

/// A session of the target.
pub enum Replayed {
    Embedded(Box<Session>),
    Daemon(String),
}

impl Target {
    /// The daemon at `socket`, or an embedded engine with the configured settings.
    pub async fn open(socket: Option<&Path>) -> Result<Target, String> {
        if let Some(socket) = socket {
            let client = Client::connect(socket)
                .await
                .map_err(|err| format!("failed to {err}"))?;
            return Ok(Target::Daemon(client));
        }
        let settings = Settings::load(None)
            .map_err(|err| format!("load the configuration: {err}"))?
            .settings;
        let state = tempfile::Builder::new()
            .prefix("pyvisor-replay-")
            .tempdir()
            .map_err(|err| format!("create a state directory: {err}"))?;
        let config = settings.engine_config();
        let config = EngineConfig {
            state: StateConfig {
                dir: Some(state.path().to_owned()),
                ..config.state
            },
            ..config
        };
        let engine = Engine::start(config)
            .await
            .map_err(|err| format!("start an engine: {err}"))?;
        Ok(Target::Embedded {
            engine,
            _state: state,
        })
    }

    /// A new session working in `dir`, proactive or not.
    pub async fn create(&self, proactive: bool, dir: &Path) -> Result<Replayed, String> {
        match self {
            Target::Embedded { engine, .. } => {
                let options = SessionOptions {
                    cwd: Some(dir.to_owned()),
                    proactive: Some(proactive),
                    ..SessionOptions::default()
                };
                let session = engine
                    .create_session(options)
                    .await
                    .map_err(|err| format!("create a session: {err}"))?;
                Ok(Replayed::Embedded(Box::new(session)))
            }
            Target::Daemon(client) => {
                let params = CreateParams {
                    cwd: Some(dir.to_string_lossy().into_owned()),
                    proactive: Some(proactive),
                    ..CreateParams::default()
                };
                let created = client
                    .create_session(params)
                    .await
                    .map_err(|err| format!("failed to {err}"))?;
                Ok(Replayed::Daemon(created.session_id))
            }
        }
    }

    /// Runs `code` in `session` and waits for its result.
    pub async fn execute(&self, session: &Replayed, code: &str) -> Result<ExecutionResult, String> {
        match (self, session) {
            (Target::Embedded { .. }, Replayed::Embedded(session)) => session
                .run(ExecuteRequest::new(code))
                .await
                .map_err(|err| format!("execute: {err}")),
            (Target::Daemon(client), Replayed::Daemon(session_id)) => client
                .execute(ExecuteParams::new(session_id, code))
                .await
                .map_err(|err| format!("failed to {err}")),
            _ => unreachable!("a target only makes sessions of its own kind"),
        }
    }

    /// Closes `session`.
    pub async fn close(&self, session: &Replayed) -> Result<(), String> {
        match (self, session) {
            (Target::Embedded { .. }, Replayed::Embedded(session)) => Session::clone(session)
                .close()
                .await
                .map_err(|err| format!("close: {err}")),
            (Target::Daemon(client), Replayed::Daemon(session_id)) => client
                .close(session_id, false)
                .await
                .map_err(|err| format!("failed to {err}")),
            _ => unreachable!("a target only makes sessions of its own kind"),
        }
    }

    /// The engine's proactive figures now.
    pub async fn proactive_stats(&self) -> Result<ProactiveStats, String> {
        match self {
            Target::Embedded { engine, .. } => engine
                .stats()
                .await
                .map(|stats| stats.proactive)
                .map_err(|err| format!("engine stats: {err}")),
            Target::Daemon(client) => client
                .stats()
                .await
                .map(|stats| stats.proactive)
                .map_err(|err| format!("failed to {err}")),
        }
    }
}
