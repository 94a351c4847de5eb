//! `pyvisor task PROMPT [--data FILE]... [--kind transform|rlm] [--context FILE] [--model M]
//! [--max-cost D] [--max-iterations N] [--max-depth N] [--save run.json] [--socket PATH]
//! [--config PATH]`, or `pyvisor task --replay run.json`: runs an LLM task loop on the daemon when its socket answers (the steps
//! stream back as `task.step`), else in a session of an embedded engine configured as
//! `pyvisor serve` would be (its `[llm]` included), and shows each step as it happens: the
//! model's reply, the code, its output; then the answer and the final code.
//!
//! Exit status: 0 when the task is done, 1 when it ended otherwise (`max_iterations`,
//! `budget_exceeded`, `error`, `cancelled`), 2 on a usage or configuration error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, ValueEnum};
use pyvisor::config::Settings;
use pyvisor::llm::LlmClient;
use pyvisor::task::{
    Budget, ReplayClient, SavedTask, TaskContext, TaskKind, TaskMessage, TaskOutcome, TaskRequest,
    TaskStatus,
};
use pyvisor::{Engine, LlmConfig};
use tokio::sync::mpsc;

use super::backend::{connect_daemon, daemon_socket};
use super::EXIT_USAGE;

/// Arguments of `pyvisor task`.
#[derive(Debug, Args)]
pub struct TaskArgs {
    /// What the task should do.
    #[arg(value_name = "PROMPT", required_unless_present = "replay")]
    prompt: Option<String>,
    /// Data for the task: FILE (named after its stem) or NAME=FILE; repeatable.
    #[arg(long = "data", value_name = "[NAME=]FILE")]
    data: Vec<String>,
    /// The loop to run.
    #[arg(long, value_enum, default_value_t = Kind::Transform)]
    kind: Kind,
    /// A model name of the configuration; its default model when absent.
    #[arg(long)]
    model: Option<String>,
    /// Most dollars the task may spend.
    #[arg(long, value_name = "DOLLARS")]
    max_cost: Option<f64>,
    /// Most model replies.
    #[arg(long, value_name = "N")]
    max_iterations: Option<u32>,
    /// Most nesting of rlm_query loops (rlm).
    #[arg(long, value_name = "N")]
    max_depth: Option<u32>,
    /// A file the session loads as the variable `context` (rlm): JSON, CSV or text.
    #[arg(long, value_name = "FILE")]
    context: Option<PathBuf>,
    /// Write the task's request, outcome and whole history (every completion included) to
    /// this file as JSON.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    /// Run the task saved in FILE (by --save) again in an embedded engine, its code for real
    /// and its model answered from the recorded completions: no LLM endpoint is asked. Exits
    /// 0 when it ends as recorded (status, answer, final code).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["prompt", "data", "kind", "model", "max_cost", "max_iterations",
                              "max_depth", "context", "socket"]
    )]
    replay: Option<PathBuf>,
    /// The configuration file (else the usual search order).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The daemon's socket (else `$PYVISOR_SOCKET`, else the configured `server.socket` or
    /// the default); without a daemon there, the task runs in an embedded engine.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    Transform,
    Rlm,
}

