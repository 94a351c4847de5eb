//! Tests of the checkpoint store: round trips, retention, corruption, crashes, blobs and caps.

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tempfile::TempDir;

use super::*;
use crate::checkpoint::{LostName, COMPRESSION_THRESHOLD};

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

#[test]
fn small_payload_round_trips_with_its_metadata() {
    let (_root, store) = new_store();
    let mut saved = store.save(SESSION, &meta(3), b"pickle").expect("save");
    assert_eq!(saved.written_bytes, Some(saved.file_bytes));
    // Only the save knows what it wrote.
    saved.written_bytes = None;
    assert_eq!(saved.id.to_string(), "c-1");
    assert!(!saved.compressed);
    assert_eq!(saved.payload_bytes, 6);

    let loaded = store.load(SESSION, None).expect("load");
    assert_eq!(loaded.payload, b"pickle");
    assert_eq!(loaded.info, saved);
    assert!(loaded.skipped.is_empty());
    assert_eq!(store.list(SESSION).expect("list"), vec![saved.clone()]);
    let by_id = store.load(SESSION, Some(saved.id)).expect("load by id");
    assert_eq!(by_id.info, saved);
}

#[test]
fn large_compressible_payload_is_stored_compressed() {
    let (_root, store) = new_store();
    let payload: Vec<u8> = b"column_a,column_b\n1.5,2.5\n"
        .iter()
        .copied()
        .cycle()
        .take(3 * 1024 * 1024)
        .collect();
    let saved = store.save(SESSION, &meta(1), &payload).expect("save");
    assert!(saved.compressed);
    let on_disk = fs::metadata(file_of(&store, SESSION, 1))
        .expect("stat")
        .len();
    assert_eq!(on_disk, saved.file_bytes);
    assert!(
        on_disk < payload.len() as u64 / 10,
        "{on_disk} bytes on disk"
    );
    assert_eq!(store.load(SESSION, None).expect("load").payload, payload);
}

#[test]
fn large_incompressible_payload_is_stored_as_is() {
    let (_root, store) = new_store();
    let payload = noise(COMPRESSION_THRESHOLD + 4096, 9);
    let saved = store.save(SESSION, &meta(1), &payload).expect("save");
    assert!(!saved.compressed);
    assert_eq!(store.load(SESSION, None).expect("load").payload, payload);
}

#[test]
fn retention_keeps_the_newest_checkpoints() {
    let root = TempDir::new().expect("temp dir");
    let store = store_in(root.path(), 3, DEFAULT_MAX_BYTES);
    for count in 1..=7 {
        store
            .save(SESSION, &meta(count), &count.to_le_bytes())
            .expect("save");
    }
    let ids: Vec<_> = store
        .list(SESSION)
        .expect("list")
        .iter()
        .map(|info| info.id.to_string())
        .collect();
    assert_eq!(ids, ["c-7", "c-6", "c-5"]);
    assert_eq!(dir_entries(&store.session_dir(SESSION)).len(), 3);
    let oldest = "c-5".parse().expect("id");
    assert_eq!(
        store.load(SESSION, Some(oldest)).expect("load").payload,
        5u64.to_le_bytes()
    );
}

#[test]
fn sequence_continues_after_the_store_is_reopened() {
    let (root, store) = new_store();
    store.save(SESSION, &meta(1), b"a").expect("save");
    store.save(SESSION, &meta(2), b"b").expect("save");
    drop(store);
    let store = store_in(root.path(), 5, DEFAULT_MAX_BYTES);
    let saved = store.save(SESSION, &meta(3), b"c").expect("save");
    assert_eq!(saved.id.sequence(), 3);
}

