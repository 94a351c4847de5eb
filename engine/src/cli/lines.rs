//! [`Lines`]: the REPL's line editor (rustyline) on a thread of its own, so that the async
//! REPL loop can wait for a line and for Ctrl-C at once. On a terminal it edits lines and
//! keeps history; reading from a pipe or file, rustyline reads plain lines and prompts are
//! not shown. Tab completes names from the session ([`super::completer`]).

use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;

use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{CompletionType, Config, Editor};
use tokio::sync::oneshot;

use super::completer::ReplHelper;

type LineEditor = Editor<ReplHelper, DefaultHistory>;

/// What one read got.
pub enum Read {
    Line(String),
    /// Ctrl-C on the line.
    Interrupted,
    /// Ctrl-D on an empty line, or the end of piped input.
    Eof,
}

struct Request {
    prompt: String,
    /// Add the line to the history (code lines, not answers to `input()`).
    remember: bool,
    reply: oneshot::Sender<Read>,
}

/// The line editor's thread. Dropping it lets the thread end after its current read.
pub struct Lines {
    requests: mpsc::Sender<Request>,
    interactive: bool,
}

impl Lines {
    /// Starts the editor, completing with `helper` on Tab; on a terminal it loads and appends
    /// to the history file.
    pub fn start(helper: ReplHelper) -> Result<Lines, ReadlineError> {
        let interactive = io::stdin().is_terminal();
        let config = Config::builder()
            .auto_add_history(false)
            .completion_type(CompletionType::List)
            .build();
        let mut editor = LineEditor::with_config(config)?;
        editor.set_helper(Some(helper));
        let history = interactive.then(history_path).flatten();
        if let Some(path) = &history {
            // A missing or unreadable history only means starting without one.
            let _ = editor.load_history(path);
        }
        let (requests, incoming) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("pyvisor-repl-lines".into())
            .spawn(move || {
                for request in incoming {
                    let read = read(&mut editor, &request.prompt);
                    if let (Read::Line(line), true) = (&read, request.remember) {
                        remember(&mut editor, line, history.as_ref());
                    }
                    // The asker may have stopped waiting (Ctrl-C); the line is then dropped.
                    let _ = request.reply.send(read);
                }
            })
            .map_err(ReadlineError::Io)?;
        Ok(Lines {
            requests,
            interactive,
        })
    }

    /// Whether input comes from a terminal.
    pub fn interactive(&self) -> bool {
        self.interactive
    }

    /// Reads one line, after `prompt` on a terminal; `remember` adds it to the history.
    pub async fn read(&self, prompt: &str, remember: bool) -> Read {
        let (reply, answer) = oneshot::channel();
        // Off a terminal rustyline shows prompts only for some `TERM`s; never is simpler.
        let prompt = if self.interactive { prompt } else { "" };
        let request = Request {
            prompt: prompt.to_owned(),
            remember,
            reply,
        };
        if self.requests.send(request).is_err() {
            return Read::Eof;
        }
        answer.await.unwrap_or(Read::Eof)
    }
}

fn read(editor: &mut LineEditor, prompt: &str) -> Read {
    match editor.readline(prompt) {
        Ok(line) => Read::Line(line),
        Err(ReadlineError::Interrupted) => Read::Interrupted,
        Err(ReadlineError::Eof) => Read::Eof,
        Err(err) => {
            eprintln!("pyvisor: failed to read a line: {err}");
            Read::Eof
        }
    }
}

fn remember(editor: &mut LineEditor, line: &str, history: Option<&PathBuf>) {
    if line.trim().is_empty() || editor.add_history_entry(line).is_err() {
        return;
    }
    if let Some(path) = history {
        // Appended line by line, so that a killed REPL keeps its history too.
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(err) = editor.append_history(path) {
            tracing::debug!(%err, path = %path.display(), "history not saved");
        }
    }
}

/// `$XDG_STATE_HOME/pyvisor/repl_history`, else `~/.local/state/pyvisor/repl_history`.
fn history_path() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    let state = var("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|home| PathBuf::from(home).join(".local/state")))?;
    Some(state.join("pyvisor").join("repl_history"))
}
