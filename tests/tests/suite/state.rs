//! Session state that survives: checkpoints and restores, crash recovery, named sessions
//! brought back by a new engine, transactions, and introspection.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyvisor::{
    AutoCheckpoint, DurabilityMode, Engine, EngineConfig, ExecuteRequest, ExecutionStatus,
    SessionOptions, StateConfig,
};
use pyvisor_tests::{engine_with, kill_and_wait, manual_checkpoints, run, state_dir, within};

/// An engine whose sessions checkpoint only when asked, so tests know what is on disk.
async fn engine_in(dir: &Path) -> Engine {
    engine_with(EngineConfig {
        state: StateConfig {
            dir: Some(dir.to_owned()),
            ..manual_checkpoints()
        },
        ..EngineConfig::default()
    })
    .await
}

fn named(name: &str) -> SessionOptions {
    SessionOptions {
        name: Some(name.to_owned()),
        ..SessionOptions::default()
    }
}

async fn repr(session: &pyvisor::Session, code: &str) -> String {
    let result = run(session, code).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{code}: {result:?}");
    result.result.map(|r| r.repr).unwrap_or_default()
}

const RICH_NAMESPACE: &str = r#"
import collections as co
import pandas as pd
count = 7
items = [1, "two", 3.0]
table = {"a": [1, 2], "b": None}
frame = pd.DataFrame({"x": [1, 2, 3], "y": ["p", "q", "r"]})
square = lambda n: n * n
def greet(who):
    return f"hello {who}"
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x ** 2 + self.y ** 2
origin = Point(3, 4)
"#;

const CHECK_RICH_NAMESPACE: &str = "(count, items, table, frame.shape, list(frame.y), square(5), \
     greet('you'), origin.norm2(), isinstance(origin, Point), co.Counter('aab')['a'])";

const RICH_EXPECTED: &str = "(7, [1, 'two', 3.0], {'a': [1, 2], 'b': None}, (3, 2), \
     ['p', 'q', 'r'], 25, 'hello you', 25, True, 2)";

#[tokio::test]
async fn a_checkpoint_restores_values_definitions_and_imports() {
    let engine = engine_in(&state_dir()).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, RICH_NAMESPACE).await;
    let saved = within(session.checkpoint()).await.unwrap();
    for name in [
        "count", "items", "frame", "square", "greet", "Point", "origin", "co",
    ] {
        assert!(
            saved.saved.iter().any(|s| s == name),
            "{name} not in {saved:?}"
        );
    }
    assert!(saved.lost.is_empty(), "{saved:?}");

    run(
        &session,
        "del count, items, table, frame, square, greet, Point, origin, co\nextra = 1",
    )
    .await;
    let restored = within(session.restore(None)).await.unwrap();
    assert_eq!(restored.checkpoint_id, saved.checkpoint_id);
    assert_eq!(repr(&session, CHECK_RICH_NAMESPACE).await, RICH_EXPECTED);
    assert_eq!(repr(&session, "'extra' in globals()").await, "False");
    let listed = session.checkpoints().await.unwrap();
    assert_eq!(listed[0].id.to_string(), saved.checkpoint_id);
}

#[tokio::test]
async fn names_that_cannot_be_saved_are_reported_and_the_rest_restores() {
    let engine = engine_in(&state_dir()).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(
        &session,
        "import socket\nconn = socket.socket()\nnumbers = (i for i in range(3))\nkept = 'yes'",
    )
    .await;
    let saved = within(session.checkpoint()).await.unwrap();
    let lost: Vec<&str> = saved.lost.iter().map(|l| l.name.as_str()).collect();
    assert!(
        lost.contains(&"conn") && lost.contains(&"numbers"),
        "{saved:?}"
    );
    assert!(saved.lost.iter().all(|l| !l.reason.is_empty()));
    run(&session, "del kept").await;
    within(session.restore(None)).await.unwrap();
    assert_eq!(repr(&session, "kept").await, "'yes'");
}

