//! Talking to one worker directly, frame by frame, for the tests of the worker's protocol.

use pyvisor_actors::worker::{Worker, WorkerEvent};
use pyvisor_protocol::{HostMessage, WorkerMessage};

use super::common::{spec, PATIENCE};

/// A worker spawned as the engine spawns one, without a zygote.
pub async fn start() -> Worker {
    Worker::start(&spec(&[], None))
        .await
        .expect("the worker starts")
}

pub fn send(worker: &Worker, message: HostMessage) {
    worker
        .writer
        .send(&message)
        .expect("the message fits in a frame");
}

/// The next frame from the worker, skipping its output.
pub async fn next_message(worker: &mut Worker) -> WorkerMessage {
    tokio::time::timeout(PATIENCE, async {
        loop {
            match worker.events.recv().await.expect("the worker is alive") {
                WorkerEvent::Message(message) => return message,
                WorkerEvent::Exited(status) => panic!("the worker exited ({status:?})"),
                WorkerEvent::ProtocolError(reason) => panic!("protocol error: {reason}"),
                WorkerEvent::Output { .. } => {}
            }
        }
    })
    .await
    .expect("the worker answers")
}
