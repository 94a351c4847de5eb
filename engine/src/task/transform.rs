//! The deterministic transform loop: the request and a preview of the data go to the model;
//! the last fenced code block of its reply runs in the session; an error goes back with its
//! traceback, a success with a preview of `result` and the question whether it is right, which
//! the model answers `DONE` or with fixed code. A reply without a code block is answered with a
//! request for one. The loop never goes past its iteration cap (5 by default) or its budget.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::record::Recorder;
use super::reply::{last_code_block, says_done};
use super::{cancelled, run_code, Stop};
use super::{StepExecution, TaskMessage, TaskOutcome, TaskRequest, TaskStatus};
use crate::llm::{ChatMessage, ChatRequest, LlmClient, LlmCounters, Usage};
use crate::{ExecutionResult, ExecutionStatus, Session};

/// Model replies of a transform that states no `max_iterations`.
const DEFAULT_ITERATIONS: u32 = 5;

/// Python that previews the names listed in `names` (set before it runs) as JSON on stdout:
/// `{"text": ..., "frames": bool}` where `frames` says whether every one is a DataFrame. It
/// runs in a dictionary of its own, so it leaves nothing in the session's namespace.
const PREVIEW: &str = r#"
def _preview(ns, names):
    import json
    try:
        import pandas as pd
        frame_type = pd.DataFrame
    except ImportError:
        frame_type = ()
    parts, frames = [], True
    for name in names:
        if name not in ns:
            parts.append("%s: not defined" % name)
            frames = False
            continue
        value = ns[name]
        if frame_type and isinstance(value, frame_type):
            columns = "\n".join("  %s: %s" % (c, t) for c, t in value.dtypes.items())
            parts.append("%s: DataFrame, shape %s\ncolumns:\n%s\nhead():\n%s"
                         % (name, value.shape, columns, value.head().to_string()))
        else:
            frames = False
            parts.append("%s: %s = %s" % (name, type(value).__name__, repr(value)[:2000]))
    print(json.dumps({"text": "\n\n".join(parts), "frames": frames}))
_preview(ns, names)
"#;

const SYSTEM_PROMPT: &str = "You write Python code with pandas. It runs in a persistent \
session where the user's data is already loaded as the DataFrames listed below: use them by \
name, and do not read files. Reply with exactly one fenced ```python code block, whose code \
assigns its answer to a variable named `result`. After each run you are shown the error, or \
a preview of `result`. If the result is what was asked, reply DONE alone; otherwise reply \
with corrected code in one block.";

/// One run of the loop.
pub(super) struct Transform<'a> {
    pub session: &'a Session,
    pub client: (Arc<dyn LlmClient>, Arc<LlmCounters>),
    pub request: &'a TaskRequest,
    pub task_id: String,
    pub steps: Option<mpsc::UnboundedSender<TaskMessage>>,
    pub cancelled: watch::Receiver<bool>,
    /// Where the task's completions are kept.
    pub recorder: Recorder,
}

/// The loop's state as it goes.
struct Progress {
    messages: Vec<TaskMessage>,
    iterations: u32,
    cost: f64,
    tokens: Usage,
    /// The last code whose `result` was valid, and its preview.
    success: Option<(String, String)>,
}

