//! Checkpoints and restores on one worker directly: asking for a checkpoint into a directory,
//! restoring one, and reading what their answers say was saved, kept or lost.

use std::path::Path;

use pyvisor_actors::worker::Worker;
use pyvisor_protocol::{CheckpointGroup, HostMessage, LostName, RestoreGroup, WorkerMessage};

use super::frames::{next_message, send};

pub struct CheckpointDone {
    pub bytes: u64,
    pub saved: Vec<String>,
    pub lost: Vec<LostName>,
    pub error: Option<String>,
    pub index: serde_json::Value,
    pub groups: Vec<CheckpointGroup>,
}

impl CheckpointDone {
    /// The restore groups of this checkpoint, whose blob files are in `dir`; every group
    /// must have been written (no earlier checkpoint to take unchanged ones from).
    pub fn restore_groups(&self, dir: &Path) -> Vec<RestoreGroup> {
        self.groups
            .iter()
            .map(|group| RestoreGroup {
                token: group.token.clone(),
                names: group.names.clone(),
                path: dir
                    .join(group.file.as_ref().expect("the group was written"))
                    .to_string_lossy()
                    .into_owned(),
            })
            .collect()
    }
}

pub async fn checkpoint_done(worker: &mut Worker, wanted: &str) -> CheckpointDone {
    match next_message(worker).await {
        WorkerMessage::CheckpointDone {
            id,
            bytes,
            saved,
            lost,
            error,
            index,
            groups,
        } if id == wanted => CheckpointDone {
            bytes,
            saved,
            lost,
            error,
            index,
            groups,
        },
        other => panic!("expected checkpoint_done {wanted}, got {other:?}"),
    }
}

pub fn checkpoint_message(
    id: &str,
    dir: &Path,
    background: bool,
    incremental: bool,
) -> HostMessage {
    HostMessage::Checkpoint {
        id: id.into(),
        dir: dir.to_str().unwrap().into(),
        background,
        incremental,
        max_bytes: u64::MAX,
    }
}

/// A checkpoint of every group into the directory `dir`, written by the worker itself.
pub async fn checkpoint(worker: &mut Worker, dir: &Path) -> CheckpointDone {
    std::fs::create_dir_all(dir).unwrap();
    send(worker, checkpoint_message("c", dir, false, false));
    checkpoint_done(worker, "c").await
}

pub struct RestoreDone {
    pub restored: Vec<String>,
    pub kept: Vec<String>,
    pub lost: Vec<LostName>,
    pub error: Option<String>,
}

pub async fn restore_groups(
    worker: &mut Worker,
    index: serde_json::Value,
    groups: Vec<RestoreGroup>,
    clear: bool,
) -> RestoreDone {
    send(
        worker,
        HostMessage::Restore {
            id: "r".into(),
            index,
            groups,
            clear,
        },
    );
    match next_message(worker).await {
        WorkerMessage::RestoreDone {
            id,
            restored,
            lost,
            error,
            kept,
        } if id == "r" => RestoreDone {
            restored,
            kept,
            lost,
            error,
        },
        other => panic!("expected restore_done, got {other:?}"),
    }
}

/// Restores the checkpoint `done`, written to `dir`.
pub async fn restore(
    worker: &mut Worker,
    done: &CheckpointDone,
    dir: &Path,
    clear: bool,
) -> (Vec<String>, Vec<LostName>, Option<String>) {
    let outcome = restore_groups(worker, done.index.clone(), done.restore_groups(dir), clear).await;
    (outcome.restored, outcome.lost, outcome.error)
}

pub fn blob_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| entry.metadata().unwrap().len())
        .sum()
}

pub fn names(lost: &[LostName]) -> Vec<&str> {
    let mut names: Vec<&str> = lost.iter().map(|lost| lost.name.as_str()).collect();
    names.sort_unstable();
    names
}

pub fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|saved| saved == name)
}
