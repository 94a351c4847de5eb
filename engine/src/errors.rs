//! Errors of the embedding API, and their mapping to `pyvisor exec` exit codes.

use pyvisor_actors::{SessionError, SpawnError, SupervisorError};
use thiserror::Error;

/// Why an engine call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The engine could not be started.
    #[error("start the engine: {0}")]
    Start(String),
    /// A worker could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The session refused the request.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The supervisor refused the request.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    /// The engine has stopped (its last handle was dropped).
    #[error("reach the engine: it has stopped")]
    Stopped,
}

impl From<actix::MailboxError> for EngineError {
    fn from(_: actix::MailboxError) -> Self {
        EngineError::Stopped
    }
}
