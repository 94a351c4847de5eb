//! Tests of a checkpoint seeded from another session's (a fork's clone): unchanged groups are
//! hard-links of the seed's blobs, raw or compressed, that outlive the seed's session; a group
//! the seed lacks is refused as any unknown group.

use std::os::unix::fs::MetadataExt;

use super::*;

const CLONE: &str = "clone";

fn save_seeded(
    store: &CheckpointStore,
    groups: &[NewGroup],
    seed: &CheckpointSeed,
) -> Result<CheckpointInfo, CheckpointError> {
    store.save_checkpoint(
        CLONE,
        NewCheckpoint {
            meta: &meta(2),
            payload: b"clone index",
            groups,
            max_state_bytes: u64::MAX,
            seed: Some(seed),
        },
    )
}

fn seed_of(info: &CheckpointInfo) -> CheckpointSeed {
    CheckpointSeed {
        key: SESSION.into(),
        checkpoint: info.id,
    }
}

fn blob_inodes(store: &CheckpointStore, session: &str) -> Vec<u64> {
    let dir = store.session_dir(session).join(BLOBS_DIR);
    dir_entries(&dir)
        .iter()
        .map(|name| fs::metadata(dir.join(name)).unwrap().ino())
        .collect()
}

#[test]
fn a_seeded_checkpoint_links_the_seeds_blobs_and_outlives_its_session() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let big = noise(300_000, 7);
    let source = save_groups(
        &store,
        &[
            blob_file(&scratch, "big", &big),
            blob_file(&scratch, "small", b"small"),
        ],
    )
    .unwrap();
    let clone = save_seeded(
        &store,
        &[unchanged("big"), blob_file(&scratch, "changed", b"CHANGED")],
        &seed_of(&source),
    )
    .unwrap();
    assert!(clone.written_bytes.unwrap() < 10_000, "{clone:?}");
    let shared: Vec<u64> = blob_inodes(&store, CLONE)
        .into_iter()
        .filter(|inode| blob_inodes(&store, SESSION).contains(inode))
        .collect();
    assert_eq!(shared.len(), 1, "the big blob is one file in both sessions");

    assert!(store.remove_session(SESSION).unwrap());
    let loaded = store.load(CLONE, None).unwrap();
    let contents: Vec<Vec<u8>> = loaded
        .groups
        .iter()
        .map(|group| fs::read(&group.path).unwrap())
        .collect();
    assert_eq!(contents, [big, b"CHANGED".to_vec()]);
    // Later checkpoints of the clone find the group in its own lineage.
    save_groups_of(&store, CLONE, &[unchanged("big")]).unwrap();
}

#[test]
fn a_compressed_blob_of_the_seed_is_linked_as_it_is() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let table = table_like(2 * 1024 * 1024);
    let source = save_groups(&store, &[blob_file(&scratch, "t", &table)]).unwrap();
    let compressed = wait_for_compressed_blob(&store);
    save_seeded(&store, &[unchanged("t")], &seed_of(&source)).unwrap();
    assert_eq!(
        dir_entries(&store.session_dir(CLONE).join(BLOBS_DIR)),
        [compressed]
    );
    let loaded = store.load(CLONE, None).unwrap();
    assert_eq!(fs::read(&loaded.groups[0].path).unwrap(), table);
}

#[test]
fn a_group_the_seed_lacks_is_refused_and_nothing_is_left() {
    let (root, store) = new_store();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let source = save_groups(&store, &[blob_file(&scratch, "a", b"value")]).unwrap();
    let err = save_seeded(
        &store,
        &[unchanged("a"), unchanged("never-saved")],
        &seed_of(&source),
    )
    .unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnknownGroup { ref token } if token == "never-saved"),
        "{err}"
    );
    assert!(dir_entries(&store.session_dir(CLONE).join(BLOBS_DIR)).is_empty());
    // A seed naming a checkpoint the source does not have (pruned, say) seeds nothing.
    let gone = CheckpointSeed {
        key: SESSION.into(),
        checkpoint: "c-999".parse().unwrap(),
    };
    assert!(matches!(
        save_seeded(&store, &[unchanged("a")], &gone),
        Err(CheckpointError::UnknownGroup { .. })
    ));
    // So does a seed of another session's key: the envelope must be the seed's own.
    let other = CheckpointSeed {
        key: "someone-else".into(),
        checkpoint: source.id,
    };
    assert!(matches!(
        save_seeded(&store, &[unchanged("a")], &other),
        Err(CheckpointError::UnknownGroup { .. })
    ));
    assert!(store.list(CLONE).unwrap().is_empty());
}