#[tokio::test]
async fn a_killed_worker_comes_back_from_the_last_checkpoint_and_says_what_was_lost() {
    let engine = engine_in(&state_dir()).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "a = 1").await;
    let saved = within(session.checkpoint()).await.unwrap();
    run(&session, "b = 2").await;
    run(&session, "c = 3").await;
    let pid = session.info().await.unwrap().pid.unwrap();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    // An execution sent before the session sees the death would die with the worker.
    within(async {
        while session.info().await.unwrap().restarts == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    let next = run(&session, "(a, 'b' in globals(), 'c' in globals())").await;
    assert_eq!(next.status, ExecutionStatus::Ok, "{next:?}");
    assert_eq!(next.result.unwrap().repr, "(1, False, False)");
    let recovered = next
        .recovered
        .expect("the result says the session recovered");
    assert_eq!(recovered.checkpoint_id, Some(saved.checkpoint_id.clone()));
    assert_eq!(recovered.lost_executions, 2, "b = 2 and c = 3 are gone");
    // Only the first result after the recovery carries it.
    assert!(run(&session, "a").await.recovered.is_none());
    assert_eq!(engine.stats().await.unwrap().restores, 1);
}

#[tokio::test]
async fn code_sent_after_a_kill_the_session_has_not_noticed_runs_on_the_restored_worker() {
    let engine = engine_in(&state_dir()).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "n = 0").await;
    // Whether the engine notices each death before the code arrives is a race; every round
    // must come back `ok` either way, and some rounds land before it notices.
    for round in 1..=4u64 {
        run(&session, "n += 1").await;
        let saved = within(session.checkpoint()).await.unwrap();
        kill_and_wait(session.info().await.unwrap().pid.unwrap()).await;
        let next = run(&session, "n").await;
        assert_eq!(next.status, ExecutionStatus::Ok, "round {round}: {next:?}");
        assert_eq!(next.result.unwrap().repr, round.to_string());
        let recovered = next
            .recovered
            .expect("the result says the session recovered");
        assert_eq!(recovered.checkpoint_id, Some(saved.checkpoint_id));
        assert_eq!(recovered.lost_executions, 0);
        assert!(!recovered.fresh_namespace);
    }
    assert_eq!(session.info().await.unwrap().restarts, 4);
}

#[tokio::test]
async fn code_written_to_a_worker_that_dies_before_reading_it_runs_on_the_restored_worker() {
    let engine = engine_in(&state_dir()).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "n = 1").await;
    let saved = within(session.checkpoint()).await.unwrap();
    let pid = session.info().await.unwrap().pid.unwrap();
    // Stopped, the worker is alive when the code is written to it, and never reads it. A
    // SIGSTOP lands when the process next enters the kernel: wait until it has.
    kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
    within(async {
        while !main_thread_stopped(pid) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let execution = session.execute("n + 1").await.unwrap();
    within(async {
        while unread_request_bytes(pid) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    kill_and_wait(pid).await;
    let result = within(execution.result()).await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Ok, "{result:?}");
    assert_eq!(result.result.unwrap().repr, "2");
    let recovered = result
        .recovered
        .expect("the result says the session recovered");
    assert_eq!(recovered.checkpoint_id, Some(saved.checkpoint_id));
    assert_eq!(recovered.lost_executions, 0);
}

/// Whether the main thread of process `pid` (the one that reads the requests) is stopped.
fn main_thread_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

/// The bytes waiting in the request pipe (fd 3) of worker `pid`.
fn unread_request_bytes(pid: u32) -> i32 {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let pipe = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/3"))
        .expect("the worker's request pipe opens");
    let mut unread: libc::c_int = 0;
    // SAFETY: FIONREAD writes the number of unread bytes into the int it is given.
    assert_eq!(
        unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut unread) },
        0
    );
    unread
}

