//! LLM task loops run by the engine in a session (docs/protocol.md, `task.run`): what a task
//! asks, what it reports step by step, how it ended, and [`Engine::run_task`] with
//! [`Engine::cancel_task`]. The loops are in the `transform` and `rlm` modules; replies are
//! read in `reply`; an RLM loop's budget is a [`BudgetController`] and its session's bridge a
//! `bridge::TaskBridge`. A session a task makes is closed when the task ends, unless the
//! request says `keep_session`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::errors::EngineError;
use crate::llm::Usage;
use crate::{Engine, ExecuteRequest, ExecutionResult, ExecutionStatus, Session};

mod bridge;
mod budget;
mod record;
mod reply;
mod rlm;
mod transform;

pub use budget::{BudgetController, Spent};
pub use record::{RecordedCall, ReplayClient};

/// The loop a task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// The recursive language model loop.
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
    /// The RLM loop's `context` variable; no context when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<TaskContext>,
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
    /// Leave the session the task made open when it ends (it is closed otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_session: bool,
}

/// An RLM task's context: a string, or a file the session reads (`.json`, `.jsonl`, `.csv`,
/// `.tsv` are parsed, anything else is text), so that it never passes through a prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TaskContext {
    Text(String),
    File { path: String },
}

impl TaskContext {
    /// The spec of the loop's setup code.
    fn spec(&self) -> serde_json::Value {
        match self {
            TaskContext::Text(text) => serde_json::json!({ "value": text }),
            TaskContext::File { path } => serde_json::json!({ "path": path }),
        }
    }
}

/// What a task may spend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Dollars, from `[llm.prices]`; no limit when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Model replies; 5 for a transform, `[llm.rlm] max_iterations` for an RLM loop, when
    /// `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u32>,
    /// Nesting of `rlm_query` loops; `[llm.rlm] max_depth` when `None`.
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
    /// Every completion the task got, nested loops' and sessions' calls included, for an
    /// offline replay ([`ReplayClient`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub llm_calls: Vec<RecordedCall>,
}

/// A task as `pyvisor task --save` writes it: the request, and the outcome's fields beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedTask {
    pub request: TaskRequest,
    #[serde(flatten)]
    pub outcome: TaskOutcome,
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

impl TaskOutcome {
    /// An outcome with nothing done yet, to fill in.
    fn empty() -> Self {
        TaskOutcome {
            task_id: String::new(),
            status: TaskStatus::Error,
            answer: None,
            final_code: None,
            result: None,
            iterations: 0,
            cost: 0.0,
            tokens: Usage::default(),
            messages: Vec::new(),
            session_id: String::new(),
            error: None,
            llm_calls: Vec::new(),
        }
    }
}

/// A session a task made: closed when this drops (the task ended, or its future was dropped),
/// unless the caller asked to keep it.
pub(crate) struct TaskSession {
    session: Session,
    close: bool,
}

impl TaskSession {
    fn new(session: Session, close: bool) -> Self {
        Self { session, close }
    }
}

impl std::ops::Deref for TaskSession {
    type Target = Session;

    fn deref(&self) -> &Session {
        &self.session
    }
}

impl Drop for TaskSession {
    fn drop(&mut self) {
        if self.close {
            self.session.close_in_background();
        }
    }
}

/// Why a loop stops before its natural end.
pub(super) enum Stop {
    Cancelled,
    Failed(String),
}

/// Runs `code` in `session`; a cancel interrupts it.
async fn run_code(
    session: &Session,
    cancelled: &watch::Receiver<bool>,
    code: &str,
) -> Result<ExecutionResult, Stop> {
    let failed = |err: EngineError| Stop::Failed(err.to_string());
    let mut cancelled = cancelled.clone();
    let execution = session
        .execute(ExecuteRequest::new(code))
        .await
        .map_err(failed)?;
    let result = execution.result();
    tokio::pin!(result);
    tokio::select! {
        run = &mut result => run.map_err(failed),
        () = self::cancelled(&mut cancelled) => {
            let _ = session.interrupt().await;
            let _ = result.await;
            Err(Stop::Cancelled)
        }
    }
}

