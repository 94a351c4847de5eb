//! `[memory.embedder]`: memory's similarity from an OpenAI-compatible embeddings endpoint, a
//! real HTTP server on loopback that embeds by hashed tokens. A repeated failure is
//! recognised through it, the key comes from the engine's environment, an endpoint that
//! fails never fails an execution, and one that is down at start leaves the local embedder.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pyvisor::{
    Engine, EngineConfig, ExecutionStatus, MemoryConfig, RemoteEmbedderConfig, SessionOptions,
};
use pyvisor_tests::{engine_with, manual_checkpoints, run};
use serde_json::{json, Value};

const DIMS: usize = 64;
const SETUP: &str = "import pandas as pd\ndf = pd.DataFrame({'a': [1.0, None, 3.0]})";
const FAILING: [&str; 3] = [
    "df = df.fillna(method='ffill')",
    "frame = df.fillna(method='ffill')",
    "out = df.fillna(method='ffill')",
];

/// What the fake endpoint saw, and a switch that makes it answer 500.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    texts: AtomicUsize,
    authorization: Mutex<Vec<String>>,
    models: Mutex<Vec<String>>,
    failing: AtomicBool,
}

/// Serves `POST /v1/embeddings` on a loopback port: each input's vector counts its hashed
/// word tokens, so code that shares most words is close.
fn embeddings_server() -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Seen::default());
    let shared = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let seen = shared.clone();
            std::thread::spawn(move || serve_connection(stream, &seen));
        }
    });
    (url, seen)
}

fn serve_connection(stream: TcpStream, seen: &Seen) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let (mut length, mut authorization) = (0, String::new());
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap(),
                "authorization" => authorization = value.trim().to_owned(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        assert!(
            request_line.starts_with("POST /v1/embeddings "),
            "{request_line}"
        );
        seen.requests.fetch_add(1, Ordering::SeqCst);
        seen.authorization.lock().unwrap().push(authorization);
        let (status, answer) = if seen.failing.load(Ordering::SeqCst) {
            (
                "500 Internal Server Error",
                json!({"error": {"message": "down"}}),
            )
        } else {
            let request: Value = serde_json::from_slice(&body).unwrap();
            seen.models
                .lock()
                .unwrap()
                .push(request["model"].as_str().unwrap().to_owned());
            let inputs = request["input"].as_array().unwrap();
            seen.texts.fetch_add(inputs.len(), Ordering::SeqCst);
            // Answered in reverse order: the client must go by `index`.
            let data: Vec<Value> = inputs
                .iter()
                .enumerate()
                .rev()
                .map(|(index, text)| {
                    json!({"object": "embedding", "index": index,
                           "embedding": embed(text.as_str().unwrap())})
                })
                .collect();
            let answer = json!({"object": "list", "data": data, "model": request["model"],
                                "usage": {"prompt_tokens": 1, "total_tokens": 1}});
            ("200 OK", answer)
        };
        let body = answer.to_string();
        write!(
            writer,
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
    }
}

fn embed(text: &str) -> Vec<f32> {
    let mut vector = vec![0f32; DIMS];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let slot = word
            .bytes()
            .fold(7usize, |h, b| h.wrapping_mul(31) + b as usize)
            % DIMS;
        vector[slot] += 1.0;
    }
    vector
}

fn config(url: String, key_env: Option<&str>) -> EngineConfig {
    EngineConfig {
        memory: MemoryConfig {
            // Three of four words shared count as the same code for this crude embedding.
            threshold: 0.7,
            embedder: Some(RemoteEmbedderConfig {
                base_url: url,
                model: "fake-embed".into(),
                api_key_env: key_env.map(str::to_owned),
                dimensions: None,
                timeout: std::time::Duration::from_secs(5),
            }),
            ..MemoryConfig::default()
        },
        state: manual_checkpoints(),
        ..EngineConfig::default()
    }
}

async fn fail_twice_then_repeat(engine: &Engine) -> pyvisor::ExecutionResult {
    for failing in &FAILING[..2] {
        let session = engine
            .create_session(SessionOptions::default())
            .await
            .unwrap();
        run(&session, SETUP).await;
        assert_eq!(run(&session, failing).await.status, ExecutionStatus::Error);
        run(&session, "df = df.ffill()").await;
    }
    let session = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    run(&session, SETUP).await;
    run(&session, FAILING[2]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_failure_is_recognised_through_the_endpoint_with_the_engines_key() {
    let (url, seen) = embeddings_server();
    std::env::set_var("PYVISOR_TEST_EMBED_KEY", "sk-test-123");
    let engine = engine_with(config(url, Some("PYVISOR_TEST_EMBED_KEY"))).await;
    let stats = engine.memory_stats(None);
    assert_eq!(stats.embedder, format!("openai:fake-embed:{DIMS}"));

    let repeat = fail_twice_then_repeat(&engine).await;
    assert_eq!(repeat.status, ExecutionStatus::Error);
    assert_eq!(repeat.insights.len(), 1, "{repeat:?}");
    assert!(repeat.insights[0]
        .suggestion
        .as_deref()
        .unwrap_or_default()
        .contains("df.ffill()"));
    assert!(seen.requests.load(Ordering::SeqCst) >= 2);
    assert!(seen
        .authorization
        .lock()
        .unwrap()
        .iter()
        .all(|header| header == "Bearer sk-test-123"));
    assert!(seen
        .models
        .lock()
        .unwrap()
        .iter()
        .all(|model| model == "fake-embed"));
    // The key is the engine's: session code never sees it.
    let session = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    let leaked = run(
        &session,
        "import os\nsorted(v for v in os.environ.values() if 'sk-test' in v)",
    )
    .await;
    assert_eq!(leaked.result.unwrap().repr, "[]");
    assert_eq!(engine.memory_stats(None).embedder_errors, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_that_fails_never_fails_an_execution() {
    let (url, seen) = embeddings_server();
    let engine = engine_with(config(url, None)).await;
    assert!(
        seen.authorization.lock().unwrap()[0].is_empty(),
        "no key, no header"
    );
    seen.failing.store(true, Ordering::SeqCst);
    let repeat = fail_twice_then_repeat(&engine).await;
    assert_eq!(repeat.status, ExecutionStatus::Error, "{repeat:?}");
    assert!(
        repeat.insights.is_empty(),
        "unembedded code matches nothing"
    );
    let session = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    assert_eq!(run(&session, "1 + 1").await.result.unwrap().repr, "2");
    assert!(engine.memory_stats(None).embedder_errors > 0);

    // Once it answers again, new failures are embedded and matched.
    seen.failing.store(false, Ordering::SeqCst);
    let repeat = fail_twice_then_repeat(&engine).await;
    assert_eq!(repeat.insights.len(), 1, "{repeat:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_down_at_start_leaves_the_local_embedder_and_a_missing_key_is_an_error() {
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let engine = engine_with(config(url.clone(), None)).await;
    assert_eq!(engine.memory_stats(None).embedder, "local-hash-v2");
    let repeat = fail_twice_then_repeat(&engine).await;
    assert_eq!(repeat.status, ExecutionStatus::Error);
    drop(engine);

    let Err(err) = Engine::start(config(url, Some("PYVISOR_TEST_UNSET_KEY"))).await else {
        panic!("a key variable that is not set stops the start");
    };
    assert!(
        err.to_string().contains("PYVISOR_TEST_UNSET_KEY"),
        "the error names the variable: {err}"
    );
}