/// Runs the task and returns the exit status.
pub async fn run(args: TaskArgs) -> u8 {
    if let Some(saved) = &args.replay {
        return replay(saved, &args).await;
    }
    let request = match request(&args) {
        Ok(request) => request,
        Err(message) => {
            eprintln!("pyvisor: {message}");
            return EXIT_USAGE;
        }
    };
    let settings = match Settings::load(args.config.as_deref()) {
        Ok(loaded) => loaded.settings,
        Err(err) => {
            eprintln!("pyvisor: {err}");
            return EXIT_USAGE;
        }
    };
    let socket = daemon_socket(&settings, args.socket.as_deref());
    let daemon = connect_daemon(&socket).await.ok();
    let outcome = match showing(|steps| async {
        match daemon {
            Some(client) => {
                (client.run_task(request.clone(), steps).await).map_err(|err| err.to_string())
            }
            None => embedded(settings, request.clone(), steps, None).await,
        }
    })
    .await
    {
        Ok(outcome) => outcome,
        Err(status) => return status,
    };
    if let Some(path) = &args.save {
        let saved = SavedTask { request, outcome };
        let json = serde_json::to_vec_pretty(&saved).expect("a task serializes");
        if let Err(err) = std::fs::write(path, json) {
            eprintln!("pyvisor: write {}: {err}", path.display());
            return 1;
        }
        return u8::from(saved.outcome.status != TaskStatus::Done);
    }
    u8::from(outcome.status != TaskStatus::Done)
}

/// Runs the task saved in `path` again against its recorded completions; 0 when it ends as
/// recorded.
async fn replay(path: &Path, args: &TaskArgs) -> u8 {
    let saved: SavedTask = match std::fs::read(path)
        .map_err(|err| err.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|err| err.to_string()))
    {
        Ok(saved) => saved,
        Err(err) => {
            eprintln!("pyvisor: read the saved task {}: {err}", path.display());
            return EXIT_USAGE;
        }
    };
    let settings = match Settings::load(args.config.as_deref()) {
        Ok(loaded) => loaded.settings,
        Err(err) => {
            eprintln!("pyvisor: {err}");
            return EXIT_USAGE;
        }
    };
    let mut request = saved.request.clone();
    request.task_id = None;
    request.keep_session = false;
    let client = Arc::new(ReplayClient::new(saved.outcome.llm_calls.clone()));
    let outcome = match showing(|steps| embedded(settings, request, steps, Some(client))).await {
        Ok(outcome) => outcome,
        Err(status) => return status,
    };
    let recorded = &saved.outcome;
    let same = outcome.status == recorded.status
        && outcome.answer == recorded.answer
        && outcome.final_code == recorded.final_code;
    match same {
        true => println!("── replay: ended as recorded ──"),
        false => {
            let status =
                |outcome: &TaskOutcome| serde_json::to_value(outcome.status).unwrap_or_default();
            println!(
                "── replay: ended otherwise than recorded (status {} then, {} now) ──",
                status(recorded),
                status(&outcome)
            );
        }
    }
    u8::from(!same)
}

/// Runs a task with `run`, showing each step it sends as it comes, then how it ended; the
/// exit status after saying why when it could not run.
async fn showing<F, R>(run: F) -> Result<TaskOutcome, u8>
where
    F: FnOnce(mpsc::UnboundedSender<TaskMessage>) -> R,
    R: std::future::Future<Output = Result<TaskOutcome, String>>,
{
    let (steps, mut stepped) = mpsc::unbounded_channel();
    let shown = tokio::spawn(async move {
        while let Some(message) = stepped.recv().await {
            show(&message);
        }
    });
    let outcome = run(steps).await;
    let _ = shown.await;
    match outcome {
        Ok(outcome) => {
            finish(&outcome);
            Ok(outcome)
        }
        Err(message) => {
            eprintln!("pyvisor: {message}");
            Err(EXIT_USAGE)
        }
    }
}

/// Runs the task in an engine of this process configured as `pyvisor serve` would be; with a
/// `client`, that answers its LLM calls under the `[llm]` settings (or their defaults).
async fn embedded(
    settings: Settings,
    request: TaskRequest,
    steps: mpsc::UnboundedSender<TaskMessage>,
    client: Option<Arc<dyn LlmClient>>,
) -> Result<TaskOutcome, String> {
    let mut config = settings.engine_config();
    config.pool.min_idle = 1;
    if client.is_some() && config.llm.is_none() {
        config.llm = Some(LlmConfig::new("", "replay"));
    }
    // The worker reads the data files: a confined one must be allowed to.
    let context = match &request.context {
        Some(TaskContext::File { path }) => Some(path),
        _ => None,
    };
    for file in request.data.values().chain(context) {
        if let Some(dir) = Path::new(file).parent() {
            config.sandbox.read_paths.push(dir.to_owned());
        }
    }
    let engine = (Engine::start_with_llm(config, client).await).map_err(|err| err.to_string())?;
    let outcome = engine.run_task(request, None, Some(steps)).await;
    outcome.map_err(|err| err.to_string())
}