#[test]
fn payload_over_the_limit_fails_with_the_limit_error() {
    let root = TempDir::new().expect("temp dir");
    let store = store_in(root.path(), 5, 1000);
    store
        .save(SESSION, &meta(1), &[0; 1000])
        .expect("a payload at the limit is saved");
    match store.save(SESSION, &meta(2), &[0; 1001]) {
        Err(CheckpointError::TooLarge { bytes, limit }) => {
            assert_eq!((bytes, limit), (1001, 1000));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(store.list(SESSION).expect("list").len(), 1);
}

#[test]
fn default_limits_are_as_documented() {
    let config = CheckpointStoreConfig::new("/state");
    assert_eq!(config.retention.get(), 50);
    assert_eq!(config.max_bytes, 64 << 30);
    assert_eq!(config.session_disk_bytes, 8 << 30);
    assert_eq!(config.total_disk_bytes, 32 << 30);
}

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

#[test]
fn hostile_session_names_stay_inside_the_store() {
    let outer = TempDir::new().expect("temp dir");
    let root = outer.path().join("state");
    let store = store_in(&root, 5, DEFAULT_MAX_BYTES);
    let long = "x".repeat(5000);
    let names = ["../x", "/", "", "..", ".", "a/../../b", "\u{0}", &long];
    for (count, name) in names.iter().enumerate() {
        store
            .save(name, &meta(count as u64), name.as_bytes())
            .expect("save");
    }
    for name in names {
        assert_eq!(
            store.load(name, None).expect("load").payload,
            name.as_bytes()
        );
    }
    // Nothing was written outside <root>/sessions/<one directory per session>.
    assert_eq!(dir_entries(outer.path()), ["state"]);
    assert_eq!(dir_entries(&root), [SESSIONS_DIR]);
    let sessions_dir = root.join(SESSIONS_DIR);
    assert_eq!(dir_entries(&sessions_dir).len(), names.len());
    for dir in dir_entries(&sessions_dir) {
        assert_eq!(
            dir_entries(&sessions_dir.join(dir)),
            [checkpoint_file_name(1)]
        );
    }
    let mut expected: Vec<String> = names.iter().map(|name| name.to_string()).collect();
    expected.sort();
    assert_eq!(store.sessions().expect("sessions"), expected);
}

#[test]
fn directories_are_private_and_files_owner_only() {
    let (root, store) = new_store();
    store.save(SESSION, &meta(1), b"secret").expect("save");
    let mode = |path: &Path| fs::metadata(path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&root.path().join(SESSIONS_DIR)), 0o700);
    assert_eq!(mode(&store.session_dir(SESSION)), 0o700);
    assert_eq!(mode(&file_of(&store, SESSION, 1)), 0o600);
}

#[test]
fn sessions_on_disk_are_found_and_removed() {
    let (root, store) = new_store();
    store.save("b", &meta(1), b"1").expect("save");
    store.save("a", &meta(1), b"1").expect("save");
    // A restarted engine finds them.
    let store = store_in(root.path(), 5, DEFAULT_MAX_BYTES);
    assert_eq!(store.sessions().expect("sessions"), ["a", "b"]);

    assert!(store.remove_session("a").expect("remove"));
    assert!(!store.remove_session("a").expect("remove again"));
    assert_eq!(store.sessions().expect("sessions"), ["b"]);
    assert!(matches!(
        store.load("a", None),
        Err(CheckpointError::NotFound { .. })
    ));
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

#[test]
fn unchanged_groups_share_the_blob_of_an_earlier_checkpoint() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let big = noise(300_000, 1);
    let first = save_groups(
        &store,
        &[
            blob_file(&scratch, "a", &big),
            blob_file(&scratch, "b", b"small"),
        ],
    )
    .unwrap();
    assert_eq!(first.state_bytes, 300_005);
    assert!(first.written_bytes.unwrap() >= 300_005);
    // "a" unchanged, "b" rewritten: only the new "b" is written.
    let second = save_groups(
        &store,
        &[unchanged("a"), blob_file(&scratch, "b2", b"SMALL!")],
    )
    .unwrap();
    assert!(second.written_bytes.unwrap() < 10_000, "{second:?}");
    assert_eq!(blob_files(&store).len(), 3);
    assert!(dir_entries(&scratch).is_empty(), "taken in, not copied");

    let loaded = store.load(SESSION, None).unwrap();
    assert_eq!(loaded.info.id, second.id);
    assert_eq!(loaded.payload, b"index");
    let tokens: Vec<&str> = loaded.groups.iter().map(|g| g.token.as_str()).collect();
    assert_eq!(tokens, ["a", "b2"]);
    assert_eq!(fs::read(&loaded.groups[0].path).unwrap(), big);
    let older = store.load(SESSION, Some(first.id)).unwrap();
    assert_eq!(fs::read(&older.groups[1].path).unwrap(), b"small");
}

#[test]
fn blobs_of_pruned_checkpoints_go_and_shared_ones_stay() {
    let (root, _) = new_store();
    let store = store_in(root.path(), 2, DEFAULT_MAX_BYTES);
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    save_groups(
        &store,
        &[
            blob_file(&scratch, "keep", b"kept all along"),
            blob_file(&scratch, "x1", b"one"),
        ],
    )
    .unwrap();
    save_groups(
        &store,
        &[unchanged("keep"), blob_file(&scratch, "x2", b"two")],
    )
    .unwrap();
    assert_eq!(blob_files(&store).len(), 3);
    // The third save prunes the first checkpoint: "x1" goes, "keep" stays.
    save_groups(
        &store,
        &[unchanged("keep"), blob_file(&scratch, "x3", b"three")],
    )
    .unwrap();
    assert_eq!(store.list(SESSION).unwrap().len(), 2);
    assert_eq!(blob_files(&store).len(), 3);
    let loaded = store.load(SESSION, None).unwrap();
    assert_eq!(fs::read(&loaded.groups[0].path).unwrap(), b"kept all along");
    let contents: Vec<Vec<u8>> = blob_files(&store)
        .iter()
        .map(|name| fs::read(store.session_dir(SESSION).join(BLOBS_DIR).join(name)).unwrap())
        .collect();
    assert!(!contents.contains(&b"one".to_vec()));
}

#[test]
fn an_unchanged_group_no_checkpoint_has_is_refused_and_its_new_blobs_removed() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let err = save_groups(
        &store,
        &[blob_file(&scratch, "new", b"data"), unchanged("ghost")],
    )
    .unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnknownGroup { ref token } if token == "ghost"),
        "{err}"
    );
    assert!(blob_files(&store).is_empty());
    assert!(dir_entries(&scratch).is_empty());
    assert!(store.list(SESSION).unwrap().is_empty());
}