#[tokio::test]
async fn the_crashed_execution_itself_reports_the_recovery() {
    let engine = engine_in(&state_dir()).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "kept = [1, 2]").await;
    let saved = within(session.checkpoint()).await.unwrap();
    let crashed = run(&session, "import os\nos._exit(3)").await;
    assert_eq!(crashed.status, ExecutionStatus::Crashed);
    let recovered = crashed
        .recovered
        .expect("recovered is set on the crashed result");
    assert_eq!(recovered.checkpoint_id, Some(saved.checkpoint_id.clone()));
    assert_eq!(recovered.lost_executions, 1, "the crashed execution itself");
    assert!(crashed
        .error
        .unwrap()
        .message
        .contains(&saved.checkpoint_id));
    assert_eq!(repr(&session, "kept").await, "[1, 2]");
}

#[tokio::test]
async fn automatic_checkpoints_follow_executions_that_change_the_namespace() {
    let engine = engine_with(EngineConfig {
        state: StateConfig {
            auto: AutoCheckpoint {
                after_changes: 1,
                min_interval: Duration::ZERO,
                ..AutoCheckpoint::default()
            },
            ..StateConfig::default()
        },
        ..EngineConfig::default()
    })
    .await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "x = 1").await;
    within(async {
        while !session.info().await.unwrap().durability.saved {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // A pure expression changes nothing, so it counts as no change: no checkpoint is due
    // (the session decides when the result arrives, before it answers anything else).
    let before = session.checkpoints().await.unwrap().len();
    run(&session, "x + 1").await;
    let durability = session.info().await.unwrap().durability;
    assert!(durability.saved, "{durability:?}");
    assert_eq!(durability.unsaved_executions, 0, "{durability:?}");
    assert_eq!(session.checkpoints().await.unwrap().len(), before);
    // After a crash the session comes back with `x`.
    run(
        &session,
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    )
    .await;
    assert_eq!(repr(&session, "x").await, "1");
}

#[tokio::test]
async fn with_reply_durability_a_crash_right_after_a_result_loses_nothing_it_reported() {
    let engine = engine_with(EngineConfig {
        state: StateConfig {
            auto: AutoCheckpoint {
                // The debounce of the automatic policy must not delay a durable reply.
                min_interval: Duration::from_secs(3600),
                durability: DurabilityMode::Reply,
                ..AutoCheckpoint::default()
            },
            ..StateConfig::default()
        },
        ..EngineConfig::default()
    })
    .await;
    let session = engine.create_session(Default::default()).await.unwrap();
    for value in 1..=3 {
        let result = run(&session, &format!("x = {value}")).await;
        assert_eq!(result.status, ExecutionStatus::Ok, "{result:?}");
        assert!(result.warnings.is_empty(), "{result:?}");
        assert!(session.info().await.unwrap().durability.saved);
        kill_and_wait(session.info().await.unwrap().pid.unwrap()).await;
        let next = run(&session, "x").await;
        assert_eq!(next.status, ExecutionStatus::Ok, "{next:?}");
        assert_eq!(next.result.unwrap().repr, value.to_string());
        let recovered = next.recovered.expect("the session recovered");
        assert_eq!(recovered.lost_executions, 0, "{recovered:?}");
    }
    // Code that changes nothing is answered without a checkpoint.
    let before = session.checkpoints().await.unwrap().len();
    run(&session, "x + 1").await;
    assert_eq!(session.checkpoints().await.unwrap().len(), before);
    // A failing execution that changed the namespace is saved before its error is sent.
    let failed = run(&session, "y = 5\nraise ValueError('after y')").await;
    assert_eq!(failed.status, ExecutionStatus::Error);
    assert_eq!(session.checkpoints().await.unwrap().len(), before + 1);
    // A timeout shorter than the checkpoint does not cut the saving of a finished cell: the
    // cell is instant, its state takes 2 s to save (pickling `slow` sleeps), the timeout is 1 s.
    let mut request = ExecuteRequest::new(
        "import time\nclass Slow:\n    def __reduce__(self):\n        time.sleep(2)\n        \
         return (int, (7,))\nslow = Slow()\ndel Slow",
    );
    request.timeout = Some(Duration::from_secs(1));
    let result = within(session.run(request)).await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Ok, "{result:?}");
    assert!(result.warnings.is_empty(), "{result:?}");
    assert_eq!(session.checkpoints().await.unwrap().len(), before + 2);
}

/// The checkpoint files of the store under `dir`, newest (highest sequence) last.
fn checkpoint_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        // The store empties its trash on a thread of its own: a directory may go meanwhile.
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "ckpt") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[tokio::test]
async fn a_corrupt_latest_checkpoint_falls_back_to_the_one_before() {
    let dir = state_dir();
    let engine = engine_in(&dir).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "x = 'first'").await;
    let first = within(session.checkpoint()).await.unwrap();
    run(&session, "x = 'second'").await;
    within(session.checkpoint()).await.unwrap();
    let files = checkpoint_files(&dir);
    let latest = files.last().expect("two checkpoint files");
    let mut bytes = std::fs::read(latest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(latest, bytes).unwrap();

    let restored = within(session.restore(None)).await.unwrap();
    assert_eq!(restored.checkpoint_id, first.checkpoint_id);
    assert_eq!(repr(&session, "x").await, "'first'");
}

