//! Checkpoints with real Python: a namespace restored into a fresh worker, what a restore
//! cannot read or bring back, a checkpoint written in the background while executions run, and
//! incremental checkpoints that leave unchanged groups out.

use pyvisor_protocol::{RestoreGroup, Transaction};

mod checkpoints;
mod common;
mod frames;
#[allow(
    dead_code,
    reason = "the shared helpers serve several test files; this one needs a few"
)]
mod outcomes;

use checkpoints::{
    blob_bytes, checkpoint, checkpoint_done, checkpoint_message, has, names, restore,
    restore_groups, CheckpointDone,
};
use common::python_has;
use frames::{send, start};
use outcomes::{execute_message, ok, repr, result_of};

#[tokio::test]
async fn checkpoint_restores_into_a_fresh_worker() {
    let pandas = python_has("pandas");
    let alias = if python_has("numpy") {
        ("import numpy as np", "np", "'numpy'")
    } else {
        ("import collections as co", "co", "'collections'")
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state");
    let mut first = start().await;
    let mut setup = format!(
        "{}\n\
         from os import path\n\
         import socket\n\
         n = 42\n\
         lst = [1, 'two', [3.5]]\n\
         d = {{'a': 1, 'b': (2, None)}}\n\
         square = lambda v: v * v\n\
         def add(a, b=1):\n\
         \x20   return a + b + n\n\
         class Point:\n\
         \x20   def __init__(self, x, y):\n\
         \x20       self.x, self.y = x, y\n\
         \x20   def norm2(self):\n\
         \x20       return self.x ** 2 + self.y ** 2\n\
         p = Point(3, 4)\n\
         sock = socket.socket()\n\
         gen = (i for i in range(3))\n",
        alias.0
    );
    if pandas {
        setup.push_str(
            "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})\n",
        );
    }
    ok(&mut first, &setup).await;

    let done = checkpoint(&mut first, &path).await;
    assert_eq!(done.error, None);
    assert_eq!(done.bytes, blob_bytes(&path));
    use std::os::unix::fs::PermissionsExt;
    for blob in std::fs::read_dir(&path).unwrap().flatten() {
        let mode = blob.metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{blob:?}");
    }
    assert_eq!(names(&done.lost), ["gen", "sock"], "{:?}", done.lost);
    assert!(
        done.lost.iter().all(|lost| lost.reason.contains("pickle")),
        "{:?}",
        done.lost
    );
    for name in [
        "n", "lst", "d", "square", "add", "Point", "p", alias.1, "path", "socket",
    ] {
        assert!(has(&done.saved, name), "{name} saved: {:?}", done.saved);
    }
    assert!(
        !done.saved.iter().any(|name| name.starts_with("__")),
        "{:?}",
        done.saved
    );
    drop(first);

    let mut fresh = start().await;
    let (restored, lost, error) = restore(&mut fresh, &done, &path, true).await;
    assert_eq!(error, None);
    assert!(lost.is_empty(), "{lost:?}");
    assert!(
        has(&restored, "p") && has(&restored, "Point"),
        "{restored:?}"
    );
    assert_eq!(
        repr(&mut fresh, "n, lst, d, square(7), add(2)").await,
        "(42, [1, 'two', [3.5]], {'a': 1, 'b': (2, None)}, 49, 45)"
    );
    assert_eq!(
        repr(&mut fresh, "p.norm2(), type(p) is Point, Point.__name__").await,
        "(25, True, 'Point')"
    );
    assert_eq!(
        repr(&mut fresh, &format!("{}.__name__, path.__name__", alias.1)).await,
        format!("({}, 'posixpath')", alias.2)
    );
    assert_eq!(
        repr(&mut fresh, "'sock' in globals(), 'gen' in globals()").await,
        "(False, False)"
    );
    if pandas {
        let check = "df.equals(pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']}))";
        assert_eq!(repr(&mut fresh, check).await, "True");
    }

    // The restored definitions keep their source: a second checkpoint saves them again.
    let again = dir.path().join("again");
    let done = checkpoint(&mut fresh, &again).await;
    assert_eq!(done.error, None);
    assert!(
        has(&done.saved, "add") && has(&done.saved, "square"),
        "{:?}",
        done.saved
    );
    let mut third = start().await;
    let (_, lost, error) = restore(&mut third, &done, &again, false).await;
    assert_eq!((lost.len(), error), (0, None));
    assert_eq!(repr(&mut third, "add(1, 1), p.norm2()").await, "(44, 25)");
}

#[tokio::test]
async fn restore_reports_what_it_cannot_read_or_bring_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut worker = start().await;
    let garbage = restore_groups(
        &mut worker,
        serde_json::json!({"format": 1}),
        Vec::new(),
        true,
    )
    .await;
    assert!(garbage.restored.is_empty());
    assert!(
        garbage.error.is_some(),
        "an index of another format is refused"
    );
    let groups = vec![RestoreGroup {
        token: "t".into(),
        names: vec!["a".into(), "b".into()],
        path: dir.path().join("missing").to_string_lossy().into_owned(),
    }];
    let index = serde_json::json!({"format": 2, "pickler": "pickle", "imports": [], "sources": []});
    let missing = restore_groups(&mut worker, index.clone(), groups, true).await;
    assert_eq!(
        missing.error, None,
        "a missing blob loses its names, not the restore"
    );
    assert_eq!(names(&missing.lost), ["a", "b"]);
    std::fs::write(dir.path().join("garbage"), b"not a blob").unwrap();
    let groups = vec![RestoreGroup {
        token: "t".into(),
        names: vec!["c".into()],
        path: dir.path().join("garbage").to_string_lossy().into_owned(),
    }];
    let corrupt = restore_groups(&mut worker, index, groups, true).await;
    assert_eq!(names(&corrupt.lost), ["c"]);

    // A name whose restore fails is lost; the others come back. The module `vanishing` exists
    // only in the first worker: the fresh one cannot import it, nor run the source of the class
    // based on it, nor make the instance of that class.
    let path = dir.path().join("state");
    ok(
        &mut worker,
        "import sys, types\n\
         sys.modules['vanishing'] = types.ModuleType('vanishing')\n\
         sys.modules['vanishing'].Base = object\n\
         import vanishing\n\
         class Fragile(vanishing.Base):\n\
         \x20   pass\n\
         thing = Fragile()\n\
         keep = [1]",
    )
    .await;
    let done = checkpoint(&mut worker, &path).await;
    assert_eq!(
        (done.lost.len(), &done.error),
        (0, &None),
        "{:?}",
        done.lost
    );
    let mut fresh = start().await;
    let (restored, lost, error) = restore(&mut fresh, &done, &path, false).await;
    assert_eq!(error, None);
    assert_eq!(names(&lost), ["Fragile", "thing", "vanishing"], "{lost:?}");
    assert!(lost.iter().all(|lost| !lost.reason.is_empty()));
    assert!(
        has(&restored, "keep") && has(&restored, "types"),
        "{restored:?}"
    );
    assert_eq!(
        repr(&mut fresh, "keep, types.__name__").await,
        "([1], 'types')"
    );
}

