//! Executing code on one worker directly and reading the result frame it answers with: its
//! status, value, error and the state flags (`changed`, `rolled_back`), for the tests of the
//! worker's state operations.

use pyvisor_actors::worker::Worker;
use pyvisor_protocol::{
    ErrorInfo, HostMessage, ResultValue, Transaction, WorkerMessage, WorkerStatus,
};

use super::frames::{next_message, send};

pub fn execute_message(id: &str, code: &str, transaction: Transaction) -> HostMessage {
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
pub struct Outcome {
    pub status: WorkerStatus,
    pub result: Option<ResultValue>,
    pub error: Option<ErrorInfo>,
    pub changed: bool,
    pub rolled_back: bool,
}

pub async fn result_of(worker: &mut Worker, wanted: &str) -> Outcome {
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

pub async fn run_as(worker: &mut Worker, code: &str, transaction: Transaction) -> Outcome {
    send(worker, execute_message("e", code, transaction));
    result_of(worker, "e").await
}

pub async fn run(worker: &mut Worker, code: &str) -> Outcome {
    run_as(worker, code, Transaction::CommitAlways).await
}

/// Runs code that must succeed.
pub async fn ok(worker: &mut Worker, code: &str) -> Outcome {
    let outcome = run(worker, code).await;
    assert_eq!(outcome.status, WorkerStatus::Ok, "{code}: {outcome:?}");
    outcome
}

/// The repr of the value of an expression.
pub async fn repr(worker: &mut Worker, expression: &str) -> String {
    ok(worker, expression)
        .await
        .result
        .unwrap_or_else(|| panic!("{expression} has a value"))
        .repr
}
