//! Where a session's files live, for the engine's files API (`session.files.*`): the working
//! directory of its current worker (the client's `cwd`, else the worker's own `work`
//! directory under the sandbox), the uid that owns what is written there, and the limits on
//! it. The engine does the I/O itself; the worker is not asked.

use std::path::PathBuf;

use actix::prelude::*;

use super::{SessionActor, State};
use crate::errors::SessionError;

/// Ask where the session's files are.
#[derive(Message)]
#[rtype(result = "Result<WorkDir, SessionError>")]
pub struct GetWorkDir;

/// The session's work directory as its current worker has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkDir {
    pub path: PathBuf,
    /// The session's own uid, when it has one: files are read and written as that uid.
    pub uid: Option<u32>,
    /// Largest file the API writes (`limits.file_bytes`).
    pub file_bytes: u64,
    /// Most bytes of files the work directory may hold after an API write (`limits.disk_mb`);
    /// no bound when `None`.
    pub disk_bytes: Option<u64>,
}

impl Handler<GetWorkDir> for SessionActor {
    type Result = Result<WorkDir, SessionError>;

    fn handle(&mut self, _: GetWorkDir, _: &mut Context<Self>) -> Self::Result {
        if matches!(self.state, State::Closing | State::Closed) {
            return Err(SessionError::Closed {
                session_id: self.session_id.clone(),
            });
        }
        let Some(worker) = &self.worker else {
            return Err(self.no_worker());
        };
        let confinement = worker.confinement();
        let path = confinement
            .and_then(|confined| confined.work_dir())
            .map(PathBuf::from)
            .or_else(|| self.setup.spec.as_ref()?.cwd.clone())
            .ok_or_else(|| SessionError::NoWorkDir {
                session_id: self.session_id.clone(),
            })?;
        let limits = &self.setup.limits;
        Ok(WorkDir {
            path,
            uid: confinement.and_then(|confined| confined.uid()),
            file_bytes: limits.file_bytes,
            disk_bytes: limits.disk_mb.map(|mb| mb.saturating_mul(1024 * 1024)),
        })
    }
}
