//! Tests of checkpoints saved and loaded back: payloads raw and compressed, retention,
//! numbering across reopening, the size limit, and how sessions lie on disk: names that cannot
//! escape the store, private permissions, sessions found and removed.

use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::checkpoint::COMPRESSION_THRESHOLD;

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
