//! The worker's state operations with real Python other than checkpoints (those are in
//! `worker_state_checkpoints.rs`): transactions that roll the namespace back on failure, the
//! `changed` flag of results, and inspect answering while code runs.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyvisor_actors::worker::{Worker, WorkerEvent};
use pyvisor_actors::OutputStream;
use pyvisor_protocol::{
    Definition, HostMessage, Transaction, Variable, WorkerMessage, WorkerStatus,
};

#[allow(
    dead_code,
    reason = "the shared helpers serve several test files; this one needs a few"
)]
mod common;
mod frames;
mod outcomes;

use common::PATIENCE;
use frames::{next_message, send, start};
use outcomes::{execute_message, ok, repr, result_of, run, run_as};

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