#[tokio::test]
async fn checkpoints_asked_together_are_stored_in_the_order_they_were_asked() {
    let dir = state_dir();
    let engine = engine_in(&dir).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(
        &session,
        "import pandas as pd; frame = pd.DataFrame({'a': range(50_000)})",
    )
    .await;
    // Asked one after the other without waiting: each is stored while the next is written.
    let asked = (0..12).map(|_| session.checkpoint());
    let taken = within(futures::future::join_all(asked)).await;
    let ids: Vec<String> = (taken.into_iter())
        .map(|taken| taken.expect("a checkpoint").checkpoint_id)
        .collect();
    let sequences: Vec<u64> = (ids.iter())
        .map(|id| id.trim_start_matches("c-").parse().expect("c-<sequence>"))
        .collect();
    assert!(
        sequences.windows(2).all(|pair| pair[0] < pair[1]),
        "stored out of the order asked: {ids:?}"
    );
    let restored = within(session.restore(None)).await.unwrap();
    assert_eq!(&restored.checkpoint_id, ids.last().unwrap());
    assert_eq!(repr(&session, "int(frame.a.sum())").await, "1249975000");
}

#[tokio::test]
async fn a_named_session_comes_back_in_a_new_engine() {
    let dir = state_dir();
    let first = engine_in(&dir).await;
    let session = first.create_session(named("notebook")).await.unwrap();
    run(&session, "answer = 42\ndef twice(n):\n    return 2 * n").await;
    within(first.shutdown(Duration::from_secs(5)))
        .await
        .unwrap();
    drop(first);

    let second = engine_in(&dir).await;
    let back = second.session("notebook", None).await.unwrap();
    assert!(back.restored());
    assert_eq!(repr(&back, "twice(answer)").await, "84");
    // Creating it by name now attaches to the live one.
    let again = second.create_session(named("notebook")).await.unwrap();
    assert!(again.attached());
    assert_eq!(again.id(), back.id());
}