/// Resolves when the task is cancelled (never, once nobody can cancel it).
async fn cancelled(flag: &mut watch::Receiver<bool>) {
    if flag.wait_for(|cancelled| *cancelled).await.is_err() {
        std::future::pending::<()>().await;
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
        if self.llm_client().is_none() {
            return Err(EngineError::NoLlm);
        }
        if request.kind == TaskKind::Rlm && request.session_id.is_some() {
            return Err(EngineError::Task(
                "session_id: an rlm task runs in a session of its own, whose LLM calls its \
                 budget accounts; give the data as context or data instead"
                    .into(),
            ));
        }
        if request.kind == TaskKind::Transform && request.context.is_some() {
            return Err(EngineError::Task(
                "context: only an rlm task has a context; a transform takes data".into(),
            ));
        }
        let (registered, cancelled) = self.tasks().register(request.task_id.clone(), owner)?;
        let task_id = registered.id.clone();
        let recorder = record::Recorder::default();
        let mut outcome = self
            .run_registered(request, owner, steps, task_id, cancelled, &recorder)
            .await?;
        outcome.llm_calls = recorder.calls();
        drop(registered);
        Ok(outcome)
    }

    /// Runs a registered task's loop.
    async fn run_registered(
        &self,
        request: TaskRequest,
        owner: Option<&str>,
        steps: Option<mpsc::UnboundedSender<TaskMessage>>,
        task_id: String,
        cancelled: watch::Receiver<bool>,
        recorder: &record::Recorder,
    ) -> Result<TaskOutcome, EngineError> {
        let client = self.llm_client().ok_or(EngineError::NoLlm)?;
        if request.kind == TaskKind::Rlm {
            let (dispatcher, config) = self.llm_dispatcher().ok_or(EngineError::NoLlm)?;
            let bridge = bridge::TaskBridge {
                dispatcher: dispatcher.clone(),
                budget: BudgetController::root(&request.budget, config),
                nest: bridge::Nest {
                    engine: self.downgrade(),
                    owner: owner.map(str::to_owned),
                    model: request.model.clone(),
                    config: *config,
                    task_id: task_id.clone(),
                    cancelled,
                    recorder: recorder.clone(),
                },
                ended: Default::default(),
            };
            let session = rlm::loop_session(self, &bridge, request.keep_session).await?;
            if !request.data.is_empty() {
                let load = transform::load_code(&request.data);
                let loaded = match load {
                    Ok(code) => run_code(&session, &bridge.nest.cancelled, &code).await,
                    Err(stop) => Err(stop),
                };
                let failure = match loaded {
                    Ok(run) if run.status == ExecutionStatus::Ok => None,
                    Ok(run) => Some(StepExecution::from(&run).error.unwrap_or_default()),
                    Err(Stop::Failed(why)) => Some(why),
                    Err(Stop::Cancelled) => Some("cancelled".into()),
                };
                if let Some(why) = failure {
                    return Ok(TaskOutcome {
                        task_id,
                        error: Some(format!("loading the data failed: {why}")),
                        session_id: session.id().to_owned(),
                        ..TaskOutcome::empty()
                    });
                }
            }
            let run = rlm::Rlm {
                session: &session,
                client,
                bridge: &bridge,
                prompt: &request.prompt,
                task_id,
                steps,
            };
            let context =
                (request.context.as_ref()).map_or(serde_json::json!({}), TaskContext::spec);
            return Ok(run.run(context).await);
        }
        let session = match &request.session_id {
            Some(id) => TaskSession::new(self.session(id, owner).await?, false),
            None => {
                let options = crate::SessionOptions {
                    owner: owner.map(str::to_owned),
                    llm: Some(false),
                    ..Default::default()
                };
                let session = self.create_session(options).await?;
                TaskSession::new(session, !request.keep_session)
            }
        };
        let run = transform::Transform {
            session: &session,
            client,
            request: &request,
            task_id,
            steps,
            cancelled,
            recorder: recorder.clone(),
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