#[test]
fn a_corrupt_blob_falls_back_to_the_checkpoint_before() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let first = save_groups(&store, &[blob_file(&scratch, "a", b"first value")]).unwrap();
    let second = save_groups(&store, &[blob_file(&scratch, "b", b"second value")]).unwrap();
    let loaded = store.load(SESSION, None).unwrap();
    // The load hands out a link to the blob; the blob itself is in the blobs directory.
    let restore_dir = loaded
        .restore_dir
        .clone()
        .expect("the load links its blobs");
    let name = loaded.groups[0].path.file_name().unwrap().to_owned();
    let path = restore_dir.with_file_name(BLOBS_DIR).join(name);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&path, b"second valuE").unwrap();
    let fallback = store.load(SESSION, None).unwrap();
    assert_eq!(fallback.info.id, first.id);
    assert_eq!(fallback.skipped.len(), 1);
    assert!(matches!(
        store.load(SESSION, Some(second.id)),
        Err(CheckpointError::Corrupt {
            reason: CorruptionError::BlobChecksum,
            ..
        })
    ));
    fs::remove_file(&path).unwrap();
    assert!(matches!(
        store.load(SESSION, Some(second.id)),
        Err(CheckpointError::Corrupt {
            reason: CorruptionError::BlobMissing { .. },
            ..
        })
    ));
}