impl Transform<'_> {
    pub(super) async fn run(mut self) -> TaskOutcome {
        let mut progress = Progress {
            messages: Vec::new(),
            iterations: 0,
            cost: 0.0,
            tokens: Usage::default(),
            success: None,
        };
        let (status, error) = match self.drive(&mut progress).await {
            Ok(status) => (status, None),
            Err(Stop::Cancelled) => (TaskStatus::Cancelled, None),
            Err(Stop::Failed(reason)) => (TaskStatus::Error, Some(reason)),
        };
        let (final_code, result) = progress.success.unzip();
        TaskOutcome {
            task_id: self.task_id,
            status,
            answer: None,
            final_code,
            result,
            iterations: progress.iterations,
            cost: progress.cost,
            tokens: progress.tokens,
            messages: progress.messages,
            session_id: self.session.id().to_owned(),
            error,
            llm_calls: Vec::new(),
        }
    }

    async fn drive(&mut self, progress: &mut Progress) -> Result<TaskStatus, Stop> {
        let names: Vec<String> = self.request.data.keys().cloned().collect();
        let load = load_code(&self.request.data)?;
        if !load.is_empty() {
            let run = self.execute(&load).await?;
            if run.status != ExecutionStatus::Ok {
                let why = StepExecution::from(&run).error.unwrap_or_default();
                return Err(Stop::Failed(format!("loading the data failed: {why}")));
            }
        }
        let preview = match names.is_empty() {
            true => "(no data was given)".to_owned(),
            false => self.preview(&names).await?.0,
        };
        self.say(progress, "system", SYSTEM_PROMPT.to_owned(), None);
        let request = format!("Request: {}\n\nData:\n{preview}", self.request.prompt);
        self.say(progress, "user", request, None);
        let cap = (self.request.budget.max_iterations).unwrap_or(DEFAULT_ITERATIONS);
        while progress.iterations < cap {
            if let Some(limit) = self.request.budget.max_cost {
                if progress.cost >= limit {
                    return Ok(TaskStatus::BudgetExceeded);
                }
            }
            let reply = self.ask(progress).await?;
            let code = last_code_block(&reply);
            self.say(progress, "assistant", reply.clone(), code.clone());
            if says_done(&reply) {
                if progress.success.is_some() {
                    return Ok(TaskStatus::Done);
                }
                let nudge = "Nothing has run successfully yet. Reply with one ```python block \
                             that assigns `result`.";
                self.say(progress, "user", nudge.to_owned(), None);
                continue;
            }
            let Some(code) = code else {
                let nudge = "Your reply has no code block. Reply with exactly one ```python \
                             block that assigns `result`.";
                self.say(progress, "user", nudge.to_owned(), None);
                continue;
            };
            self.try_code(progress, code, !names.is_empty()).await?;
        }
        let over_budget =
            (self.request.budget.max_cost).is_some_and(|limit| progress.cost >= limit);
        Ok(match over_budget {
            true => TaskStatus::BudgetExceeded,
            false => TaskStatus::MaxIterations,
        })
    }

    /// Runs a reply's code and tells the model how it went.
    async fn try_code(
        &mut self,
        progress: &mut Progress,
        code: String,
        frames_wanted: bool,
    ) -> Result<(), Stop> {
        let run = self.execute(&code).await?;
        let step = StepExecution::from(&run);
        if run.status != ExecutionStatus::Ok {
            let error = step.error.clone().unwrap_or_default();
            let feedback = format!(
                "The code failed ({}):\n{error}\nFix the code and reply with one ```python block.",
                run.status.as_str()
            );
            self.tell(progress, feedback, step);
            return Ok(());
        }
        let (preview, frames) = self.preview(&["result".to_owned()]).await?;
        let feedback = if frames || !frames_wanted && !preview.ends_with(": not defined") {
            progress.success = Some((code, preview.clone()));
            format!(
                "The code ran. Preview of `result`:\n{preview}\nIf this is what was asked, reply \
                 DONE alone; otherwise reply with corrected code in one block."
            )
        } else {
            format!(
                "The code ran, but `result` is not a DataFrame:\n{preview}\nA DataFrame was asked \
                 for: fix the code so that `result` is one, in one ```python block."
            )
        };
        self.tell(progress, feedback, step);
        Ok(())
    }

    /// One completion of the conversation so far, accounted in the task and the engine.
    async fn ask(&mut self, progress: &mut Progress) -> Result<String, Stop> {
        let request = ChatRequest {
            model: self.request.model.clone(),
            messages: (progress.messages.iter())
                .map(|m| ChatMessage::new(&m.role, m.content.clone()))
                .collect(),
        };
        let (client, counters) = &self.client;
        let messages = request.messages.clone();
        let answer = tokio::select! {
            answer = client.complete(request) => answer,
            () = cancelled(&mut self.cancelled) => return Err(Stop::Cancelled),
        };
        counters.record("transform", &answer);
        let done = answer.map_err(|err| Stop::Failed(err.to_string()))?;
        self.recorder.record(&messages, &done);
        progress.iterations += 1;
        progress.cost += done.cost;
        progress.tokens += done.usage;
        Ok(done.text)
    }

    /// Runs `code` in the session; a cancel interrupts it.
    async fn execute(&mut self, code: &str) -> Result<ExecutionResult, Stop> {
        run_code(self.session, &self.cancelled, code).await
    }

    /// A preview of `names` in the session, and whether all of them are DataFrames.
    async fn preview(&mut self, names: &[String]) -> Result<(String, bool), Stop> {
        let names = serde_json::to_string(names).expect("names serialize");
        let code = format!(
            "exec({}, {{'ns': globals(), 'names': {names}}})",
            serde_json::to_string(PREVIEW).expect("a string serializes")
        );
        let run = self.execute(&code).await?;
        #[derive(serde::Deserialize)]
        struct Preview {
            text: String,
            frames: bool,
        }
        match serde_json::from_str::<Preview>(run.stdout.trim()) {
            Ok(preview) if run.status == ExecutionStatus::Ok => Ok((preview.text, preview.frames)),
            _ => Err(Stop::Failed(format!(
                "the preview of the data failed: {}",
                StepExecution::from(&run).error.unwrap_or(run.stdout)
            ))),
        }
    }

    /// Adds a message to the history and streams it.
    fn say(&self, progress: &mut Progress, role: &str, content: String, code: Option<String>) {
        self.record(
            progress,
            TaskMessage {
                role: role.to_owned(),
                content,
                code,
                execution: None,
            },
        );
    }

    /// Tells the model how its code ran.
    fn tell(&self, progress: &mut Progress, content: String, execution: StepExecution) {
        let message = TaskMessage {
            role: "user".to_owned(),
            content,
            code: None,
            execution: Some(execution),
        };
        self.record(progress, message);
    }

    fn record(&self, progress: &mut Progress, message: TaskMessage) {
        if let Some(steps) = &self.steps {
            let _ = steps.send(message.clone());
        }
        progress.messages.push(message);
    }
}

