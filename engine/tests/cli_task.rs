//! `pyvisor task` through the real binary against a running daemon whose `[llm]` is a
//! loopback HTTP server answering the OpenAI chat completions API: the task runs on the
//! daemon (the command itself has no `[llm]`), its steps are shown, and `--save` writes the
//! outcome with its whole history.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

use common::{text, Daemon};
use serde_json::{json, Value};

/// The model's only reply: code that prints and ends the task.
const REPLY: &str = "```repl\nprint(6 * 7)\nFINAL(6 * 7)\n```";

/// A loopback chat completions endpoint that answers every request with [`REPLY`]; its base
/// URL.
fn model_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
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
    url
}

#[test]
fn pyvisor_task_runs_on_the_daemon_and_saves_its_history() {
    let url = model_server();
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
    let saved: Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(saved["status"], "done");
    assert_eq!(saved["answer"], "42");
    assert_eq!(saved["tokens"]["input_tokens"], 100);
    assert_eq!(saved["messages"].as_array().unwrap().len(), 3);
    // Without the daemon the command has no [llm] of its own.
    let output = common::run_embedded("task", &["x", "--kind", "rlm"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("[llm]"),
        "{}",
        text(&output.stderr)
    );
}
