//! A fake LLM provider for the tests: a real HTTP server on a loopback port speaking the
//! OpenAI chat completions API (`POST /v1/chat/completions`), whose replies a test scripts
//! and whose token usage counts the words it was sent and answered.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// What the server answers to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A completion saying this.
    Text(String),
    /// An error status, with a `Retry-After` in seconds when set.
    Status {
        status: u16,
        retry_after: Option<f64>,
    },
    /// The reply, after a wait on the server's own thread (a slow provider).
    Delayed(Duration, Box<Reply>),
}

impl Reply {
    /// A completion saying `text`.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Text(text.into())
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Call {
    pub model: String,
    /// `(role, content)` of each message.
    pub messages: Vec<(String, String)>,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The whole request: line, headers and body.
    pub raw: String,
    pub arrived: Instant,
}

impl Call {
    /// The content of the last message.
    pub fn last(&self) -> &str {
        self.messages.last().map_or("", |(_, content)| content)
    }
}

type Handler = dyn Fn(&Call) -> Reply + Send + Sync;

/// What the server saw.
#[derive(Default)]
struct Seen {
    calls: Mutex<Vec<Call>>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

/// The fake provider; it serves until the test process ends.
pub struct FakeLlm {
    /// The API's base, for `[llm] base_url`.
    pub url: String,
    seen: Arc<Seen>,
}

impl FakeLlm {
    /// Starts a server that answers each request with `handler(call)`.
    pub fn start(handler: impl Fn(&Call) -> Reply + Send + Sync + 'static) -> FakeLlm {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let url = format!(
            "http://{}/v1",
            listener.local_addr().expect("a local address")
        );
        let seen = Arc::new(Seen::default());
        let handler: Arc<Handler> = Arc::new(handler);
        let shared = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, handler) = (shared.clone(), handler.clone());
                std::thread::spawn(move || serve_connection(stream, &seen, &*handler));
            }
        });
        FakeLlm { url, seen }
    }

    /// Starts a server that gives `replies` in order, then repeats the last.
    pub fn scripted(replies: Vec<Reply>) -> FakeLlm {
        let next = AtomicUsize::new(0);
        FakeLlm::start(move |_| {
            let index = next.fetch_add(1, Ordering::SeqCst).min(replies.len() - 1);
            replies[index].clone()
        })
    }

    /// Every request so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.seen.calls.lock().unwrap().clone()
    }

    /// The most requests that were being served at once.
    pub fn most_in_flight(&self) -> usize {
        self.seen.most_in_flight.load(Ordering::SeqCst)
    }
}

/// Words, as the fake's token count.
pub fn tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

fn serve_connection(stream: TcpStream, seen: &Seen, handler: &Handler) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone a TCP stream"));
    let mut writer = stream;
    loop {
        let mut raw = String::new();
        if reader.read_line(&mut raw).unwrap_or(0) == 0 {
            return;
        }
        let request_line = raw.clone();
        let (mut length, mut authorization) = (0, None);
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            raw.push_str(&header);
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                return;
            };
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "authorization" => authorization = Some(value.trim().to_owned()),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        raw.push_str(&String::from_utf8_lossy(&body));
        let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let answer = answer(&request_line, &body, authorization, raw, seen, handler);
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// The whole HTTP response to one request.
fn answer(
    request_line: &str,
    body: &[u8],
    authorization: Option<String>,
    raw: String,
    seen: &Seen,
    handler: &Handler,
) -> String {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if !request_line.starts_with("POST /v1/chat/completions ") || !request.is_object() {
        return response(404, None, &json!({"error": {"message": "not found"}}));
    }
    let messages: Vec<(String, String)> = (request["messages"].as_array().into_iter().flatten())
        .map(|m| {
            let field = |name: &str| m[name].as_str().unwrap_or_default().to_owned();
            (field("role"), field("content"))
        })
        .collect();
    let call = Call {
        model: request["model"].as_str().unwrap_or_default().to_owned(),
        messages,
        authorization,
        raw,
        arrived: Instant::now(),
    };
    seen.calls.lock().unwrap().push(call.clone());
    let mut reply = handler(&call);
    while let Reply::Delayed(wait, then) = reply {
        std::thread::sleep(wait);
        reply = *then;
    }
    match reply {
        Reply::Text(text) => {
            let input: u64 = call.messages.iter().map(|(_, c)| tokens(c)).sum();
            let output = tokens(&text);
            let body = json!({
                "id": "chatcmpl-fake", "object": "chat.completion", "model": call.model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": input, "completion_tokens": output,
                          "total_tokens": input + output},
            });
            response(200, None, &body)
        }
        Reply::Status {
            status,
            retry_after,
        } => response(
            status,
            retry_after,
            &json!({"error": {"message": format!("scripted {status}")}}),
        ),
        Reply::Delayed(..) => unreachable!("delays were waited for above"),
    }
}

fn response(status: u16, retry_after: Option<f64>, body: &Value) -> String {
    let body = body.to_string();
    let retry = retry_after.map_or(String::new(), |s| format!("retry-after: {s}\r\n"));
    format!(
        "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\n{retry}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}
