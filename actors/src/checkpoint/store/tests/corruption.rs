//! Tests of damaged checkpoints and crashes: a flipped byte, a truncated file, garbage or another
//! session's file fall back to the checkpoint before; no file of any damage panics or loads
//! wrong data; leftover temporary files are ignored and removed; and a writer killed with
//! SIGKILL mid-save leaves a loadable checkpoint.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::checkpoint::layout::{TEMP_PREFIX, TEMP_SUFFIX};
use crate::checkpoint::COMPRESSION_THRESHOLD;

#[test]
fn flipped_byte_in_the_newest_checkpoint_falls_back_to_the_previous() {
    let (_root, store) = new_store();
    store.save(SESSION, &meta(1), b"first state").expect("save");
    store
        .save(SESSION, &meta(2), b"second state")
        .expect("save");
    let newest = file_of(&store, SESSION, 2);
    let mut bytes = fs::read(&newest).expect("read");
    let middle = bytes.len() - 8;
    bytes[middle] ^= 0x01;
    fs::write(&newest, bytes).expect("write");

    let loaded = store.load(SESSION, None).expect("load");
    assert_eq!(loaded.payload, b"first state");
    assert_eq!(loaded.info.meta.execution_count, 1);
    assert_eq!(loaded.skipped.len(), 1);
    assert_eq!(loaded.skipped[0].id.sequence(), 2);
    assert!(matches!(
        loaded.skipped[0].reason,
        CorruptionError::Checksum
    ));

    let by_id = store.load(SESSION, Some(CheckpointId::from_sequence(2)));
    assert!(matches!(
        by_id,
        Err(CheckpointError::Corrupt {
            reason: CorruptionError::Checksum,
            ..
        })
    ));
}

#[test]
fn truncated_newest_checkpoint_falls_back_to_the_previous() {
    let (_root, store) = new_store();
    store.save(SESSION, &meta(1), b"first state").expect("save");
    store
        .save(SESSION, &meta(2), &noise(10_000, 2))
        .expect("save");
    let newest = file_of(&store, SESSION, 2);
    let len = fs::metadata(&newest).expect("stat").len();
    File::options()
        .write(true)
        .open(&newest)
        .and_then(|file| file.set_len(len / 2))
        .expect("truncate");

    let loaded = store.load(SESSION, None).expect("load");
    assert_eq!(loaded.payload, b"first state");
    assert!(matches!(
        loaded.skipped[0].reason,
        CorruptionError::Truncated { .. }
    ));
    // Listing reads only headers, but still sees that the file is short.
    let listed: Vec<_> = store
        .list(SESSION)
        .expect("list")
        .iter()
        .map(|info| info.id.sequence())
        .collect();
    assert_eq!(listed, [1]);
}

#[test]
fn garbage_files_named_like_checkpoints_are_skipped() {
    let (_root, store) = new_store();
    store.save(SESSION, &meta(1), b"state").expect("save");
    let dir = store.session_dir(SESSION);
    fs::write(
        dir.join(checkpoint_file_name(9)),
        b"not a checkpoint at all, but longer than a header",
    )
    .expect("write");
    fs::write(dir.join(checkpoint_file_name(8)), b"").expect("write");
    fs::write(dir.join("junk.ckpt"), b"junk").expect("write");

    let loaded = store.load(SESSION, None).expect("load");
    assert_eq!(loaded.payload, b"state");
    let skipped: Vec<_> = loaded.skipped.iter().map(|s| s.id.sequence()).collect();
    assert_eq!(skipped, [9, 8]);
    assert!(matches!(
        loaded.skipped[0].reason,
        CorruptionError::BadMagic
    ));
    assert!(matches!(
        loaded.skipped[1].reason,
        CorruptionError::Truncated { .. }
    ));
    // Numbering continues past the garbage, never reusing its name.
    let saved = store.save(SESSION, &meta(2), b"next").expect("save");
    assert_eq!(saved.id.sequence(), 10);
}

#[test]
fn no_usable_checkpoint_is_not_found() {
    let (_root, store) = new_store();
    match store.load("never-saved", None) {
        Err(CheckpointError::NotFound { session, skipped }) => {
            assert_eq!(session, "never-saved");
            assert!(skipped.is_empty());
        }
        other => panic!("expected NotFound, got {other:?}"),
    }

    store.save(SESSION, &meta(1), b"state").expect("save");
    fs::write(file_of(&store, SESSION, 1), b"PYVCKPT\0garbage").expect("write");
    match store.load(SESSION, None) {
        Err(CheckpointError::NotFound { skipped, .. }) => assert_eq!(skipped.len(), 1),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(
        store.load(SESSION, Some(CheckpointId::from_sequence(99))),
        Err(CheckpointError::UnknownCheckpoint { .. })
    ));
}

#[test]
fn checkpoint_moved_into_another_session_is_not_loaded_for_it() {
    let (_root, store) = new_store();
    store
        .save("alice", &meta(1), b"alice's data")
        .expect("save");
    store.save("bob", &meta(1), b"bob's data").expect("save");
    fs::copy(file_of(&store, "alice", 1), file_of(&store, "bob", 2)).expect("copy");

    let loaded = store.load("bob", None).expect("load");
    assert_eq!(loaded.payload, b"bob's data");
    assert!(matches!(
        loaded.skipped[0].reason,
        CorruptionError::WrongSession { ref found } if found == "alice"
    ));
}

