//! Tests of the checkpoint store, by topic: round trips and limits, corruption and crashes,
//! blobs (sharing, pruning, disk caps, compression) and seeding; here, what they share.

use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::*;
use crate::checkpoint::blobs::BLOBS_DIR;
use crate::checkpoint::{CheckpointMeta, GroupSource, LostName, NewGroup};

mod blobs;
mod corruption;
mod round_trips;
mod seeding;

const SESSION: &str = "notebook";

fn store_in(root: &Path, retention: usize, max_bytes: usize) -> CheckpointStore {
    CheckpointStore::open(CheckpointStoreConfig {
        root: root.to_path_buf(),
        retention: NonZeroUsize::new(retention).expect("tests use a retention above 0"),
        max_bytes,
        ..CheckpointStoreConfig::new(root)
    })
    .expect("open the store")
}

fn new_store() -> (TempDir, CheckpointStore) {
    let root = TempDir::new().expect("create a temp dir");
    let store = store_in(root.path(), 5, DEFAULT_MAX_BYTES);
    (root, store)
}

fn meta(execution_count: u64) -> CheckpointMeta {
    CheckpointMeta {
        execution_count,
        names_saved: vec!["df".into(), "model".into()],
        names_lost: vec![LostName {
            name: "conn".into(),
            reason: "cannot pickle 'sqlite3.Connection' object".into(),
        }],
    }
}

/// Deterministic bytes that zstd cannot shrink.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

fn file_of(store: &CheckpointStore, session: &str, sequence: u64) -> PathBuf {
    store
        .session_dir(session)
        .join(checkpoint_file_name(sequence))
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| {
            entry
                .expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

// --- checkpoints with blobs ------------------------------------------------------------------

/// A blob file with `content`, as a worker writes one, in a scratch directory.
fn blob_file(scratch: &Path, name: &str, content: &[u8]) -> NewGroup {
    let path = scratch.join(name);
    fs::write(&path, content).unwrap();
    NewGroup {
        token: name.to_owned(),
        names: vec![format!("v_{name}")],
        source: GroupSource::File(path),
    }
}

fn unchanged(token: &str) -> NewGroup {
    NewGroup {
        token: token.to_owned(),
        names: vec![format!("v_{token}")],
        source: GroupSource::Unchanged,
    }
}

fn save_groups(
    store: &CheckpointStore,
    groups: &[NewGroup],
) -> Result<CheckpointInfo, CheckpointError> {
    save_groups_of(store, SESSION, groups)
}

fn save_groups_of(
    store: &CheckpointStore,
    session: &str,
    groups: &[NewGroup],
) -> Result<CheckpointInfo, CheckpointError> {
    store.save_checkpoint(
        session,
        NewCheckpoint {
            meta: &meta(1),
            payload: b"index",
            groups,
            max_state_bytes: u64::MAX,
            seed: None,
        },
    )
}

fn blob_files(store: &CheckpointStore) -> Vec<String> {
    dir_entries(&store.session_dir(SESSION).join(BLOBS_DIR))
}

/// Waits (up to 30 s) until the blob directory of `SESSION` holds a compressed blob.
fn wait_for_compressed_blob(store: &CheckpointStore) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(name) = blob_files(store).into_iter().find(|n| n.ends_with(".zst")) {
            return name;
        }
        assert!(
            Instant::now() < deadline,
            "no blob was compressed: {:?}",
            blob_files(store)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// 2 MiB that compress well, like a pickle of a table of small integers and repeated labels.
fn table_like(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| b"label-0123,42,7.5\n"[i % 18] ^ ((i / 4096) % 3) as u8)
        .collect()
}
