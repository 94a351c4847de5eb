//! `pyvisor task` through the real binary against a running daemon whose `[llm]` is a
//! loopback HTTP server answering the OpenAI chat completions API: the task runs on the
//! daemon (the command itself has no `[llm]`), its steps are shown, and `--save` writes the
//! outcome with its whole history; `--replay` runs it again offline, asking no endpoint, and
//! says when a replay diverges.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{text, Daemon};
use serde_json::{json, Value};

/// The model's only reply: code that prints and ends the task.
const REPLY: &str = "```repl\nprint(6 * 7)\nFINAL(6 * 7)\n```";

/// A loopback chat completions endpoint that answers every request with [`REPLY`]; its base
/// URL and the count of requests it got.
fn model_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counted = counted.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(value) = lower.strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                counted.fetch_add(1, Ordering::SeqCst);
                let answer = json!({
                    "choices": [{"message": {"role": "assistant", "content": REPLY}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 7},
                })
                .to_string();
                let mut stream = stream;
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            });
        }
    });
    (url, asked)
}

#[test]
fn pyvisor_task_runs_on_the_daemon_and_saves_its_history() {
    let (url, asked) = model_server();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = [
        ("PYVISOR_LLM__BASE_URL", url.as_str()),
        ("PYVISOR_LLM__MODEL", "fake-1"),
    ];
    let daemon = runtime.block_on(Daemon::start_with(&[], &env));
    let saved = daemon.home.join("run.json");
    let args = ["six times seven", "--kind", "rlm", "--save"];
    let mut args: Vec<&str> = args.to_vec();
    args.push(saved.to_str().unwrap());
    let output = common::run_in(&daemon, "task", &args, "");
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    assert!(
        stdout.contains("── task ──\nTask: six times seven"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("── model ──\n{REPLY}")),
        "{stdout}"
    );
    assert!(stdout.contains("── done after 1 model reply"), "{stdout}");
    assert!(stdout.contains("answer:\n42"), "{stdout}");
    let file = saved.clone();
    let mut saved: Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(saved["status"], "done");
    assert_eq!(saved["answer"], "42");
    assert_eq!(saved["tokens"]["input_tokens"], 100);
    assert_eq!(saved["messages"].as_array().unwrap().len(), 3);
    assert_eq!(saved["request"]["prompt"], "six times seven");
    assert_eq!(saved["llm_calls"][0]["answer"], REPLY);
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    // The replay runs the code again and asks no endpoint.
    let replay = ["--replay", file.to_str().unwrap()];
    let output = common::run_embedded("task", &replay, "");
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    assert!(stdout.contains("answer:\n42"), "{stdout}");
    assert!(
        stdout.contains("── replay: ended as recorded ──"),
        "{stdout}"
    );
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "no request during the replay"
    );
    // A recording that no longer matches the messages: the replay says it diverged.
    saved["llm_calls"][0]["key"] = json!("0".repeat(32));
    std::fs::write(&file, saved.to_string()).unwrap();
    let output = common::run_embedded("task", &replay, "");
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("the replay diverged at completion 1"),
        "{stdout}"
    );
    assert!(stdout.contains("ended otherwise than recorded"), "{stdout}");
    // Without the daemon the command has no [llm] of its own.
    let output = common::run_embedded("task", &["x", "--kind", "rlm"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("[llm]"),
        "{}",
        text(&output.stderr)
    );
}