#[tokio::test]
async fn background_checkpoint_lets_executions_run_and_writes_a_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let mut worker = start().await;
    // Pickling `slow` takes a second in the child that writes the checkpoint: the worker's
    // answers to the executions sent after the request cannot come after checkpoint_done
    // unless the checkpoint holds the worker up.
    ok(
        &mut worker,
        "import time\n\
         big = bytearray(100 * 1024 * 1024)\n\
         big[-1] = 7\n\
         count = 0\n\
         class Slow:\n\
         \x20   def __reduce__(self):\n\
         \x20       time.sleep(1)\n\
         \x20       return (Slow, ())\n\
         slow = Slow()",
    )
    .await;
    // The first checkpoint is written in the background: nothing says yet that it is small.
    send(&worker, checkpoint_message("bg", &path, true, false));
    for index in 0..3 {
        let id = format!("e{index}");
        send(
            &worker,
            execute_message(&id, "count += 1\ncount", Transaction::CommitAlways),
        );
    }
    for index in 0..3 {
        let outcome = result_of(&mut worker, &format!("e{index}")).await;
        assert_eq!(outcome.result.unwrap().repr, (index + 1).to_string());
    }
    let done = checkpoint_done(&mut worker, "bg").await;
    assert_eq!(done.error, None);
    assert!(done.lost.is_empty(), "{:?}", done.lost);
    assert_eq!(done.bytes, blob_bytes(&path));
    assert!(done.bytes > 100 * 1024 * 1024);

    // The files hold the namespace as it was when the checkpoint was asked for.
    let mut fresh = start().await;
    let (_, lost, error) = restore(&mut fresh, &done, &path, true).await;
    assert_eq!((lost.len(), error), (0, None));
    assert_eq!(
        repr(&mut fresh, "len(big), big[-1], count, type(slow).__name__").await,
        "(104857600, 7, 0, 'Slow')"
    );
}

