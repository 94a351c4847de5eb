//! The transform task loop against a real HTTP server on loopback speaking the OpenAI chat
//! completions API, with scripted replies: an error that is sent back and fixed, a model that
//! never says DONE (the cap), a reply without a code block, a result that is not a DataFrame,
//! the cost budget, and a cancel.

use std::io::Write;
use std::time::Duration;

use pyvisor::task::{Budget, TaskKind, TaskOutcome, TaskRequest, TaskStatus};
use pyvisor::{Engine, EngineConfig, ExecutionStatus, LlmConfig, Price};
use pyvisor_tests::fake_llm::{tokens, FakeLlm, Reply};
use pyvisor_tests::{engine_with, within};

const CSV: &str = "region,amount\nnorth,10\nsouth,5\nnorth,7\n";

fn fenced(code: &str) -> Reply {
    Reply::text(format!("Here you go:\n```python\n{code}\n```\n"))
}

async fn engine_for(server: &FakeLlm) -> Engine {
    let mut llm = LlmConfig::new(&server.url, "fake-1");
    llm.prices.insert(
        "fake-1".into(),
        Price {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
        },
    );
    let mut config = EngineConfig::default();
    config.pool.min_idle = 1;
    config.llm = Some(llm);
    engine_with(config).await
}

/// A CSV file of sales, left for the worker to read.
fn sales_file() -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".csv").tempfile().unwrap();
    file.write_all(CSV.as_bytes()).unwrap();
    file
}

fn transform(prompt: &str, file: &tempfile::NamedTempFile) -> TaskRequest {
    TaskRequest {
        kind: TaskKind::Transform,
        prompt: prompt.into(),
        data: [(
            "sales".to_owned(),
            file.path().to_string_lossy().into_owned(),
        )]
        .into(),
        model: None,
        budget: Budget::default(),
        context: None,
        session_id: None,
        task_id: None,
        keep_session: false,
    }
}

async fn run(engine: &Engine, request: TaskRequest) -> TaskOutcome {
    within(engine.run_task(request, None, None)).await.unwrap()
}

const TOTALS: &str = "result = sales.groupby('region', as_index=False)['amount'].sum()";

#[tokio::test]
async fn a_transform_that_fails_recovers_and_ends_with_done() {
    let server = FakeLlm::scripted(vec![
        fenced("result = sales.groupby('regoin')['amount'].sum()"),
        fenced(TOTALS),
        Reply::text("DONE"),
    ]);
    let engine = engine_for(&server).await;
    let file = sales_file();
    let outcome = run(&engine, transform("total amount per region", &file)).await;
    assert_eq!(outcome.status, TaskStatus::Done, "{outcome:#?}");
    assert_eq!(outcome.iterations, 3);
    assert_eq!(outcome.final_code.as_deref(), Some(TOTALS));
    // The session the task made is closed at its end.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !engine.sessions(None).await.unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the task's session stayed open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let result = outcome.result.as_deref().unwrap();
    assert!(
        result.contains("shape (2, 2)") && result.contains("north") && result.contains("17"),
        "{result}"
    );
    let calls = server.calls();
    assert_eq!(calls.len(), 3);
    // The first request: the system prompt, then the request with the data's preview.
    let first = &calls[0].messages;
    assert_eq!(first[0].0, "system");
    assert!(first[1].1.contains("total amount per region"));
    assert!(
        first[1].1.contains("sales: DataFrame, shape (3, 2)"),
        "{}",
        first[1].1
    );
    assert!(first[1].1.contains("amount: int64"), "{}", first[1].1);
    // The error went back with its traceback; the success with a preview of the result.
    assert!(calls[1].last().contains("KeyError") && calls[1].last().contains("regoin"));
    assert!(calls[2].last().contains("Preview of `result`"));
    let failed = outcome.messages[3].execution.as_ref().unwrap();
    assert_eq!(failed.status, ExecutionStatus::Error);
    // Tokens and cost are those the server counted.
    let input: u64 = calls
        .iter()
        .flat_map(|c| &c.messages)
        .map(|(_, m)| tokens(m))
        .sum();
    assert_eq!(outcome.tokens.input_tokens, input);
    let output = outcome.tokens.output_tokens;
    assert!((outcome.cost - (input as f64 + 2.0 * output as f64) / 1e6).abs() < 1e-12);
    assert_eq!(engine.stats().await.unwrap().llm.unwrap().calls, 3);
}

#[tokio::test]
async fn a_model_that_never_says_done_stops_at_the_cap() {
    let server = FakeLlm::scripted(vec![fenced(TOTALS)]);
    let engine = engine_for(&server).await;
    let file = sales_file();
    let outcome = run(&engine, transform("totals", &file)).await;
    assert_eq!(outcome.status, TaskStatus::MaxIterations);
    assert_eq!(outcome.iterations, 5);
    assert_eq!(server.calls().len(), 5);
    assert_eq!(outcome.final_code.as_deref(), Some(TOTALS));
    let mut request = transform("totals", &file);
    request.budget.max_iterations = Some(2);
    let outcome = run(&engine, request).await;
    assert_eq!(
        (outcome.status, outcome.iterations),
        (TaskStatus::MaxIterations, 2)
    );
}

