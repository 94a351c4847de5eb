//! What a session was created with that bringing it back from disk must keep: a small JSON
//! file, `options.json`, beside its checkpoints. A named session restored by a later engine
//! (on its first use, or created again without saying) gets these options back; today that is
//! whether its code has the LLM bridge, and who answers it.

use std::fs;
use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use super::{io_error, sync_dir, CheckpointStore, TRASH_PREFIX};
use crate::checkpoint::errors::CheckpointError;

/// The file's name in the session's directory.
const OPTIONS_FILE: &str = "options.json";

/// The options of a session kept with its checkpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoredOptions {
    /// Whether its code has `llm_query` and its kin.
    pub llm: bool,
    /// Whether its client answers those calls (`llm: "client"`).
    pub llm_by_client: bool,
}

impl CheckpointStore {
    /// Records `options` for `session`, replacing what was there (atomically, durably).
    pub fn save_options(
        &self,
        session: &str,
        options: StoredOptions,
    ) -> Result<(), CheckpointError> {
        let dir = self.session_dir(session);
        let lock = self.session_lock(&dir);
        let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.create_session_dir(&dir)?;
        let path = dir.join(OPTIONS_FILE);
        let temporary = dir.join(format!("{TRASH_PREFIX}{OPTIONS_FILE}"));
        let bytes = serde_json::to_vec(&options).expect("options serialize");
        let write = || -> io::Result<()> {
            let mut file = fs::File::create(&temporary)?;
            file.write_all(&bytes)?;
            file.sync_all()
        };
        write().map_err(io_error("write", &temporary))?;
        fs::rename(&temporary, &path).map_err(io_error("rename", &temporary))?;
        sync_dir(&dir)
    }

    /// The options recorded for `session`; the defaults when none were, or the file is
    /// unreadable (which is logged).
    pub fn load_options(&self, session: &str) -> StoredOptions {
        let path = self.session_dir(session).join(OPTIONS_FILE);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return StoredOptions::default(),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "cannot read a session's options");
                return StoredOptions::default();
            }
        };
        serde_json::from_slice(&bytes).unwrap_or_else(|err| {
            tracing::warn!(path = %path.display(), error = %err, "a session's options are unreadable");
            StoredOptions::default()
        })
    }
}
