//! The worker protocol's room to grow, with a real worker: the capabilities its hello
//! announces, and a frame of a kind the host does not know, which is dropped while the worker
//! goes on serving (a known kind the host cannot read still ends the worker).

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
