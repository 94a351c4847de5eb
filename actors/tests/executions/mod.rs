//! Executing cells on one worker directly and collecting what a real execution produced,
//! its facts included, for the tests of proactive computation's worker side.

use pyvisor_actors::worker::{Worker, WorkerEvent};
use pyvisor_actors::OutputStream;
use pyvisor_protocol::{
    CellFacts, ErrorInfo, HostMessage, ResultValue, Transaction, WorkerMessage, WorkerStatus,
};

use super::common::PATIENCE;
use super::frames::send;

/// What a real execution produced.
#[derive(Debug)]
pub struct Real {
    pub status: WorkerStatus,
    pub result: Option<ResultValue>,
    pub error: Option<ErrorInfo>,
    pub stdout: String,
    pub stderr: String,
    pub facts: Option<Box<CellFacts>>,
}

/// Executes `code`, with its facts when `facts`, collecting its output.
pub async fn run(worker: &mut Worker, code: &str, facts: bool) -> Real {
    send(
        worker,
        HostMessage::Execute {
            id: "e".into(),
            code: code.into(),
            repr_limit: 65536,
            transaction: Transaction::CommitAlways,
            facts,
            cell: None,
        },
    );
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut ended = None;
    tokio::time::timeout(PATIENCE, async {
        loop {
            match worker.events.recv().await.expect("the worker is alive") {
                WorkerEvent::Output { stream, bytes } => match stream {
                    OutputStream::Stdout => stdout.extend(bytes),
                    OutputStream::Stderr => stderr.extend(bytes),
                },
                WorkerEvent::Message(WorkerMessage::Result {
                    id,
                    status,
                    result,
                    error,
                    ..
                }) if id == "e" => {
                    let real = Real {
                        status,
                        result,
                        error,
                        stdout: String::from_utf8(std::mem::take(&mut stdout))
                            .expect("UTF-8 output"),
                        stderr: String::from_utf8(std::mem::take(&mut stderr))
                            .expect("UTF-8 output"),
                        facts: None,
                    };
                    if !facts {
                        return real;
                    }
                    ended = Some(real);
                }
                WorkerEvent::Message(WorkerMessage::Facts { id, facts: told }) if id == "e" => {
                    let mut real = ended.take().expect("the facts come after the result");
                    real.facts = told;
                    return real;
                }
                other => panic!("unexpected while {code:?} runs: {other:?}"),
            }
        }
    })
    .await
    .expect("the execution ends")
}

/// Executes code that must succeed.
pub async fn ok(worker: &mut Worker, code: &str) -> Real {
    let real = run(worker, code, false).await;
    assert_eq!(real.status, WorkerStatus::Ok, "{code}: {real:?}");
    real
}

/// The facts of an execution that must succeed.
pub async fn facts(worker: &mut Worker, code: &str) -> CellFacts {
    let real = run(worker, code, true).await;
    assert_eq!(real.status, WorkerStatus::Ok, "{code}: {real:?}");
    *real.facts.expect("facts were asked for")
}