#[tokio::test]
async fn an_incremental_checkpoint_leaves_unchanged_groups_out_and_a_restore_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let (first_dir, second_dir) = (dir.path().join("first"), dir.path().join("second"));
    let mut worker = start().await;
    ok(
        &mut worker,
        "big = bytearray(300_000)\nalias = big\nholder = {'data': big}\nsmall = 1",
    )
    .await;
    let first = checkpoint(&mut worker, &first_dir).await;
    assert_eq!(first.error, None);
    let group_of = |done: &CheckpointDone, name: &str| {
        done.groups
            .iter()
            .find(|group| group.names.iter().any(|n| n == name))
            .cloned()
            .unwrap()
    };
    // Names that share an object go together.
    assert_eq!(group_of(&first, "big").names, ["big", "alias", "holder"]);

    ok(&mut worker, "small = 2").await;
    std::fs::create_dir_all(&second_dir).unwrap();
    send(&worker, checkpoint_message("c2", &second_dir, false, true));
    let second = checkpoint_done(&mut worker, "c2").await;
    assert_eq!(second.error, None);
    let big = group_of(&second, "big");
    assert_eq!(
        (big.file, &big.token),
        (None, &group_of(&first, "big").token)
    );
    assert!(group_of(&second, "small").file.is_some());
    assert!(
        second.bytes < 10_000,
        "only small is written: {}",
        second.bytes
    );

    // A change through the alias makes the group new again.
    ok(&mut worker, "alias[0] = 9").await;
    let third_dir = dir.path().join("third");
    std::fs::create_dir_all(&third_dir).unwrap();
    send(&worker, checkpoint_message("c3", &third_dir, false, true));
    let third = checkpoint_done(&mut worker, "c3").await;
    assert!(group_of(&third, "big").file.is_some());

    // Back to the first checkpoint: the group of big changed since, small too.
    let back = restore_groups(
        &mut worker,
        first.index.clone(),
        first.restore_groups(&first_dir),
        true,
    )
    .await;
    assert_eq!(back.error, None);
    assert!(has(&back.restored, "big") && has(&back.restored, "small"));
    assert_eq!(
        repr(
            &mut worker,
            "small, big[0], big is alias, holder['data'] is big"
        )
        .await,
        "(1, 0, True, True)"
    );
    // Restoring it again keeps what is unchanged since that restore.
    let again = restore_groups(
        &mut worker,
        first.index.clone(),
        first.restore_groups(&first_dir),
        true,
    )
    .await;
    assert!(
        has(&again.kept, "big") && has(&again.kept, "alias"),
        "{:?}",
        again.kept
    );
}
