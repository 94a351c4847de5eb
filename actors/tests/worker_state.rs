//! The worker's state operations with real Python: checkpoints restored into a fresh worker,
//! background checkpoints, transactions, the `changed` flag, and inspect.

use std::path::Path;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyvisor_actors::worker::{Worker, WorkerEvent};
use pyvisor_actors::OutputStream;
use pyvisor_protocol::{
    CheckpointGroup, Definition, ErrorInfo, HostMessage, LostName, RestoreGroup, ResultValue,
    Transaction, Variable, WorkerMessage, WorkerStatus,
};

mod common;
mod frames;

use common::{python_has, PATIENCE};
use frames::{next_message, send, start};

/// Waits until the worker has printed `marker` on stdout.
async fn printed(worker: &mut Worker, marker: &str) {
    let mut stdout = String::new();
    tokio::time::timeout(PATIENCE, async {
        while !stdout.contains(marker) {
            match worker.events.recv().await.expect("the worker is alive") {
                WorkerEvent::Output {
                    stream: OutputStream::Stdout,
                    bytes,
                } => stdout.push_str(&String::from_utf8_lossy(&bytes)),
                WorkerEvent::Output { .. } => {}
                other => panic!("unexpected before {marker:?}: {other:?}"),
            }
        }
    })
    .await
    .expect("the marker is printed");
}

fn execute_message(id: &str, code: &str, transaction: Transaction) -> HostMessage {
    HostMessage::Execute {
        id: id.into(),
        code: code.into(),
        repr_limit: 65536,
        transaction,
        facts: false,
        cell: None,
    }
}

/// What a result frame says.
#[derive(Debug)]
struct Outcome {
    status: WorkerStatus,
    result: Option<ResultValue>,
    error: Option<ErrorInfo>,
    changed: bool,
    rolled_back: bool,
}

async fn result_of(worker: &mut Worker, wanted: &str) -> Outcome {
    match next_message(worker).await {
        WorkerMessage::Result {
            id,
            status,
            result,
            error,
            changed,
            rolled_back,
            ..
        } if id == wanted => Outcome {
            status,
            result,
            error,
            changed,
            rolled_back,
        },
        other => panic!("expected the result of {wanted}, got {other:?}"),
    }
}

async fn run_as(worker: &mut Worker, code: &str, transaction: Transaction) -> Outcome {
    send(worker, execute_message("e", code, transaction));
    result_of(worker, "e").await
}

async fn run(worker: &mut Worker, code: &str) -> Outcome {
    run_as(worker, code, Transaction::CommitAlways).await
}

/// Runs code that must succeed.
async fn ok(worker: &mut Worker, code: &str) -> Outcome {
    let outcome = run(worker, code).await;
    assert_eq!(outcome.status, WorkerStatus::Ok, "{code}: {outcome:?}");
    outcome
}

/// The repr of the value of an expression.
async fn repr(worker: &mut Worker, expression: &str) -> String {
    ok(worker, expression)
        .await
        .result
        .unwrap_or_else(|| panic!("{expression} has a value"))
        .repr
}

struct CheckpointDone {
    bytes: u64,
    saved: Vec<String>,
    lost: Vec<LostName>,
    error: Option<String>,
    index: serde_json::Value,
    groups: Vec<CheckpointGroup>,
}

