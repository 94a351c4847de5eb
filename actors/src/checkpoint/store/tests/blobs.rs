//! Tests of checkpoints with blobs: unchanged groups share an earlier checkpoint's blob, pruning
//! removes only unshared blobs, an unknown group or a corrupt blob is refused or skipped, the
//! disk caps prune or refuse, and a blob that compresses well is stored compressed.

use std::os::unix::fs::PermissionsExt;

use super::*;

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