#[tokio::test]
async fn a_reply_without_a_code_block_is_asked_for_one() {
    let server = FakeLlm::scripted(vec![
        Reply::text("Sure, I will sum the amounts by region."),
        Reply::text("DONE"),
        fenced(TOTALS),
        Reply::text("Looks right.\nDONE"),
    ]);
    let engine = engine_for(&server).await;
    let file = sales_file();
    let outcome = run(&engine, transform("totals", &file)).await;
    assert_eq!(outcome.status, TaskStatus::Done, "{outcome:#?}");
    let calls = server.calls();
    assert!(
        calls[1].last().contains("has no code block"),
        "{}",
        calls[1].last()
    );
    // DONE before any code ran is not accepted.
    assert!(calls[2].last().contains("Nothing has run successfully yet"));
    assert_eq!(outcome.iterations, 4);
}

#[tokio::test]
async fn a_result_that_is_not_a_dataframe_is_sent_back_to_be_fixed() {
    let server = FakeLlm::scripted(vec![
        fenced("result = sales['amount'].sum()"),
        fenced(TOTALS),
        Reply::text("DONE"),
    ]);
    let engine = engine_for(&server).await;
    let file = sales_file();
    let outcome = run(&engine, transform("totals", &file)).await;
    assert_eq!(outcome.status, TaskStatus::Done);
    assert!(server.calls()[1].last().contains("is not a DataFrame"));
    assert_eq!(outcome.final_code.as_deref(), Some(TOTALS));
}

#[tokio::test]
async fn the_cost_budget_ends_the_task_with_what_was_achieved() {
    let server = FakeLlm::scripted(vec![fenced(TOTALS)]);
    let engine = engine_for(&server).await;
    let file = sales_file();
    let mut request = transform("totals", &file);
    // One call costs more than this: the loop stops after the first.
    request.budget.max_cost = Some(1e-6);
    let outcome = run(&engine, request).await;
    assert_eq!(outcome.status, TaskStatus::BudgetExceeded);
    assert_eq!(outcome.iterations, 1);
    assert_eq!(outcome.final_code.as_deref(), Some(TOTALS));
}

#[tokio::test]
async fn a_cancel_ends_a_running_task_and_bad_requests_are_refused() {
    let server = FakeLlm::scripted(vec![Reply::Delayed(
        Duration::from_secs(30),
        Box::new(Reply::text("DONE")),
    )]);
    let engine = engine_for(&server).await;
    let file = sales_file();
    let mut request = transform("totals", &file);
    request.task_id = Some("t-mine".into());
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_task(request, Some("ada"), None).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.calls().is_empty() {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !engine.cancel_task("t-mine", Some("bob")),
        "another owner's task"
    );
    assert!(engine.cancel_task("t-mine", Some("ada")));
    let outcome = within(running).await.unwrap().unwrap();
    assert_eq!(outcome.status, TaskStatus::Cancelled);
    assert!(!engine.cancel_task("t-mine", None), "no longer running");
    let mut bad = transform("x", &file);
    bad.data.insert("not a name".into(), "x.csv".into());
    let outcome = run(&engine, bad).await;
    assert_eq!(outcome.status, TaskStatus::Error);
    assert!(outcome.error.unwrap().contains("not a Python name"));
    let mut rlm = transform("x", &file);
    rlm.kind = TaskKind::Rlm;
    rlm.session_id = Some("s-1".into());
    let refused = engine.run_task(rlm, None, None).await.err().unwrap();
    assert!(
        refused.to_string().contains("session of its own"),
        "{refused}"
    );
}

#[tokio::test]
async fn task_run_streams_each_step_before_its_result_over_the_protocol() {
    use pyvisor::rpc::{Caller, Dispatcher, Outbound};
    use serde_json::{json, Value};
    let server = FakeLlm::scripted(vec![fenced(TOTALS), Reply::text("DONE")]);
    let engine = engine_for(&server).await;
    let file = sales_file();
    let dispatcher = Dispatcher::new(engine.clone(), pyvisor::SessionLimits::default());
    let (out, mut queue) = Outbound::new(1 << 20);
    let params = json!({"kind": "transform", "prompt": "totals", "stream": true,
                        "data": {"sales": file.path()}, "task_id": "t-rpc",
                        "keep_session": true});
    let caller = Caller::owner("ada");
    let result = within(dispatcher.call(&caller, "task.run", Some(params), &out))
        .await
        .unwrap();
    let result: Value = serde_json::from_str(result.get()).unwrap();
    assert_eq!(result["status"], "done");
    assert_eq!(result["task_id"], "t-rpc");
    assert_eq!(result["final_code"], TOTALS);
    let session = engine
        .session(result["session_id"].as_str().unwrap(), Some("ada"))
        .await;
    assert!(session.is_ok(), "the kept session is the caller's");
    let mut steps = Vec::new();
    while !queue.is_empty() {
        let note: Value = serde_json::from_str(&queue.recv().await.unwrap()).unwrap();
        assert_eq!(note["method"], "task.step");
        assert_eq!(note["params"]["task_id"], "t-rpc");
        steps.push(note["params"].clone());
    }
    let roles: Vec<&str> = steps.iter().map(|s| s["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(steps[2]["code"], TOTALS);
    assert_eq!(steps[3]["execution"]["status"], "ok");
    assert_eq!(steps.len(), result["messages"].as_array().unwrap().len());
    // Bad params name the field; a task of another owner cannot be cancelled.
    let bad = json!({"kind": "sideways", "prompt": "x"});
    let error = dispatcher
        .call(&caller, "task.run", Some(bad), &out)
        .await
        .unwrap_err();
    assert_eq!(error.code, -32602, "{error:?}");
    let cancel = json!({"task_id": "t-rpc"});
    let answer = dispatcher
        .call(&caller, "task.cancel", Some(cancel), &out)
        .await
        .unwrap();
    assert_eq!(answer.get(), r#"{"cancelled":false}"#);
}
