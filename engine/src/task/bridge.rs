//! [`TaskBridge`]: the LLM bridge of an RLM loop's session. Its `llm_query` and
//! `llm_query_batched` go to the engine's [`Dispatcher`] once the loop's
//! [`BudgetController`] admits them (else they raise `BudgetExceeded`), and each completion is
//! charged to the loop and every loop above it. `rlm_query(task, ctx)` starts a nested loop one
//! level deeper in a session of its own, with a share of what is left; when the depth is at
//! its maximum or too little is left it runs as an `llm_query`, and the answer says so.
//!
//! Everything that limits a call lives here, in the host: a call frame carries only prompts, a
//! model name and a context, so session code cannot raise its budget or its depth.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use pyvisor_actors::bridge::{
    budget_exceeded, llm_error, BridgeCall, LlmBridge, LlmCallKind, LlmFailure,
};
use serde_json::Value;
use tokio::sync::watch;

use super::budget::BudgetController;
use super::record::Recorder;
use super::{rlm, TaskStatus};
use crate::config::RlmConfig;
use crate::engine::WeakEngine;
use crate::llm::{texts, ChatMessage, Dispatcher};

/// The bridge of one loop's session.
#[derive(Clone)]
pub(super) struct TaskBridge {
    pub dispatcher: Dispatcher,
    pub budget: Arc<BudgetController>,
    pub nest: Nest,
    /// Set when the loop ends: a session kept after its task refuses further calls.
    pub ended: Arc<AtomicBool>,
}

/// What a nested loop inherits from the loop that starts it.
#[derive(Clone)]
pub(super) struct Nest {
    pub engine: WeakEngine,
    pub owner: Option<String>,
    /// The model of the task; nested loops use it unless `rlm_query` names one.
    pub model: Option<String>,
    pub config: RlmConfig,
    pub task_id: String,
    pub cancelled: watch::Receiver<bool>,
    /// Where the task's completions are kept.
    pub recorder: Recorder,
}

impl LlmBridge for TaskBridge {
    fn call(&self, call: BridgeCall) -> BoxFuture<'static, Result<Vec<String>, LlmFailure>> {
        if self.ended.load(Ordering::Acquire) {
            let refusal = "the task that made this session has ended; its budget is closed";
            return Box::pin(std::future::ready(Err(llm_error(refusal))));
        }
        let bridge = self.clone();
        match call.kind {
            LlmCallKind::Rlm => Box::pin(bridge.rlm(call)),
            LlmCallKind::Llm | LlmCallKind::LlmBatched => Box::pin(bridge.ask(call)),
        }
    }
}

impl TaskBridge {
    /// Answers `call`'s prompts within the budget, charging each completion.
    async fn ask(self, call: BridgeCall) -> Result<Vec<String>, LlmFailure> {
        self.budget.admit().map_err(budget_exceeded)?;
        let prompts = call.prompts.clone();
        let answers = self.dispatcher.ask(call).await?;
        for (prompt, answer) in prompts.into_iter().zip(&answers) {
            if let Ok(completion) = answer {
                self.budget.charge(completion);
                let asked = [ChatMessage::new("user", prompt)];
                self.nest.recorder.record(&asked, completion);
            }
        }
        texts(answers)
    }

    /// Runs `rlm_query(task, ctx)`: a nested loop, or an `llm_query` that says why not.
    async fn rlm(self, mut call: BridgeCall) -> Result<Vec<String>, LlmFailure> {
        if call.prompts.len() != 1 {
            return Err(llm_error("rlm_query takes exactly one task"));
        }
        let task = call.prompts[0].clone();
        let context = call.context.take();
        let child = match self.budget.nested(&self.nest.config) {
            Ok(child) => child,
            Err(reason) => {
                call.kind = LlmCallKind::Llm;
                call.prompts = vec![with_context(&task, context.as_ref())];
                let answer = self.ask(call).await?.pop().unwrap_or_default();
                let note = format!("[rlm_query ran as llm_query: {reason}]\n{answer}");
                return Ok(vec![note]);
            }
        };
        let engine =
            (self.nest.engine.upgrade()).ok_or_else(|| llm_error("the engine has stopped"))?;
        let mut nest = self.nest.clone();
        nest.model = call.model.or(nest.model);
        let nested = TaskBridge {
            dispatcher: self.dispatcher.clone(),
            budget: child,
            nest,
            ended: Arc::default(),
        };
        let outcome = rlm::run_nested(&engine, nested, task, context).await;
        let ending = format!(
            "the nested loop (depth {}) ended with status {} after {} iteration(s){}",
            self.budget.depth() + 1,
            serde_json::to_value(outcome.status).unwrap_or_default(),
            outcome.iterations,
            outcome.error.map(|e| format!(": {e}")).unwrap_or_default()
        );
        match (outcome.status, outcome.answer) {
            (TaskStatus::Done, Some(answer)) => Ok(vec![answer]),
            (TaskStatus::BudgetExceeded, _) => Err(budget_exceeded(ending)),
            _ => Err(llm_error(ending)),
        }
    }
}

/// The prompt of an `rlm_query` run as an `llm_query`: the task, then its context.
fn with_context(task: &str, context: Option<&Value>) -> String {
    match context {
        None | Some(Value::Null) => task.to_owned(),
        Some(Value::String(text)) => format!("{task}\n\nContext:\n{text}"),
        Some(value) => format!("{task}\n\nContext (JSON):\n{value}"),
    }
}
