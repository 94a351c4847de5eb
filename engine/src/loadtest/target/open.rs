//! Opening the target a scenario names: starting an embedded engine, a daemon or a cluster, or
//! connecting to one already running, then checking that it answers a health check in time.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::socket::Socket;
use super::{kind, Target};
use crate::client::Client;
use crate::loadtest::cluster::{ClusterSpec, HarnessCluster};
use crate::loadtest::daemon::HarnessDaemon;
use crate::loadtest::http::Http;
use crate::loadtest::scenario::TargetSpec;
use crate::loadtest::LoadtestError;
use crate::{Engine, EngineConfig, StateConfig};

/// How long the target has to answer its first health check.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

impl Target {
    /// Opens the target of `spec` (or wraps `engine`, the caller's own) and checks it answers.
    pub async fn open(spec: &TargetSpec, engine: Option<Engine>) -> Result<Target, LoadtestError> {
        let unreachable = LoadtestError::Target;
        let target = match (spec, engine) {
            (_, Some(engine)) => Target::Embedded {
                engine,
                _state: None,
            },
            (TargetSpec::Embedded { durability }, None) => {
                let state = tempfile::Builder::new()
                    .prefix("pyvisor-loadtest-")
                    .tempdir()
                    .map_err(|err| unreachable(format!("create a state directory: {err}")))?;
                let defaults = EngineConfig::default();
                let config = EngineConfig {
                    state: StateConfig {
                        dir: Some(state.path().to_owned()),
                        auto: crate::AutoCheckpoint {
                            durability: *durability,
                            ..defaults.state.auto
                        },
                        ..defaults.state
                    },
                    ..defaults
                };
                let engine = Engine::start(config)
                    .await
                    .map_err(|err| unreachable(format!("start an engine: {err}")))?;
                Target::Embedded {
                    engine,
                    _state: Some(state),
                }
            }
            (TargetSpec::Socket { path, .. }, None) => {
                let path = match path {
                    Some(path) => path.clone(),
                    None => configured_socket().map_err(unreachable)?,
                };
                let path = &path;
                let connect = tokio::time::timeout(HEALTH_TIMEOUT, Client::connect(path));
                let client = match connect.await {
                    Ok(Ok(client)) => client,
                    Ok(Err(err)) => {
                        return Err(unreachable(format!(
                            "the socket {} does not answer: {err}",
                            path.display()
                        )))
                    }
                    Err(_) => {
                        return Err(unreachable(format!(
                            "the socket {} does not answer within {HEALTH_TIMEOUT:?}",
                            path.display()
                        )))
                    }
                };
                Target::Socket(Socket::new(client, path.clone(), None))
            }
            (TargetSpec::Daemon { binary, durability }, None) => {
                let (daemon, client) = HarnessDaemon::start(binary.as_deref(), *durability)
                    .await
                    .map_err(unreachable)?;
                Target::Socket(Socket::new(
                    client,
                    daemon.socket().to_owned(),
                    Some(daemon),
                ))
            }
            (TargetSpec::Http { url, token_env, .. }, None) => {
                let token = token_from(token_env.as_deref())?;
                Target::Http(Http::new(url, token).map_err(unreachable)?)
            }
            (
                TargetSpec::Cluster {
                    urls, token_env, ..
                },
                None,
            ) if !urls.is_empty() => {
                let token = token_from(token_env.as_deref())?;
                Target::Http(Http::urls(urls, token).map_err(unreachable)?)
            }
            (
                TargetSpec::Cluster {
                    nodes,
                    haproxy,
                    binary,
                    lease_ttl_s,
                    durability,
                    ..
                },
                None,
            ) => {
                let spec = ClusterSpec {
                    nodes: *nodes,
                    haproxy: *haproxy,
                    binary: binary.as_deref(),
                    lease_ttl_s: *lease_ttl_s,
                    durability: *durability,
                };
                let cluster = HarnessCluster::start(&spec).await.map_err(unreachable)?;
                let http = Http::cluster(&cluster.nodes(), cluster.front()).map_err(unreachable)?;
                Target::Cluster {
                    http,
                    cluster: Box::new(cluster),
                }
            }
        };
        match tokio::time::timeout(HEALTH_TIMEOUT, target.health()).await {
            Ok(Ok(())) => Ok(target),
            Ok(Err(kind)) => Err(unreachable(format!(
                "the target's health check failed: {kind}"
            ))),
            Err(_) => Err(unreachable(format!(
                "the target did not answer a health check within {HEALTH_TIMEOUT:?}"
            ))),
        }
    }

    async fn health(&self) -> Result<(), String> {
        match self {
            Target::Embedded { engine, .. } => engine.stats().await.map(drop).map_err(kind),
            Target::Socket(socket) => socket.client().await.health().await.map(drop).map_err(kind),
            Target::Http(http) | Target::Cluster { http, .. } => {
                http.get::<Value>("/v1/health").await.map(drop)
            }
        }
    }
}

/// The bearer token in the environment variable `name`, when one is named.
fn token_from(name: Option<&str>) -> Result<Option<String>, LoadtestError> {
    name.map(|name| {
        std::env::var(name)
            .map_err(|_| LoadtestError::Target(format!("the token variable {name} is not set")))
    })
    .transpose()
}

/// The daemon socket the configuration names, as `pyvisor exec` finds it.
fn configured_socket() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("PYVISOR_SOCKET") {
        return Ok(PathBuf::from(path));
    }
    let loaded = crate::config::Settings::load(None)
        .map_err(|err| format!("load the configuration for its socket: {err}"))?;
    Ok(loaded.settings.socket_path())
}
