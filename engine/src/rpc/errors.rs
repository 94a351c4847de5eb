//! JSON-RPC error objects, and the one place where every engine error gets its code
//! (docs/protocol.md).

use pyvisor_actors::checkpoint::CheckpointError;
use pyvisor_actors::{PoolError, SessionError, SpawnError, SupervisorError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::errors::EngineError;
use crate::files::FileError;

/// The error codes of docs/protocol.md.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// An engine failure with no more specific code (a worker that would not start).
    pub const ENGINE_ERROR: i64 = -32000;
    pub const UNKNOWN_SESSION: i64 = -32001;
    pub const POOL_EXHAUSTED: i64 = -32002;
    pub const SESSION_BUSY: i64 = -32003;
    pub const CHECKPOINT_NOT_FOUND: i64 = -32004;
    pub const LIMIT_EXCEEDED: i64 = -32005;
    pub const SHUTTING_DOWN: i64 = -32006;
    pub const UNAUTHORIZED: i64 = -32007;
    /// Another live node of the cluster holds the session (docs/cluster.md).
    pub const HELD_ELSEWHERE: i64 = -32008;
}

/// A JSON-RPC error object: what the server sends and what [`crate::client`] returns.
#[derive(Debug, Clone, PartialEq, Error, Serialize, Deserialize)]
#[error("{message} (code {code})")]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with `code` and `message` and no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(code::PARSE_ERROR, format!("parse error: {detail}"))
    }

    pub fn invalid_request(detail: impl std::fmt::Display) -> Self {
        Self::new(code::INVALID_REQUEST, format!("invalid request: {detail}"))
    }

    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            code::METHOD_NOT_FOUND,
            format!("method not found: {method:?}"),
        )
    }

    /// Invalid params; `detail` names the field (serde's messages do).
    pub fn invalid_params(detail: impl std::fmt::Display) -> Self {
        Self::new(code::INVALID_PARAMS, format!("invalid params: {detail}"))
    }

    pub fn unauthorized() -> Self {
        Self::new(
            code::UNAUTHORIZED,
            "unauthorized: a valid bearer token is required",
        )
    }

    /// A caller naming an owner it may not act for.
    pub fn not_your_owner(owner: &str) -> Self {
        Self::new(
            code::UNAUTHORIZED,
            format!("unauthorized: this caller may not act for owner {owner:?}"),
        )
    }
}

impl From<&EngineError> for RpcError {
    fn from(err: &EngineError) -> Self {
        let code = match err {
            EngineError::Session(err) => session_code(err),
            EngineError::Supervisor(err) => supervisor_code(err),
            EngineError::Spawn(_) | EngineError::Start(_) => code::ENGINE_ERROR,
            EngineError::Stopped => code::SHUTTING_DOWN,
            // An unknown id is as invalid as a bad score: the params name what is wrong.
            EngineError::Memory(_) => code::INVALID_PARAMS,
            EngineError::MemoryDisabled => code::ENGINE_ERROR,
            // `llm: true` asks for what this engine cannot give.
            EngineError::NoLlm | EngineError::Task(_) | EngineError::InvalidFork(_) => {
                code::INVALID_PARAMS
            }
            EngineError::Files(err) => files_code(err),
        };
        RpcError::new(code, err.to_string())
    }
}

impl From<EngineError> for RpcError {
    fn from(err: EngineError) -> Self {
        RpcError::from(&err)
    }
}

#[cfg(feature = "server")]
impl From<crate::errors::ClusterError> for RpcError {
    fn from(err: crate::errors::ClusterError) -> Self {
        use crate::errors::ClusterError;
        match err {
            ClusterError::Engine(err) => RpcError::from(err),
            ClusterError::HeldElsewhere {
                ref node,
                ref advertise_url,
                ..
            } => RpcError {
                code: code::HELD_ELSEWHERE,
                message: err.to_string(),
                data: Some(serde_json::json!({"node": node, "advertise_url": advertise_url})),
            },
            err @ ClusterError::LeaseExpired { .. } => {
                RpcError::new(code::HELD_ELSEWHERE, err.to_string())
            }
            err @ ClusterError::TooManySessions { .. } => {
                RpcError::new(code::LIMIT_EXCEEDED, err.to_string())
            }
            err @ ClusterError::NameTaken { .. } => RpcError::invalid_params(err.to_string()),
            ClusterError::Draining { ref node } => RpcError {
                code: code::SHUTTING_DOWN,
                message: err.to_string(),
                data: Some(serde_json::json!({"node": node, "draining": true})),
            },
            other => RpcError::new(code::ENGINE_ERROR, other.to_string()),
        }
    }
}

