//! The worker protocol with a real worker: its two request pipes (the main thread's requests,
//! the control messages served while code runs), and its room to grow: the capabilities its
//! hello announces, and a frame of a kind the host does not know, which is dropped while the
//! worker goes on serving (a known kind the host cannot read still ends the worker).

use pyvisor_actors::worker::{Worker, WorkerEvent};
use pyvisor_protocol::{HostMessage, WorkerMessage, WorkerStatus};

#[allow(
    dead_code,
    reason = "the shared helpers serve several test files; this one needs a few"
)]
mod common;
mod frames;

use common::PATIENCE;
use frames::{next_message, send, start};

fn execute(id: &str, code: &str) -> HostMessage {
    HostMessage::Execute {
        id: id.into(),
        code: code.into(),
        repr_limit: 65536,
        transaction: Default::default(),
        facts: false,
        cell: None,
    }
}

/// Python that writes `payload` (a JSON object) as one frame on the worker's fd 4, as a newer
/// worker would.
fn write_frame(payload: &str) -> String {
    format!(
        "import os, struct\n\
         body = {payload:?}.encode()\n\
         os.write(4, struct.pack('>I', len(body)) + body)\n"
    )
}

/// The result of execution `id`, which must come next.
async fn result_of(worker: &mut Worker, id: &str) -> (WorkerStatus, Option<String>) {
    match next_message(worker).await {
        WorkerMessage::Result {
            id: got,
            status,
            result,
            ..
        } if got == id => (status, result.map(|r| r.repr)),
        other => panic!("expected the result of {id}, got {other:?}"),
    }
}

#[tokio::test]
async fn the_hello_announces_what_the_worker_serves() {
    let worker = start().await;
    for capability in [
        "checkpoint",
        "restore",
        "inspect",
        "complete",
        "speculate",
        "adopt",
    ] {
        assert!(
            worker.info.supports(capability),
            "{capability} in {:?}",
            worker.info.capabilities
        );
    }
    assert!(!worker.info.supports("teleport"));
}

#[tokio::test]
async fn a_frame_of_an_unknown_kind_is_dropped_and_the_worker_keeps_serving() {
    let mut worker = start().await;
    let pid = worker.info.pid;
    let payload = r#"{"type": "from_a_newer_worker", "id": "e-1", "extra": [1, {"x": null}]}"#;
    let code = format!("{}'sent'", write_frame(payload));
    send(&worker, execute("e-1", &code));
    // The unknown frame comes before the result on the same pipe: the next message is the
    // result, not the unknown frame and not a protocol error.
    assert_eq!(
        result_of(&mut worker, "e-1").await,
        (WorkerStatus::Ok, Some("'sent'".into()))
    );
    send(&worker, execute("e-2", "import os; os.getpid()"));
    assert_eq!(
        result_of(&mut worker, "e-2").await,
        (WorkerStatus::Ok, Some(pid.to_string()))
    );
}

#[tokio::test]
async fn a_known_kind_with_unreadable_fields_still_ends_the_worker() {
    let mut worker = start().await;
    send(
        &worker,
        execute("e-1", &write_frame(r#"{"type": "result", "id": 7}"#)),
    );
    let reason = tokio::time::timeout(PATIENCE, async {
        loop {
            match worker.events.recv().await.expect("the worker is alive") {
                WorkerEvent::ProtocolError(reason) => return reason,
                WorkerEvent::Output { .. } => {}
                other => panic!("expected a protocol error, got {other:?}"),
            }
        }
    })
    .await
    .expect("the bad frame is reported");
    assert!(reason.contains("malformed frame payload"), "{reason}");
}

#[tokio::test]
async fn control_messages_are_served_while_the_main_thread_runs_code() {
    let mut worker = start().await;
    send(
        &worker,
        execute("e-1", "import time\ntime.sleep(0.5)\n'slept'"),
    );
    send(&worker, HostMessage::Inspect { id: "i-1".into() });
    // The inspection is answered while the cell still sleeps: before its result.
    match next_message(&mut worker).await {
        WorkerMessage::InspectDone { id, .. } => assert_eq!(id, "i-1"),
        other => panic!("expected the inspection first, got {other:?}"),
    }
    assert_eq!(
        result_of(&mut worker, "e-1").await,
        (WorkerStatus::Ok, Some("'slept'".into()))
    );
}

#[tokio::test]
async fn an_interrupt_of_an_execution_not_read_yet_ends_it_without_running_it() {
    let mut worker = start().await;
    send(
        &worker,
        execute("e-1", "import time\ntime.sleep(0.3)\n'first'"),
    );
    // e-2 waits in the request pipe while e-1 runs; its interrupt comes on the control pipe
    // first, and neither reaches e-1 nor is lost.
    send(&worker, execute("e-2", "ran = True"));
    send(&worker, HostMessage::Interrupt { id: "e-2".into() });
    assert_eq!(
        result_of(&mut worker, "e-1").await,
        (WorkerStatus::Ok, Some("'first'".into()))
    );
    match next_message(&mut worker).await {
        WorkerMessage::Result {
            id, status, error, ..
        } => {
            assert_eq!((id.as_str(), status), ("e-2", WorkerStatus::Error));
            assert_eq!(error.unwrap().type_name, "KeyboardInterrupt");
        }
        other => panic!("expected the result of e-2, got {other:?}"),
    }
    send(&worker, execute("e-3", "'ran' in globals()"));
    assert_eq!(
        result_of(&mut worker, "e-3").await,
        (WorkerStatus::Ok, Some("False".into()))
    );
}