impl CheckpointDone {
    /// The restore groups of this checkpoint, whose blob files are in `dir`; every group
    /// must have been written (no earlier checkpoint to take unchanged ones from).
    fn restore_groups(&self, dir: &Path) -> Vec<RestoreGroup> {
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

async fn checkpoint_done(worker: &mut Worker, wanted: &str) -> CheckpointDone {
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

fn checkpoint_message(id: &str, dir: &Path, background: bool, incremental: bool) -> HostMessage {
    HostMessage::Checkpoint {
        id: id.into(),
        dir: dir.to_str().unwrap().into(),
        background,
        incremental,
        max_bytes: u64::MAX,
    }
}

/// A checkpoint of every group into the directory `dir`, written by the worker itself.
async fn checkpoint(worker: &mut Worker, dir: &Path) -> CheckpointDone {
    std::fs::create_dir_all(dir).unwrap();
    send(worker, checkpoint_message("c", dir, false, false));
    checkpoint_done(worker, "c").await
}

struct RestoreDone {
    restored: Vec<String>,
    kept: Vec<String>,
    lost: Vec<LostName>,
    error: Option<String>,
}

async fn restore_groups(
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
async fn restore(
    worker: &mut Worker,
    done: &CheckpointDone,
    dir: &Path,
    clear: bool,
) -> (Vec<String>, Vec<LostName>, Option<String>) {
    let outcome = restore_groups(worker, done.index.clone(), done.restore_groups(dir), clear).await;
    (outcome.restored, outcome.lost, outcome.error)
}

fn blob_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| entry.metadata().unwrap().len())
        .sum()
}

async fn inspect_done(worker: &mut Worker) -> (Vec<Variable>, Vec<Definition>, Option<u64>) {
    match next_message(worker).await {
        WorkerMessage::InspectDone {
            id,
            variables,
            definitions,
            rss_bytes,
        } if id == "i" => (variables, definitions, rss_bytes),
        other => panic!("expected inspect_done, got {other:?}"),
    }
}

fn names(lost: &[LostName]) -> Vec<&str> {
    let mut names: Vec<&str> = lost.iter().map(|lost| lost.name.as_str()).collect();
    names.sort_unstable();
    names
}

fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|saved| saved == name)
}

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
async fn rollback_on_failure_puts_the_namespace_back() {
    let rollback = Transaction::RollbackOnFailure;
    let mut worker = start().await;
    ok(
        &mut worker,
        "lst = [1, 2]\nkeep = {'k': [1]}\nitems = []\ndef grow():\n\x20   items.append(1)",
    )
    .await;

    let outcome = run_as(
        &mut worker,
        "lst.append(3)\nraise ValueError('no')",
        rollback,
    )
    .await;
    assert_eq!(outcome.status, WorkerStatus::Error);
    assert!(outcome.rolled_back);
    assert_eq!(
        outcome.error.unwrap().message,
        "no",
        "the error is unchanged"
    );
    assert_eq!(repr(&mut worker, "lst").await, "[1, 2]");

    let outcome = run_as(&mut worker, "fresh = 1\nraise ValueError", rollback).await;
    assert!(outcome.rolled_back);
    assert_eq!(repr(&mut worker, "'fresh' in globals()").await, "False");

    let outcome = run_as(
        &mut worker,
        "keep['k'].append(2)\ndel keep\n1 / 0",
        rollback,
    )
    .await;
    assert!(outcome.rolled_back);
    assert_eq!(repr(&mut worker, "keep").await, "{'k': [1]}");

    // What a session function mutates is reached through it.
    let outcome = run_as(&mut worker, "grow()\nraise KeyError", rollback).await;
    assert!(outcome.rolled_back);
    assert_eq!(repr(&mut worker, "items").await, "[]");

    // An interrupt is a failure too.
    send(
        &worker,
        execute_message(
            "sleep",
            "import time\nlst.append(4)\nprint('appended', flush=True)\ntime.sleep(60)",
            rollback,
        ),
    );
    printed(&mut worker, "appended").await;
    kill(Pid::from_raw(worker.info.pid as i32), Signal::SIGINT).unwrap();
    let outcome = result_of(&mut worker, "sleep").await;
    assert_eq!(outcome.error.unwrap().type_name, "KeyboardInterrupt");
    assert!(outcome.rolled_back);
    assert_eq!(repr(&mut worker, "lst").await, "[1, 2]");

    // A success keeps its changes; commit_always keeps those of a failure.
    let outcome = run_as(&mut worker, "lst.append(5)", rollback).await;
    assert_eq!(
        (outcome.status, outcome.rolled_back),
        (WorkerStatus::Ok, false)
    );
    let outcome = run(&mut worker, "lst.append(6)\nraise ValueError").await;
    assert_eq!(
        (outcome.status, outcome.rolled_back),
        (WorkerStatus::Error, false)
    );
    assert_eq!(repr(&mut worker, "lst").await, "[1, 2, 5, 6]");
}

#[tokio::test]
async fn results_say_whether_the_namespace_may_have_changed() {
    let mut worker = start().await;
    for (code, changed) in [
        ("x = 1", true),
        ("x", false),
        ("1 + 2", false),
        ("x.real", false),
        ("x = 1", true),
        ("lst = []", true),
        ("lst.append(2)", true),
        ("'a = b'", false),
        ("del x", true),
    ] {
        let outcome = ok(&mut worker, code).await;
        assert_eq!(outcome.changed, changed, "{code}");
    }
}

#[tokio::test]
async fn inspect_answers_while_code_runs() {
    let mut worker = start().await;
    ok(
        &mut worker,
        "import time\n\
         def helper(a):\n\
         \x20   return a * 2\n\
         nums = list(range(1000))\n\
         text = 'hello'",
    )
    .await;
    send(
        &worker,
        execute_message(
            "sleep",
            "print('sleeping', flush=True)\ntime.sleep(60)",
            Transaction::CommitAlways,
        ),
    );
    printed(&mut worker, "sleeping").await;
    send(&worker, HostMessage::Inspect { id: "i".into() });
    // The next frame is the answer, not the result of the sleep.
    let (variables, definitions, rss_bytes) = inspect_done(&mut worker).await;
    kill(Pid::from_raw(worker.info.pid as i32), Signal::SIGINT).unwrap();
    let outcome = result_of(&mut worker, "sleep").await;
    assert_eq!(outcome.error.unwrap().type_name, "KeyboardInterrupt");

    let listed: Vec<&str> = variables.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(listed, ["helper", "nums", "text", "time"]);
    let find = |name: &str| variables.iter().find(|v| v.name == name).unwrap();
    assert_eq!(find("nums").type_name, "list");
    assert!(
        find("nums").size_bytes.unwrap() > 8000 + 28 * 900,
        "{:?}",
        find("nums")
    );
    assert_eq!(find("text").type_name, "str");
    assert!(find("text").size_bytes.unwrap() > 5);
    assert_eq!(find("helper").type_name, "function");
    assert_eq!(find("time").type_name, "module");
    assert_eq!(
        definitions,
        [Definition {
            name: "helper".into(),
            kind: "function".into(),
            source: "def helper(a):\n    return a * 2".into(),
        }]
    );
    assert!(rss_bytes.unwrap() > 1024 * 1024);
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