/// The code that loads the request's data into the session: each file read with pandas, each
/// session variable bound to its name.
pub(super) fn load_code(data: &BTreeMap<String, String>) -> Result<String, Stop> {
    let mut code = String::new();
    for (name, source) in data {
        if !is_identifier(name) {
            return Err(Stop::Failed(format!("data: {name:?} is not a Python name")));
        }
        let quoted = serde_json::to_string(source).expect("a string serializes");
        let extension = std::path::Path::new(source)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let reader = match extension.as_deref() {
            Some("csv") => format!("pd.read_csv({quoted})"),
            Some("tsv") => format!("pd.read_csv({quoted}, sep='\\t')"),
            Some("json") => format!("pd.read_json({quoted})"),
            Some("jsonl") => format!("pd.read_json({quoted}, lines=True)"),
            Some("parquet") => format!("pd.read_parquet({quoted})"),
            Some("feather") => format!("pd.read_feather({quoted})"),
            Some("xlsx") => format!("pd.read_excel({quoted})"),
            _ if is_identifier(source) => source.clone(),
            _ => {
                return Err(Stop::Failed(format!(
                    "data: {name}: {source:?} is neither a file pandas reads (.csv, .tsv, .json, \
                     .jsonl, .parquet, .feather, .xlsx) nor a session variable"
                )))
            }
        };
        code.push_str(&format!("{name} = {reader}\n"));
    }
    if code.contains("pd.read_") {
        code.insert_str(0, "import pandas as pd\n");
    }
    Ok(code)
}

/// Whether `name` is a plain Python identifier (ASCII) and not a keyword.
fn is_identifier(name: &str) -> bool {
    const KEYWORDS: [&str; 35] = [
        "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
        "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
        "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
        "try", "while", "with", "yield",
    ];
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&name)
}
