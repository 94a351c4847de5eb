//! The `pyvisor_llm_*` metrics of docs/metrics.md, recorded for an RLM task whose code calls
//! `llm_query` and `llm_query_batched`, against a real HTTP server on loopback speaking the
//! OpenAI chat completions API; and `engine.stats` `llm` agreeing with them.
//!
//! One test in its own binary: the recorder is process-wide.

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use pyvisor::task::{Budget, TaskKind, TaskRequest, TaskStatus};
use pyvisor::{EngineConfig, LlmConfig, Price};
use pyvisor_tests::fake_llm::{FakeLlm, Reply};
use pyvisor_tests::{engine_with, within};

#[tokio::test]
async fn an_rlm_task_records_calls_tokens_cost_and_durations_by_model_and_kind() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("no other recorder in this test binary");
    let server = FakeLlm::start(|call| {
        let replies = call.messages.iter().filter(|(role, _)| role == "assistant");
        match (call.messages.len(), replies.count()) {
            (1, _) => Reply::text("sub answer"),
            (_, 0) => {
                Reply::text("```repl\nllm_query('one')\nllm_query_batched(['two', 'three'])\n```")
            }
            _ => Reply::text("FINAL(ok)"),
        }
    });
    let mut llm = LlmConfig::new(&server.url, "fake-1");
    llm.prices.insert(
        "fake-1".into(),
        Price {
            input_per_mtok: 1_000.0,
            output_per_mtok: 2_000.0,
        },
    );
    let mut config = EngineConfig::default();
    config.pool.min_idle = 1;
    config.llm = Some(llm);
    let engine = engine_with(config).await;
    let request = TaskRequest {
        kind: TaskKind::Rlm,
        prompt: "q".into(),
        data: Default::default(),
        context: None,
        model: None,
        budget: Budget::default(),
        session_id: None,
        task_id: None,
        keep_session: false,
    };
    let outcome = within(engine.run_task(request, None, None)).await.unwrap();
    assert_eq!(outcome.status, TaskStatus::Done, "{outcome:#?}");

    let snapshot = snapshotter.snapshot().into_vec();
    let labelled = |name: &str, label: (&str, &str)| {
        snapshot
            .iter()
            .filter(move |(key, ..)| key.key().name() == name)
            .filter(move |(key, ..)| {
                (key.key().labels()).any(|l| l.key() == label.0 && l.value() == label.1)
            })
            .map(|(.., value)| value)
            .collect::<Vec<_>>()
    };
    let counter = |name: &str, label: (&str, &str)| -> u64 {
        (labelled(name, label).iter())
            .map(|value| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    };
    assert_eq!(counter("pyvisor_llm_calls_total", ("kind", "rlm")), 2);
    assert_eq!(counter("pyvisor_llm_calls_total", ("kind", "llm")), 1);
    assert_eq!(
        counter("pyvisor_llm_calls_total", ("kind", "llm_batched")),
        2
    );
    assert_eq!(counter("pyvisor_llm_calls_total", ("model", "fake-1")), 5);
    let input = counter("pyvisor_llm_tokens_total", ("direction", "input"));
    let output = counter("pyvisor_llm_tokens_total", ("direction", "output"));
    assert_eq!(input, outcome.tokens.input_tokens);
    assert_eq!(output, outcome.tokens.output_tokens);
    let cost = match labelled("pyvisor_llm_cost_dollars_total", ("model", "fake-1")).as_slice() {
        [DebugValue::Gauge(dollars)] => dollars.into_inner(),
        other => panic!("the cost gauge: {other:?}"),
    };
    assert!(
        (cost - outcome.cost).abs() < 1e-9,
        "{cost} vs {}",
        outcome.cost
    );
    let expected = (input as f64 * 1_000.0 + output as f64 * 2_000.0) / 1e6;
    assert!((cost - expected).abs() < 1e-9, "{cost} vs {expected}");
    let durations = snapshot
        .iter()
        .find(|(key, ..)| key.key().name() == "pyvisor_llm_call_seconds")
        .map(|(.., value)| match value {
            DebugValue::Histogram(samples) => samples.len(),
            other => panic!("not a histogram: {other:?}"),
        });
    assert_eq!(durations, Some(5));
    let stats = engine.stats().await.unwrap().llm.unwrap();
    assert_eq!((stats.calls, stats.input_tokens), (5, input));
    assert!((stats.cost - cost).abs() < 1e-9);
}
