//! The LLM bridge's overhead per `llm_query` round trip, for the README: the same completion
//! asked by session code through the bridge (frame to the host, the session actor, the
//! dispatcher's thread, the HTTP request, and back) and asked directly by the engine's own
//! HTTP client, against a real HTTP server on loopback speaking the OpenAI chat completions
//! API that answers at once. The difference of the medians is what the bridge adds.
//!
//! Run: `cargo bench -p pyvisor-tests --bench llm_bridge` (set `PYVISOR_BENCH_QUICK=1` for a
//! short run).

use std::time::{Duration, Instant};

use pyvisor::llm::{ChatMessage, ChatRequest, LlmClient, OpenAiClient};
use pyvisor::{Engine, EngineConfig, ExecutionStatus, LlmConfig, SessionOptions};
use pyvisor_tests::fake_llm::{FakeLlm, Reply};

/// The `q` quantile of `samples`, sorted in place.
fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) -> f64 {
    let p50 = quantile(&mut samples, 0.5).as_secs_f64() * 1e6;
    let p99 = quantile(&mut samples, 0.99).as_secs_f64() * 1e6;
    println!(
        "{name:<58} p50 {p50:>9.1} µs   p99 {p99:>9.1} µs   (n = {})",
        samples.len()
    );
    p50
}

/// `n` completions asked directly with the engine's HTTP client.
async fn direct(config: &LlmConfig, n: usize) -> Vec<Duration> {
    let client = OpenAiClient::new(config).expect("a client");
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let request = ChatRequest {
            model: None,
            messages: vec![ChatMessage::new("user", "ping")],
        };
        let started = Instant::now();
        client.complete(request).await.expect("a completion");
        samples.push(started.elapsed());
    }
    samples
}

/// `n` `llm_query` calls from session code, each timed in Python.
async fn bridged(config: LlmConfig, n: usize) -> Vec<Duration> {
    let engine = Engine::start(EngineConfig {
        llm: Some(config),
        ..EngineConfig::default()
    })
    .await
    .expect("engine starts");
    let options = SessionOptions {
        llm: Some(true),
        ..SessionOptions::default()
    };
    let session = engine.create_session(options).await.expect("a session");
    let code = format!(
        "import time, json\nllm_query('warm up')\nsamples = []\nfor _ in range({n}):\n    \
         started = time.perf_counter()\n    llm_query('ping')\n    \
         samples.append(time.perf_counter() - started)\nprint(json.dumps(samples))"
    );
    let result = session.run(code.as_str()).await.expect("the run");
    assert_eq!(result.status, ExecutionStatus::Ok, "{result:?}");
    let seconds: Vec<f64> = serde_json::from_str(result.stdout.trim()).expect("samples");
    seconds.into_iter().map(Duration::from_secs_f64).collect()
}

#[tokio::main]
async fn main() {
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let n = if quick { 50 } else { 500 };
    let server = FakeLlm::start(|_| Reply::text("pong"));
    let mut config = LlmConfig::new(&server.url, "fake-1");
    config.batch_window = Duration::ZERO;
    let base = report(
        "direct completion (the server's latency)",
        direct(&config, n).await,
    );
    let through = report(
        "llm_query round trip, batch_window_ms = 0",
        bridged(config.clone(), n).await,
    );
    println!(
        "{:<58} {:>13.1} µs",
        "bridge overhead per llm_query (p50 difference)",
        through - base
    );
    config.batch_window = Duration::from_millis(10);
    report(
        "llm_query round trip, batch_window_ms = 10 (default)",
        bridged(config, n / 10).await,
    );
}
