//! LLM task loops run by the engine in a session (docs/protocol.md, `task.run`): what a task
//! asks, what it reports step by step, how it ended, and [`Engine::run_task`] with
//! [`Engine::cancel_task`]. The loop itself is in [`transform`]; replies are read in [`reply`].
//!
//! Only the `transform` kind is implemented: `rlm` is refused with a clear error.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::errors::EngineError;
use crate::llm::Usage;
use crate::{Engine, ExecutionResult, ExecutionStatus};

mod reply;
mod transform;

/// The loop a task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// The recursive language model loop (not implemented yet).
    Rlm,
    /// The deterministic pandas transform loop.
    Transform,
}

/// What a task is asked to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    pub kind: TaskKind,
    pub prompt: String,
    /// The data the code works on: a Python name → a file (`.csv`, `.tsv`, `.json`,
    /// `.jsonl`, `.parquet`, `.feather`, `.xlsx`) read with pandas in the session, or the
    /// name of a variable the session already has.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
    /// A model name of the config; the default model when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default)]
    pub budget: Budget,
    /// Run in this session (its variables may be `data`); a new session when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The task's id, for `task.cancel`; the engine picks `t-N` when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
}

/// What a task may spend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Dollars, from `[llm.prices]`; no limit when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Model replies; 5 for a transform when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u32>,
    /// Nesting of sub-loops (for `rlm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
}

/// How a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Done,
    MaxIterations,
    BudgetExceeded,
    Error,
    Cancelled,
}

/// One step of a task's history: a message of the conversation with the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMessage {
    /// `system`, `user` (what the engine told the model) or `assistant` (the model's reply).
    pub role: String,
    pub content: String,
    /// The code taken from an assistant reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The run of the previous reply's code, on the user message that reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<StepExecution>,
}

/// A run of a reply's code, as a step shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepExecution {
    pub status: ExecutionStatus,
    pub stdout: String,
    pub stderr: String,
    /// The repr of the last expression's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The error's traceback, or its type and message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<&ExecutionResult> for StepExecution {
    fn from(run: &ExecutionResult) -> Self {
        let error = run.error.as_ref().map(|error| {
            if error.traceback.is_empty() {
                format!("{}: {}", error.type_name, error.message)
            } else {
                error.traceback.concat()
            }
        });
        StepExecution {
            status: run.status,
            stdout: run.stdout.clone(),
            stderr: run.stderr.clone(),
            result: run.result.as_ref().map(|value| value.repr.clone()),
            error,
        }
    }
}

/// How a task ended, with its whole history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOutcome {
    pub task_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The last code that ran and gave an accepted (or, short of that, a valid) result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_code: Option<String>,
    /// A preview of that code's `result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Model replies.
    pub iterations: u32,
    /// Dollars.
    pub cost: f64,
    pub tokens: Usage,
    pub messages: Vec<TaskMessage>,
    pub session_id: String,
    /// Why the task ended with `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The tasks that run, for `task.cancel`.
#[derive(Default)]
pub(crate) struct Tasks {
    next: AtomicU64,
    running: Mutex<HashMap<String, RunningTask>>,
}

/// A running task's owner and its cancel switch.
struct RunningTask {
    owner: Option<String>,
    cancel: watch::Sender<bool>,
}

/// Removes a task from [`Tasks`] when its run ends, however it ends.
struct Registered<'a> {
    tasks: &'a Tasks,
    id: String,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut running = self.tasks.running.lock().unwrap_or_else(|e| e.into_inner());
        running.remove(&self.id);
    }
}

impl Tasks {
    fn register(
        &self,
        id: Option<String>,
        owner: Option<&str>,
    ) -> Result<(Registered<'_>, watch::Receiver<bool>), EngineError> {
        let id = id.unwrap_or_else(|| self.new_id());
        if id.is_empty() || id.len() > 128 {
            return Err(EngineError::Task("task_id must be 1 to 128 bytes".into()));
        }
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.contains_key(&id) {
            return Err(EngineError::Task(format!(
                "a task {id:?} is already running"
            )));
        }
        let (cancel, cancelled) = watch::channel(false);
        let owner = owner.map(str::to_owned);
        running.insert(id.clone(), RunningTask { owner, cancel });
        drop(running);
        Ok((Registered { tasks: self, id }, cancelled))
    }

    fn new_id(&self) -> String {
        format!("t-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn cancel(&self, id: &str, owner: Option<&str>) -> bool {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(id) {
            Some(task) if owner.is_none() || owner == task.owner.as_deref() => {
                task.cancel.send_replace(true);
                true
            }
            _ => false,
        }
    }
}

impl Engine {
    /// Runs an LLM task loop in a session of `owner` (a new one unless the request names
    /// one), sending each step of its history to `steps` as it happens.
    pub async fn run_task(
        &self,
        request: TaskRequest,
        owner: Option<&str>,
        steps: Option<mpsc::UnboundedSender<TaskMessage>>,
    ) -> Result<TaskOutcome, EngineError> {
        if request.kind == TaskKind::Rlm {
            return Err(EngineError::Task(
                "kind rlm is not implemented yet; use kind transform".into(),
            ));
        }
        let client = self.llm_client().ok_or(EngineError::NoLlm)?;
        let (registered, cancelled) = self.tasks().register(request.task_id.clone(), owner)?;
        let session = match &request.session_id {
            Some(id) => self.session(id, owner).await?,
            None => {
                let options = crate::SessionOptions {
                    owner: owner.map(str::to_owned),
                    llm: Some(false),
                    ..Default::default()
                };
                self.create_session(options).await?
            }
        };
        let run = transform::Transform {
            session: &session,
            client,
            request: &request,
            task_id: registered.id.clone(),
            steps,
            cancelled,
        };
        Ok(run.run().await)
    }

    /// A fresh task id, `t-N`.
    pub fn new_task_id(&self) -> String {
        self.tasks().new_id()
    }

    /// Cancels the running task `task_id`; with an `owner`, only one of that owner's. Whether
    /// such a task was running.
    pub fn cancel_task(&self, task_id: &str, owner: Option<&str>) -> bool {
        self.tasks().cancel(task_id, owner)
    }
}
