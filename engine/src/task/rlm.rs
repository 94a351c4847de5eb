//! The recursive language model loop: the task goes to the model, and its context stays in
//! the session variable `context` (loaded there from a string, a JSON value or a file), never
//! in the prompt. Every fenced code block of a reply runs in the session; its output goes back
//! truncated to `[llm.rlm] output_chars` with a note. The code may call `llm_query`,
//! `llm_query_batched` and `rlm_query` (see [`super::bridge`]). The loop ends when the model
//! calls `FINAL(answer)` or `FINAL_VAR(name)` in code, or writes either outside code; when
//! its iterations or its dollars run out ([`BudgetController`]); or on a cancel.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::bridge::TaskBridge;
use super::budget::BudgetController;
use super::reply::{code_blocks, final_of, Final};
use super::{run_code, StepExecution, Stop, TaskMessage, TaskOutcome, TaskStatus};
use crate::llm::{ChatMessage, ChatRequest, LlmClient, LlmCounters};
use crate::{Engine, EngineError, ExecutionStatus, Session, SessionOptions};

/// Python that puts the task's context in `context`, gives the code `FINAL` and `FINAL_VAR`,
/// and prints a description of the context as JSON. `spec` is `{"value": ...}`,
/// `{"path": "..."}` or `{}`. It runs in a dictionary of its own; `ns` is the session's.
const SETUP: &str = r#"
def _setup(ns, spec):
    import json
    slot = []
    def FINAL(answer):
        """End the task with `answer`."""
        slot[:] = [str(answer)]
    def FINAL_VAR(name):
        """End the task with the value of the variable called `name`."""
        if not isinstance(name, str):
            slot[:] = [str(name)]
        elif name not in ns:
            raise NameError("FINAL_VAR: no variable named %r" % name)
        else:
            slot[:] = [str(ns[name])]
    ns["FINAL"], ns["FINAL_VAR"], ns["_pyvisor_final"] = FINAL, FINAL_VAR, slot
    if "path" in spec:
        path = spec["path"]
        low = path.lower()
        if low.endswith((".json", ".jsonl")):
            with open(path, encoding="utf-8") as f:
                ns["context"] = ([json.loads(line) for line in f if line.strip()]
                                 if low.endswith(".jsonl") else json.load(f))
        elif low.endswith((".csv", ".tsv")):
            sep = "\t" if low.endswith(".tsv") else ","
            try:
                import pandas
                ns["context"] = pandas.read_csv(path, sep=sep)
            except ImportError:
                import csv
                with open(path, newline="", encoding="utf-8") as f:
                    ns["context"] = list(csv.DictReader(f, delimiter=sep))
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                ns["context"] = f.read()
    elif "value" in spec:
        ns["context"] = spec["value"]
    value = ns.get("context")
    print(json.dumps({"type": type(value).__name__,
                      "length": len(value) if hasattr(value, "__len__") else None}))
_setup(ns, spec)
"#;

/// Python that prints, as JSON, the answer given to `FINAL` or `FINAL_VAR` (or null), and
/// forgets it.
const TAKE_FINAL: &str = r#"
import json as _json
_slot = ns.get("_pyvisor_final")
print(_json.dumps(_slot[0] if isinstance(_slot, list) and _slot else None))
if isinstance(_slot, list):
    _slot.clear()
"#;

/// One run of the loop.
pub(super) struct Rlm<'a> {
    pub session: &'a Session,
    pub client: (Arc<dyn LlmClient>, Arc<LlmCounters>),
    pub bridge: &'a TaskBridge,
    pub prompt: &'a str,
    pub task_id: String,
    pub steps: Option<mpsc::UnboundedSender<TaskMessage>>,
}

/// The loop's state as it goes.
#[derive(Default)]
struct Progress {
    messages: Vec<TaskMessage>,
    answer: Option<String>,
    /// The last code that ran, and what it printed.
    last_run: Option<(String, String)>,
}