#[tokio::test]
async fn a_checkpoint_or_restore_asked_while_a_session_comes_back_waits_for_it() {
    let dir = state_dir();
    let first = engine_in(&dir).await;
    let session = first.create_session(named("big")).await.unwrap();
    // Enough state that loading it back takes a while.
    run(&session, "blob = bytes(8_000_000)\nmarker = 'kept'").await;
    within(session.checkpoint()).await.unwrap();
    within(first.shutdown(Duration::from_secs(10)))
        .await
        .unwrap();
    drop(first);

    // Asked at once while the session is being restored from disk: both wait for the
    // worker instead of failing with "the session is restarting".
    let second = engine_in(&dir).await;
    let back = second.session("big", None).await.unwrap();
    let (saved, restored) = tokio::join!(back.checkpoint(), back.restore(None));
    let saved = saved.expect("the checkpoint waits for the restore");
    restored.expect("the restore waits for the worker");
    assert_eq!(
        repr(&back, "(marker, len(blob))").await,
        "('kept', 8000000)"
    );
    let listed = within(back.checkpoints()).await.unwrap();
    assert!(
        listed
            .iter()
            .any(|c| c.id.to_string() == saved.checkpoint_id),
        "{listed:?}"
    );
}

#[tokio::test]
async fn closing_a_session_deletes_its_checkpoints() {
    let dir = state_dir();
    let engine = engine_in(&dir).await;
    let session = engine.create_session(named("scratchpad")).await.unwrap();
    run(&session, "x = 1").await;
    within(session.checkpoint()).await.unwrap();
    assert_eq!(checkpoint_files(&dir).len(), 1);
    session.close().await.unwrap();
    within(async {
        while !checkpoint_files(&dir).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(engine.session("scratchpad", None).await.is_err());
}

#[tokio::test]
async fn a_failed_transaction_leaves_the_namespace_as_it_was() {
    let engine = engine_in(&state_dir()).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "lst = [1]\nd = {'k': 1}").await;
    let failed = within(
        session
            .execute(
                ExecuteRequest::new(
                    "lst.append(2)\nd['k'] = 2\nnew = 1\ndel d\nraise ValueError('no')",
                )
                .rollback_on_failure(),
            )
            .await
            .unwrap()
            .result(),
    )
    .await
    .unwrap();
    assert_eq!(failed.status, ExecutionStatus::Error);
    assert_eq!(
        repr(&session, "(lst, d, 'new' in globals())").await,
        "([1], {'k': 1}, False)"
    );
    // The default keeps what a failed execution did.
    run(&session, "lst.append(2)\nraise ValueError('kept')").await;
    assert_eq!(repr(&session, "lst").await, "[1, 2]");
}

#[tokio::test]
async fn info_lists_variables_and_the_source_of_session_definitions() {
    let engine = engine_in(&state_dir()).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(
        &session,
        "numbers = list(range(1000))\ndef double(n):\n    return 2 * n",
    )
    .await;
    let info = session.info().await.unwrap();
    let namespace = info.namespace.expect("the worker describes its namespace");
    let numbers = namespace
        .variables
        .iter()
        .find(|v| v.name == "numbers")
        .expect("numbers is listed");
    assert_eq!(numbers.type_name, "list");
    assert!(numbers.size_bytes.unwrap_or(0) > 1000);
    let double = namespace
        .definitions
        .iter()
        .find(|d| d.name == "double")
        .expect("double is listed");
    assert_eq!(double.kind, "function");
    assert!(double.source.contains("return 2 * n"));
    assert!(namespace.rss_bytes.unwrap_or(0) > 0);
}

#[tokio::test]
async fn a_second_engine_on_the_same_state_dir_refuses_to_start_and_names_the_holder() {
    let dir = state_dir();
    let first = engine_in(&dir).await;
    let refusal = Engine::start(EngineConfig {
        state: StateConfig {
            dir: Some(dir.clone()),
            ..manual_checkpoints()
        },
        ..EngineConfig::default()
    })
    .await
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(
        refusal.contains("in use by another pyvisor engine")
            && refusal.contains(&format!("pid {}", std::process::id())),
        "{refusal}"
    );
    // The first engine is untouched and serves on.
    let session = first.create_session(named("still")).await.unwrap();
    assert_eq!(repr(&session, "6 * 7").await, "42");
}