#[test]
fn the_disk_cap_prunes_the_oldest_and_refuses_a_checkpoint_over_it_alone() {
    let root = TempDir::new().unwrap();
    let store = CheckpointStore::open(CheckpointStoreConfig {
        session_disk_bytes: 250_000,
        ..CheckpointStoreConfig::new(root.path())
    })
    .unwrap();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    save_groups(&store, &[blob_file(&scratch, "a", &noise(100_000, 11))]).unwrap();
    save_groups(&store, &[blob_file(&scratch, "b", &noise(100_000, 13))]).unwrap();
    // A third 100 kB blob would take the session over 250 kB: the oldest checkpoint goes.
    let third = save_groups(&store, &[blob_file(&scratch, "c", &noise(100_000, 15))]).unwrap();
    let listed = store.list(SESSION).unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].id, third.id);
    assert!(store.disk_usage() <= 250_000, "{}", store.disk_usage());
    // One checkpoint over the cap by itself is refused, and the earlier ones stay.
    let err = save_groups(&store, &[blob_file(&scratch, "d", &noise(300_000, 17))]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::DiskFull { limit: 250_000, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("over the cap"), "{err}");
    assert_eq!(store.load(SESSION, None).unwrap().info.id, third.id);
    assert!(store.disk_usage() <= 250_000);
    assert!(dir_entries(&scratch).is_empty());
}

#[test]
fn the_store_accounts_for_the_disk_across_reopening_and_removal() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    save_groups(&store, &[blob_file(&scratch, "a", &noise(50_000, 1))]).unwrap();
    let usage = store.disk_usage();
    assert!(usage > 50_000);
    let reopened = store_in(root.path(), 5, DEFAULT_MAX_BYTES);
    assert_eq!(reopened.disk_usage(), usage);
    reopened.remove_session(SESSION).unwrap();
    assert_eq!(reopened.disk_usage(), 0);
}

#[test]
fn a_state_over_the_sessions_limit_is_refused() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let err = store
        .save_checkpoint(
            SESSION,
            NewCheckpoint {
                meta: &meta(1),
                payload: b"index",
                groups: &[
                    blob_file(&scratch, "a", &[1; 600]),
                    blob_file(&scratch, "b", &[2; 600]),
                ],
                max_state_bytes: 1000,
                seed: None,
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::TooLarge {
                bytes: 1200,
                limit: 1000
            }
        ),
        "{err}"
    );
    assert!(blob_files(&store).is_empty());
    assert!(dir_entries(&scratch).is_empty());
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

#[test]
fn a_blob_that_compresses_well_is_stored_compressed_and_loads_back_as_it_was() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let table = table_like(2 * 1024 * 1024);
    let saved = save_groups(&store, &[blob_file(&scratch, "t", &table)]).unwrap();
    let name = wait_for_compressed_blob(&store);
    assert_eq!(
        blob_files(&store),
        std::slice::from_ref(&name),
        "the raw blob is gone"
    );
    let stored = fs::metadata(store.session_dir(SESSION).join(BLOBS_DIR).join(&name))
        .unwrap()
        .len();
    assert!(stored < table.len() as u64 / 4, "{stored} bytes stored");
    // The store's account follows the smaller file.
    assert!(
        store.disk_usage() < table.len() as u64 / 2,
        "{}",
        store.disk_usage()
    );

    let loaded = store.load(SESSION, Some(saved.id)).unwrap();
    let restore_dir = loaded
        .restore_dir
        .clone()
        .expect("decompressed for the worker");
    assert!(loaded.groups[0].path.starts_with(&restore_dir));
    assert_eq!(fs::read(&loaded.groups[0].path).unwrap(), table);
    // An unchanged group still refers to it.
    save_groups(&store, &[unchanged("t")]).unwrap();
    assert_eq!(blob_files(&store), std::slice::from_ref(&name));

    // A corrupt compressed blob makes its checkpoints unusable.
    let path = store.session_dir(SESSION).join(BLOBS_DIR).join(&name);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&path, bytes).unwrap();
    assert!(matches!(
        store.load(SESSION, Some(saved.id)),
        Err(CheckpointError::Corrupt { .. })
    ));
}

mod seeding;