#[test]
fn temporary_files_are_ignored_and_removed_on_open() {
    let (root, store) = new_store();
    store.save(SESSION, &meta(1), b"state").expect("save");
    let dir = store.session_dir(SESSION);
    let leftover = dir.join(format!("{TEMP_PREFIX}crashed{TEMP_SUFFIX}"));
    fs::write(&leftover, b"PYVCKPT\0half a checkpo").expect("write");

    assert_eq!(store.load(SESSION, None).expect("load").payload, b"state");
    assert_eq!(store.list(SESSION).expect("list").len(), 1);
    store_in(root.path(), 5, DEFAULT_MAX_BYTES);
    assert!(!leftover.exists());
    assert_eq!(dir_entries(&dir), [checkpoint_file_name(1)]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn corrupt_files_never_panic_nor_load_wrong_data(
        compressible in any::<bool>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
        extra in prop::collection::vec(any::<u8>(), 0..3),
    ) {
        let (_root, store) = new_store();
        let payload = if compressible {
            vec![b'z'; COMPRESSION_THRESHOLD + 10]
        } else {
            noise(300, 5)
        };
        store.save(SESSION, &meta(4), &payload).expect("save");
        let path = file_of(&store, SESSION, 1);
        let mut bytes = fs::read(&path).expect("read");
        for (at, mask) in flips {
            let at = at.index(bytes.len());
            bytes[at] ^= mask;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        bytes.extend(extra);
        fs::write(&path, &bytes).expect("write");

        store.list(SESSION).expect("list");
        match store.load(SESSION, None) {
            Ok(loaded) => {
                prop_assert_eq!(loaded.payload, payload);
                prop_assert_eq!(loaded.info.meta, meta(4));
            }
            Err(CheckpointError::NotFound { skipped, .. }) => prop_assert_eq!(skipped.len(), 1),
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }
}

/// Set to a store root, this makes [`crash_writer`] save checkpoints until it is killed.
const WRITER_ENV: &str = "PYVISOR_TEST_CHECKPOINT_WRITER_ROOT";

/// The payload the writer saves with a given execution count: partly incompressible, so
/// zstd works and the file is large.
fn writer_payload(execution_count: u64) -> Vec<u8> {
    let mut payload = noise(3 * 1024 * 1024, execution_count);
    payload.resize(6 * 1024 * 1024, b'p');
    payload
}

/// The writer half of the SIGKILL test, run in a child process; does nothing unless
/// [`WRITER_ENV`] is set.
#[test]
#[ignore = "run as a child process by sigkill_during_saves_leaves_a_loadable_checkpoint"]
fn crash_writer() {
    let Some(root) = std::env::var_os(WRITER_ENV) else {
        return;
    };
    let store = store_in(Path::new(&root), 3, DEFAULT_MAX_BYTES);
    let first = store
        .list(SESSION)
        .expect("list")
        .first()
        .map_or(1, |info| info.meta.execution_count + 1);
    // Bounded, should the parent fail to kill it.
    for count in first..first + 500 {
        store
            .save(SESSION, &meta(count), &writer_payload(count))
            .expect("save");
    }
}

/// Kills the writer process if a test assertion fails first.
struct WriterProcess(Child);

impl Drop for WriterProcess {
    fn drop(&mut self) {
        // Already dead after a normal run; errors only mean that.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn newest_sequence(store: &CheckpointStore) -> u64 {
    sequences(&store.session_dir(SESSION))
        .expect("list sequences")
        .first()
        .copied()
        .unwrap_or(0)
}

fn temp_files(store: &CheckpointStore) -> Vec<String> {
    dir_entries(&store.session_dir(SESSION))
        .into_iter()
        .filter(|name| is_temp_file_name(std::ffi::OsStr::new(name)))
        .collect()
}

#[test]
fn sigkill_during_saves_leaves_a_loadable_checkpoint() {
    let root = TempDir::new().expect("temp dir");
    let store = store_in(root.path(), 3, DEFAULT_MAX_BYTES);
    let test_name = concat!(module_path!(), "::crash_writer")
        .split_once("::")
        .map(|(_crate, path)| path)
        .expect("module_path! starts with the crate name");
    let test_binary = std::env::current_exe().expect("the test binary's path");

    for _ in 0..4 {
        let before = newest_sequence(&store);
        let mut writer = WriterProcess(
            Command::new(&test_binary)
                .args([test_name, "--exact", "--ignored", "--test-threads=1"])
                .env(WRITER_ENV, root.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn the writer"),
        );
        // Wait for one save to finish, then for the next one to start writing its
        // temporary file, and kill the writer there.
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut saved = false;
        loop {
            if let Some(status) = writer.0.try_wait().expect("poll the writer") {
                panic!("the writer exited early: {status}");
            }
            assert!(Instant::now() < deadline, "the writer made no progress");
            saved = saved || newest_sequence(&store) > before;
            if saved && !temp_files(&store).is_empty() {
                break;
            }
            std::thread::yield_now();
        }
        writer.0.kill().expect("SIGKILL the writer");
        writer.0.wait().expect("reap the writer");

        let reopened = store_in(root.path(), 3, DEFAULT_MAX_BYTES);
        let loaded = reopened.load(SESSION, None).expect("load after SIGKILL");
        assert!(loaded.skipped.is_empty(), "{:?}", loaded.skipped);
        assert!(loaded.info.id.sequence() > before);
        assert!(
            loaded.payload == writer_payload(loaded.info.meta.execution_count),
            "the payload of {} is not the one saved",
            loaded.info.id
        );
        let leftovers = temp_files(&reopened);
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
