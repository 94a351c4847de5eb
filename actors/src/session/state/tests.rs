//! The host's side of a checkpoint report, which comes from the worker and so from the
//! session's (hostile) code: file names that lead out of the checkpoint's directory and files
//! that are not what they claim are refused.

use std::path::Path;

use pyvisor_protocol::CheckpointGroup;

use super::checkpointing::{is_plain_file_name, store_checkpoint, Destination};
use crate::checkpoint::{CheckpointError, CheckpointMeta, CheckpointStore, CheckpointStoreConfig};

fn group(file: &str) -> CheckpointGroup {
    CheckpointGroup {
        token: "t-1".into(),
        names: vec!["x".into()],
        file: Some(file.into()),
        bytes: 5,
    }
}

fn report(store: &CheckpointStore, dir: &Path, file: &str) -> Result<(), CheckpointError> {
    let index = serde_json::json!({"format": 2});
    let destination = Destination {
        store: store.clone(),
        key: "id:s-1".into(),
        max_bytes: u64::MAX,
        seed: None,
    };
    store_checkpoint(
        &destination,
        dir,
        &CheckpointMeta::default(),
        &index,
        vec![group(file)],
    )
    .map(drop)
}

#[test]
fn only_plain_names_are_file_names() {
    for bad in ["", ".", "..", "../x", "a/b", "/etc/passwd", "x\0y"] {
        assert!(!is_plain_file_name(bad), "{bad:?}");
    }
    assert!(is_plain_file_name("1b59-18eb-3.blob"));
}

#[test]
fn a_report_naming_a_file_outside_its_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let store =
        CheckpointStore::open(CheckpointStoreConfig::new(root.path().join("state"))).unwrap();
    let dir = root.path().join("scratch");
    std::fs::create_dir(&dir).unwrap();
    let secret = root.path().join("secret");
    std::fs::write(&secret, b"engine secret").unwrap();
    let err = report(&store, &dir, "../secret").unwrap_err();
    assert!(err.to_string().contains("named a blob file"), "{err}");
    // A link to it in the directory is refused too, and the secret stays where it is.
    std::os::unix::fs::symlink(&secret, dir.join("link.blob")).unwrap();
    assert!(report(&store, &dir, "link.blob").is_err());
    assert_eq!(std::fs::read(&secret).unwrap(), b"engine secret");
    assert!(store.list("id:s-1").unwrap().is_empty());
    // A plain file is taken in.
    std::fs::write(dir.join("ok.blob"), b"12345").unwrap();
    report(&store, &dir, "ok.blob").unwrap();
    assert_eq!(store.list("id:s-1").unwrap().len(), 1);
}
