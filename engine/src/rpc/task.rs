//! The `task.*` methods of docs/protocol.md: `task.run` (params: a
//! [`TaskRequest`](crate::task::TaskRequest) and `stream`) runs an LLM task loop
//! ([`Engine::run_task`](crate::Engine::run_task)) and, with `stream: true`, sends each step
//! as a `task.step` notification before the result; `task.cancel` ends a running task of the
//! caller's scope. The wire types are the client's too; serving the methods needs the
//! `server` feature.

use serde::{Deserialize, Serialize};
#[cfg(feature = "server")]
use serde_json::{value::RawValue, Value};
#[cfg(feature = "server")]
use tokio::sync::mpsc;

#[cfg(feature = "server")]
use super::{
    errors::RpcError,
    outbound::Outbound,
    params::{decode, encode},
};
use crate::task::TaskMessage;
#[cfg(feature = "server")]
use crate::{task::TaskRequest, Engine};

/// Method names.
pub const RUN: &str = "task.run";
pub const CANCEL: &str = "task.cancel";
/// The notification of one step.
pub const STEP: &str = "task.step";

/// `task.cancel` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelParams {
    pub task_id: String,
}

/// `task.cancel` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancelled {
    pub cancelled: bool,
}

/// A `task.step` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepNote {
    pub task_id: String,
    #[serde(flatten)]
    pub message: TaskMessage,
}

/// Serves `method` (one of [`RUN`] and [`CANCEL`]) for a caller confined to `owner`.
#[cfg(feature = "server")]
pub async fn call(
    engine: &Engine,
    owner: Option<&str>,
    method: &str,
    params: Option<Value>,
    out: &Outbound,
) -> Result<Box<RawValue>, RpcError> {
    if method == CANCEL {
        let params: CancelParams = decode(params)?;
        let cancelled = engine.cancel_task(&params.task_id, owner);
        return encode(Cancelled { cancelled });
    }
    // The params are a TaskRequest and `stream`.
    let mut params = params;
    let stream = match params.as_mut().and_then(Value::as_object_mut) {
        Some(fields) => match fields.remove("stream") {
            None => false,
            Some(Value::Bool(stream)) => stream,
            Some(_) => return Err(RpcError::invalid_params("stream: expected a boolean")),
        },
        None => false,
    };
    let mut request: TaskRequest = decode(params)?;
    let task_id = (request.task_id.clone()).unwrap_or_else(|| engine.new_task_id());
    request.task_id = Some(task_id.clone());
    if !stream {
        return encode(engine.run_task(request, owner, None).await?);
    }
    let (steps, mut stepped) = mpsc::unbounded_channel();
    let run = engine.run_task(request, owner, Some(steps));
    tokio::pin!(run);
    let outcome = loop {
        tokio::select! {
            outcome = &mut run => break outcome,
            Some(message) = stepped.recv() => {
                let note = StepNote { task_id: task_id.clone(), message };
                out.notify(STEP, &note).await;
            }
        }
    };
    // Steps sent just before the end come before the result.
    while let Ok(message) = stepped.try_recv() {
        let note = StepNote {
            task_id: task_id.clone(),
            message,
        };
        out.notify(STEP, &note).await;
    }
    encode(outcome?)
}
