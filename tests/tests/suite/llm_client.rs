//! The LLM client against a real HTTP server on loopback speaking the OpenAI chat completions
//! API: usage and cost per call, the key from the engine's environment, retries on 429 and
//! 5xx honouring Retry-After, timeouts, and models limited to the config.

use std::time::Duration;

use pyvisor::llm::{ChatMessage, ChatRequest, LlmClient, LlmError, OpenAiClient};
use pyvisor::{LlmConfig, Price};
use pyvisor_tests::fake_llm::{tokens, FakeLlm, Reply};
use pyvisor_tests::within;

fn config(server: &FakeLlm) -> LlmConfig {
    let mut config = LlmConfig::new(&server.url, "big-1");
    config.models.insert("small".into(), "tiny-1".into());
    config.prices.insert(
        "big-1".into(),
        Price {
            input_per_mtok: 2.0,
            output_per_mtok: 10.0,
        },
    );
    config
}

fn ask(prompt: &str, model: Option<&str>) -> ChatRequest {
    ChatRequest {
        model: model.map(str::to_owned),
        messages: vec![
            ChatMessage::new("system", "answer briefly"),
            ChatMessage::new("user", prompt),
        ],
    }
}

#[tokio::test]
async fn a_completion_reports_its_usage_and_cost_and_sends_the_key() {
    std::env::set_var("PYVISOR_TEST_LLM_KEY", "sk-llm-test-42");
    let server = FakeLlm::scripted(vec![Reply::text("four score and seven")]);
    let mut config = config(&server);
    config.api_key_env = Some("PYVISOR_TEST_LLM_KEY".into());
    let client = OpenAiClient::new(&config).unwrap();
    let done = within(client.complete(ask("what is two plus two", None)))
        .await
        .unwrap();
    assert_eq!(done.text, "four score and seven");
    assert_eq!(done.model, "big-1");
    let input = tokens("answer briefly") + tokens("what is two plus two");
    assert_eq!(done.usage.input_tokens, input);
    assert_eq!(done.usage.output_tokens, 4);
    let cost = (input as f64 * 2.0 + 4.0 * 10.0) / 1e6;
    assert!((done.cost - cost).abs() < 1e-12, "{} != {cost}", done.cost);
    assert_eq!(done.attempts, 1);
    let calls = server.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].model, "big-1");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some("Bearer sk-llm-test-42")
    );
    assert_eq!(
        calls[0].messages[0],
        ("system".into(), "answer briefly".into())
    );
}

#[tokio::test]
async fn a_named_model_is_sent_as_its_id_and_costs_nothing_without_a_price() {
    let server = FakeLlm::scripted(vec![Reply::text("ok")]);
    let client = OpenAiClient::new(&config(&server)).unwrap();
    let done = within(client.complete(ask("hi", Some("small"))))
        .await
        .unwrap();
    assert_eq!(server.calls()[0].model, "tiny-1");
    assert_eq!(done.cost, 0.0);
    assert!(server.calls()[0].authorization.is_none());
}

#[tokio::test]
async fn a_model_outside_the_config_is_refused_before_any_request() {
    let server = FakeLlm::scripted(vec![Reply::text("ok")]);
    let client = OpenAiClient::new(&config(&server)).unwrap();
    let refused = within(client.complete(ask("hi", Some("gpt-expensive")))).await;
    assert_eq!(refused, Err(LlmError::UnknownModel("gpt-expensive".into())));
    assert!(server.calls().is_empty());
}

#[tokio::test]
async fn a_429_then_success_is_retried_after_the_retry_after_wait() {
    let server = FakeLlm::scripted(vec![
        Reply::Status {
            status: 429,
            retry_after: Some(0.3),
        },
        Reply::text("second time lucky"),
    ]);
    let client = OpenAiClient::new(&config(&server)).unwrap();
    let done = within(client.complete(ask("hi", None))).await.unwrap();
    assert_eq!(done.text, "second time lucky");
    assert_eq!(done.attempts, 2);
    let calls = server.calls();
    assert_eq!(calls.len(), 2);
    // The client waited at least as long as the server asked.
    assert!(calls[1].arrived.duration_since(calls[0].arrived) >= Duration::from_millis(300));
}

#[tokio::test]
async fn server_errors_past_the_retries_fail_with_the_status() {
    let server = FakeLlm::scripted(vec![Reply::Status {
        status: 503,
        retry_after: Some(0.0),
    }]);
    let mut config = config(&server);
    config.max_retries = 2;
    let client = OpenAiClient::new(&config).unwrap();
    let failed = within(client.complete(ask("hi", None))).await;
    assert_eq!(
        failed,
        Err(LlmError::Status {
            status: 503,
            message: "scripted 503".into()
        })
    );
    assert_eq!(server.calls().len(), 3);
}

#[tokio::test]
async fn a_client_error_is_not_retried() {
    let server = FakeLlm::scripted(vec![Reply::Status {
        status: 400,
        retry_after: None,
    }]);
    let client = OpenAiClient::new(&config(&server)).unwrap();
    let failed = within(client.complete(ask("hi", None))).await;
    assert!(
        matches!(failed, Err(LlmError::Status { status: 400, .. })),
        "{failed:?}"
    );
    assert_eq!(server.calls().len(), 1);
}

#[tokio::test]
async fn a_slow_endpoint_times_out_without_a_retry() {
    let server = FakeLlm::scripted(vec![Reply::Delayed(
        Duration::from_secs(5),
        Box::new(Reply::text("too late")),
    )]);
    let mut config = config(&server);
    config.timeout = Duration::from_millis(300);
    let client = OpenAiClient::new(&config).unwrap();
    let failed = within(client.complete(ask("hi", None))).await;
    assert_eq!(failed, Err(LlmError::Timeout(Duration::from_millis(300))));
    assert_eq!(server.calls().len(), 1);
}

#[tokio::test]
async fn an_unset_key_variable_is_a_clear_error() {
    let server = FakeLlm::scripted(vec![Reply::text("ok")]);
    let mut config = config(&server);
    config.api_key_env = Some("PYVISOR_TEST_LLM_KEY_NEVER_SET".into());
    let error = OpenAiClient::new(&config)
        .err()
        .unwrap_or_else(|| panic!("an error"));
    assert_eq!(
        error,
        LlmError::MissingKey("PYVISOR_TEST_LLM_KEY_NEVER_SET".into())
    );
    assert!(error.to_string().contains("PYVISOR_TEST_LLM_KEY_NEVER_SET"));
}