/// The request the arguments describe; data files are made absolute, for the worker.
fn request(args: &TaskArgs) -> Result<TaskRequest, String> {
    let mut data = BTreeMap::new();
    for item in &args.data {
        let (name, file) = match item.split_once('=') {
            Some((name, file)) => (name.to_owned(), file),
            None => (stem_name(Path::new(item)), item.as_str()),
        };
        let file = std::path::absolute(file).map_err(|err| format!("--data {item}: {err}"))?;
        if !file.is_file() {
            return Err(format!("--data {item}: {} is not a file", file.display()));
        }
        data.insert(name, file.to_string_lossy().into_owned());
    }
    let context = match &args.context {
        Some(file) => {
            let path = std::path::absolute(file)
                .map_err(|err| format!("--context {}: {err}", file.display()))?;
            if !path.is_file() {
                return Err(format!("--context {}: not a file", path.display()));
            }
            Some(TaskContext::File {
                path: path.to_string_lossy().into_owned(),
            })
        }
        None => None,
    };
    Ok(TaskRequest {
        kind: match args.kind {
            Kind::Transform => TaskKind::Transform,
            Kind::Rlm => TaskKind::Rlm,
        },
        prompt: args.prompt.clone().unwrap_or_default(),
        data,
        model: args.model.clone(),
        budget: Budget {
            max_cost: args.max_cost,
            max_iterations: args.max_iterations,
            max_depth: args.max_depth,
        },
        context,
        session_id: None,
        task_id: None,
        keep_session: false,
    })
}

/// A Python name from a file's stem: `sales-2024.csv` → `sales_2024`.
fn stem_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy())
        .unwrap_or_default();
    let mut name: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Prints one step: the model's replies and the runs of their code; the system prompt and
/// the engine's messages to the model are not repeated.
fn show(message: &TaskMessage) {
    match (message.role.as_str(), &message.execution) {
        ("assistant", _) => {
            println!("── model ──\n{}", message.content.trim_end());
        }
        (_, Some(run)) => {
            println!("── run: {} ──", run.status.as_str());
            for text in [&run.stdout, &run.stderr] {
                if !text.is_empty() {
                    print!("{text}");
                    if !text.ends_with('\n') {
                        println!();
                    }
                }
            }
            if let Some(error) = &run.error {
                println!("{}", error.trim_end());
            }
        }
        ("user", None)
            if message.content.starts_with("Request:") || message.content.starts_with("Task:") =>
        {
            println!("── task ──\n{}", message.content.trim_end());
        }
        _ => {}
    }
}

/// Prints how the task ended and its final code.
fn finish(outcome: &TaskOutcome) {
    let status = serde_json::to_value(outcome.status).unwrap_or_default();
    println!(
        "── {} after {} model repl{} (${:.4}, {} tokens in, {} out) in session {} ──",
        status.as_str().unwrap_or_default(),
        outcome.iterations,
        if outcome.iterations == 1 { "y" } else { "ies" },
        outcome.cost,
        outcome.tokens.input_tokens,
        outcome.tokens.output_tokens,
        outcome.session_id,
    );
    if let Some(error) = &outcome.error {
        println!("error: {error}");
    }
    if let Some(answer) = &outcome.answer {
        println!("answer:\n{answer}");
    }
    if let Some(code) = &outcome.final_code {
        println!("final code:\n{code}");
    }
    if let Some(result) = &outcome.result {
        println!("{result}");
    }
}