impl Rlm<'_> {
    /// Runs the loop with `context` (a `{"value"}` or `{"path"}` spec) in the session.
    pub(super) async fn run(self, context: Value) -> TaskOutcome {
        let mut progress = Progress::default();
        let (status, error) = match self.drive(&mut progress, context).await {
            Ok(status) => (status, None),
            Err(Stop::Cancelled) => (TaskStatus::Cancelled, None),
            Err(Stop::Failed(reason)) => (TaskStatus::Error, Some(reason)),
        };
        self.bridge.ended.store(true, Ordering::Release);
        let spent = self.bridge.budget.spent();
        let (final_code, result) = progress.last_run.unzip();
        TaskOutcome {
            task_id: self.task_id,
            status,
            answer: progress.answer,
            final_code,
            result,
            iterations: spent.iterations,
            cost: spent.cost,
            tokens: spent.tokens,
            messages: progress.messages,
            session_id: self.session.id().to_owned(),
            error,
            llm_calls: Vec::new(),
        }
    }

    fn budget(&self) -> &BudgetController {
        &self.bridge.budget
    }

    async fn drive(&self, progress: &mut Progress, context: Value) -> Result<TaskStatus, Stop> {
        let setup = self.helper(SETUP, json!({ "spec": context })).await?;
        let described = serde_json::from_str::<Value>(setup.trim()).unwrap_or_default();
        self.record(
            progress,
            "system",
            self.system_prompt(&described),
            None,
            None,
        );
        self.record(
            progress,
            "user",
            format!("Task: {}", self.prompt),
            None,
            None,
        );
        loop {
            if self.budget().cost_exhausted() {
                return Ok(TaskStatus::BudgetExceeded);
            }
            if self.budget().remaining_iterations() == 0 {
                return Ok(TaskStatus::MaxIterations);
            }
            let reply = self.ask(progress).await?;
            let blocks = code_blocks(&reply);
            let code = Some(blocks.join("\n\n")).filter(|code| !code.is_empty());
            self.record(progress, "assistant", reply.clone(), code, None);
            let mut feedback = Vec::new();
            let mut last_step = None;
            for (number, code) in blocks.iter().enumerate() {
                let run = run_code(self.session, &self.bridge.nest.cancelled, code).await?;
                let step = StepExecution::from(&run);
                let shown = self.shown(&step);
                progress.last_run = Some((code.clone(), shown.clone()));
                feedback.push(format!("Output of code block {}:\n{shown}", number + 1));
                last_step = Some(step);
            }
            if !blocks.is_empty() {
                if let Some(answer) = self.take_final().await? {
                    progress.answer = Some(answer);
                    return Ok(TaskStatus::Done);
                }
            }
            match final_of(&reply) {
                Some(Final::Answer(answer)) => {
                    progress.answer = Some(answer);
                    return Ok(TaskStatus::Done);
                }
                Some(Final::Var(name)) => {
                    let quoted = serde_json::to_string(&name).expect("a string serializes");
                    let run = run_code(
                        self.session,
                        &self.bridge.nest.cancelled,
                        &format!("FINAL_VAR({quoted})"),
                    )
                    .await?;
                    if run.status == ExecutionStatus::Ok {
                        if let Some(answer) = self.take_final().await? {
                            progress.answer = Some(answer);
                            return Ok(TaskStatus::Done);
                        }
                    }
                    let step = StepExecution::from(&run);
                    feedback.push(format!("FINAL_VAR({name}) failed:\n{}", self.shown(&step)));
                }
                None if blocks.is_empty() => feedback.push(
                    "Your reply has no code block and no FINAL. Reply with a ```repl block, or \
                     FINAL(answer) on a line of its own."
                        .to_owned(),
                ),
                None => {}
            }
            self.record(progress, "user", feedback.join("\n\n"), None, last_step);
        }
    }

    fn system_prompt(&self, described: &Value) -> String {
        let budget = self.budget();
        let context = match (described["type"].as_str(), described["length"].as_u64()) {
            (Some("NoneType") | None, _) => "no context was given (it is None)".to_owned(),
            (Some(kind), Some(length)) => format!("a {kind} of length {length}"),
            (Some(kind), None) => format!("a {kind}"),
        };
        let cost = match budget.max_cost() {
            Some(dollars) => format!("${dollars:.4}"),
            None => "no cost limit".to_owned(),
        };
        format!(
            "You are a recursive language model at depth {depth} (of at most {max_depth}), \
             working in a persistent Python REPL session. The task's context is in the variable \
             `context`: {context}. It is not in this prompt: read it with code, in slices. \
             Write code in ```repl blocks; each runs in the session and you see its output, \
             cut to {chars} characters, so keep large values in variables and print parts. In \
             code you can call llm_query(prompt) -> str to ask a language model a sub-question \
             (it sees only that prompt), llm_query_batched(prompts) -> list of str to ask many \
             at once, and rlm_query(task, ctx) -> str to hand a sub-task and its context to a \
             loop like this one, a level deeper. When you have the answer, call FINAL(answer) \
             or FINAL_VAR(variable_name) in code, or write FINAL(answer) on a line of its own \
             outside code. Budget of this loop: {iterations} replies and {cost}; calls beyond \
             it raise BudgetExceeded.",
            depth = budget.depth(),
            max_depth = budget.max_depth(),
            chars = self.bridge.nest.config.output_chars,
            iterations = budget.max_iterations(),
        )
    }

    /// One completion of the conversation so far, charged to the loop and counted.
    async fn ask(&self, progress: &Progress) -> Result<String, Stop> {
        let request = ChatRequest {
            model: self.bridge.nest.model.clone(),
            messages: (progress.messages.iter())
                .map(|m| ChatMessage::new(&m.role, m.content.clone()))
                .collect(),
        };
        let (client, counters) = &self.client;
        let mut cancelled = self.bridge.nest.cancelled.clone();
        let messages = request.messages.clone();
        let answer = tokio::select! {
            answer = client.complete(request) => answer,
            () = super::cancelled(&mut cancelled) => return Err(Stop::Cancelled),
        };
        counters.record("rlm", &answer);
        let done = answer.map_err(|err| Stop::Failed(err.to_string()))?;
        self.budget().charge(&done);
        self.budget().count_iteration();
        self.bridge.nest.recorder.record(&messages, &done);
        Ok(done.text)
    }

    /// What the model is shown of a run: its output, errors and value, cut to the limit.
    fn shown(&self, step: &StepExecution) -> String {
        let mut text = step.stdout.clone();
        if !step.stderr.is_empty() {
            text.push_str(&format!("[stderr]\n{}", step.stderr));
        }
        if let Some(error) = &step.error {
            text.push_str(&format!("[error]\n{error}"));
        }
        if let Some(value) = &step.result {
            text.push_str(&format!("[value] {value}"));
        }
        if text.trim().is_empty() {
            return "(no output)".to_owned();
        }
        let limit = self.bridge.nest.config.output_chars;
        let total = text.chars().count();
        if total <= limit {
            return text;
        }
        let mut cut: String = text.chars().take(limit).collect();
        cut.push_str(&format!(
            "\n[output truncated: the first {limit} of {total} characters are shown]"
        ));
        cut
    }

    /// The answer given to `FINAL` or `FINAL_VAR` in code since the last look, if any.
    async fn take_final(&self) -> Result<Option<String>, Stop> {
        let printed = self.helper(TAKE_FINAL, json!({})).await?;
        Ok(serde_json::from_str::<Option<String>>(printed.trim()).unwrap_or(None))
    }

    /// Runs one of the loop's own helpers with `args` and the session's globals as `ns`; what
    /// it printed.
    async fn helper(&self, source: &str, args: Value) -> Result<String, Stop> {
        let code = format!(
            "exec({}, {{'ns': globals(), **__import__('json').loads({})}})",
            serde_json::to_string(source).expect("a string serializes"),
            serde_json::to_string(&args.to_string()).expect("a string serializes"),
        );
        let run = run_code(self.session, &self.bridge.nest.cancelled, &code).await?;
        match run.status {
            ExecutionStatus::Ok => Ok(run.stdout),
            _ => Err(Stop::Failed(format!(
                "the loop's helper failed in the session: {}",
                StepExecution::from(&run).error.unwrap_or(run.stderr)
            ))),
        }
    }

    fn record(
        &self,
        progress: &mut Progress,
        role: &str,
        content: String,
        code: Option<String>,
        execution: Option<StepExecution>,
    ) {
        let message = TaskMessage {
            role: role.to_owned(),
            content,
            code,
            execution,
        };
        if let Some(steps) = &self.steps {
            let _ = steps.send(message.clone());
        }
        progress.messages.push(message);
    }
}