fn session_code(err: &SessionError) -> i64 {
    match err {
        SessionError::Busy { .. } | SessionError::QueueFull { .. } => code::SESSION_BUSY,
        SessionError::Closed { .. } => code::UNKNOWN_SESSION,
        SessionError::NoPendingInput { .. }
        | SessionError::CursorOutOfRange { .. }
        | SessionError::NoWorkDir { .. } => code::INVALID_PARAMS,
        SessionError::TooLarge { .. } => code::LIMIT_EXCEEDED,
        SessionError::ShuttingDown { .. } => code::SHUTTING_DOWN,
        SessionError::CheckpointsOff { .. } => code::CHECKPOINT_NOT_FOUND,
        SessionError::Checkpoint { source, .. } => match source.as_ref() {
            CheckpointError::TooLarge { .. }
            | CheckpointError::MetadataTooLarge { .. }
            | CheckpointError::DiskFull { .. } => code::LIMIT_EXCEEDED,
            CheckpointError::NotFound { .. }
            | CheckpointError::UnknownCheckpoint { .. }
            | CheckpointError::Corrupt { .. }
            | CheckpointError::InvalidId { .. } => code::CHECKPOINT_NOT_FOUND,
            _ => code::ENGINE_ERROR,
        },
        SessionError::NoWorker { .. } | SessionError::WorkerState { .. } => code::ENGINE_ERROR,
        _ => code::ENGINE_ERROR,
    }
}

fn files_code(err: &FileError) -> i64 {
    match err {
        FileError::BadPath { .. } | FileError::NotFound { .. } => code::INVALID_PARAMS,
        FileError::TooLarge { .. } | FileError::DiskFull { .. } | FileError::TooMany { .. } => {
            code::LIMIT_EXCEEDED
        }
        _ => code::ENGINE_ERROR,
    }
}

fn supervisor_code(err: &SupervisorError) -> i64 {
    match err {
        SupervisorError::Pool(PoolError::Exhausted { .. }) => code::POOL_EXHAUSTED,
        SupervisorError::Pool(PoolError::ShuttingDown) | SupervisorError::ShuttingDown => {
            code::SHUTTING_DOWN
        }
        SupervisorError::Pool(_) => code::ENGINE_ERROR,
        SupervisorError::UnknownSession { .. } => code::UNKNOWN_SESSION,
        SupervisorError::TooManySessions { .. } => code::LIMIT_EXCEEDED,
        SupervisorError::Clone { source, .. } => match source.as_ref() {
            SpawnError::CloneTooDeep { .. } => code::LIMIT_EXCEEDED,
            _ => code::ENGINE_ERROR,
        },
        SupervisorError::CloneNameTaken { .. } => code::INVALID_PARAMS,
        _ => code::ENGINE_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn engine_errors_map_to_the_codes_of_the_spec() {
        let cases: Vec<(EngineError, i64)> = vec![
            (
                SupervisorError::UnknownSession {
                    session: "s-1".into(),
                }
                .into(),
                code::UNKNOWN_SESSION,
            ),
            (
                SupervisorError::Pool(PoolError::Exhausted {
                    waited: Duration::from_secs(5),
                    max_total: 2,
                })
                .into(),
                code::POOL_EXHAUSTED,
            ),
            (
                SessionError::Busy {
                    session_id: "s-1".into(),
                }
                .into(),
                code::SESSION_BUSY,
            ),
            (
                SessionError::TooLarge {
                    bytes: 10,
                    limit: 1,
                }
                .into(),
                code::LIMIT_EXCEEDED,
            ),
            (SupervisorError::ShuttingDown.into(), code::SHUTTING_DOWN),
            (
                SupervisorError::Clone {
                    session: "s-1".into(),
                    source: std::sync::Arc::new(SpawnError::CloneTooDeep { limit: 15 }),
                }
                .into(),
                code::LIMIT_EXCEEDED,
            ),
            (
                SessionError::CheckpointsOff {
                    session_id: "s-1".into(),
                }
                .into(),
                code::CHECKPOINT_NOT_FOUND,
            ),
        ];
        for (err, expected) in cases {
            let rpc = RpcError::from(&err);
            assert_eq!(rpc.code, expected, "{err}");
            assert_eq!(rpc.message, err.to_string());
        }
    }
}