/// A session of its own for a loop whose LLM calls `bridge` answers, closed when the returned
/// guard drops unless `keep`.
pub(super) async fn loop_session(
    engine: &Engine,
    bridge: &TaskBridge,
    keep: bool,
) -> Result<super::TaskSession, EngineError> {
    let options = SessionOptions {
        owner: bridge.nest.owner.clone(),
        bridge: Some(pyvisor_actors::bridge::SessionBridge(Arc::new(
            bridge.clone(),
        ))),
        ..Default::default()
    };
    let session = engine.create_session(options).await?;
    Ok(super::TaskSession::new(session, !keep))
}

/// Runs a nested loop for `rlm_query(task, ctx)` in a session of its own, closed at the end.
pub(super) async fn run_nested(
    engine: &Engine,
    bridge: TaskBridge,
    task: String,
    context: Option<Value>,
) -> TaskOutcome {
    let failed = |error: String| TaskOutcome {
        task_id: bridge.nest.task_id.clone(),
        status: TaskStatus::Error,
        error: Some(error),
        ..TaskOutcome::empty()
    };
    let Some(client) = engine.llm_client() else {
        return failed("the engine has no [llm] endpoint".into());
    };
    let session = match loop_session(engine, &bridge, false).await {
        Ok(session) => session,
        Err(err) => return failed(err.to_string()),
    };
    let run = Rlm {
        session: &session,
        client,
        bridge: &bridge,
        prompt: &task,
        task_id: bridge.nest.task_id.clone(),
        steps: None,
    };
    let spec = match context {
        Some(value) => json!({ "value": value }),
        None => json!({}),
    };
    run.run(spec).await
}
