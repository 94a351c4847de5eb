//! The RLM task loop against a real HTTP server on loopback speaking the OpenAI chat
//! completions API, whose replies depend on the loop's depth (read from its system prompt):
//! nested `rlm_query` to depth 2 with the 50% split of the budget, the downgrade to
//! `llm_query`, a spent budget (`budget_exceeded`, and `BudgetExceeded` in Python), `FINAL_VAR`,
//! truncated output, a context loaded from a file that never reaches a prompt, the task's
//! sessions closed at its end, and session code that tries to raise its budget or depth.

use std::io::Write;
use std::time::{Duration, Instant};

use pyvisor::task::{Budget, TaskContext, TaskKind, TaskOutcome, TaskRequest, TaskStatus};
use pyvisor::{Engine, EngineConfig, ExecutionStatus, LlmConfig, Price};
use pyvisor_tests::fake_llm::{tokens, Call, FakeLlm, Reply};
use pyvisor_tests::{engine_with, run, within};

/// An engine whose `[llm]` is `server`, with `price`.
async fn engine_for(server: &FakeLlm, price: Price) -> Engine {
    let mut llm = LlmConfig::new(&server.url, "fake-1");
    llm.prices.insert("fake-1".into(), price);
    let mut config = EngineConfig::default();
    config.pool.min_idle = 1;
    config.llm = Some(llm);
    engine_with(config).await
}

/// Ten cents per word the model answers; asking is free.
const PER_OUTPUT_WORD: Price = Price {
    input_per_mtok: 0.0,
    output_per_mtok: 100_000.0,
};

fn rlm(prompt: &str, context: Option<&str>, budget: Budget) -> TaskRequest {
    TaskRequest {
        kind: TaskKind::Rlm,
        prompt: prompt.into(),
        data: Default::default(),
        context: context.map(|text| TaskContext::Text(text.into())),
        model: None,
        budget,
        session_id: None,
        task_id: None,
        keep_session: false,
    }
}

fn budget(max_cost: Option<f64>, max_iterations: u32, max_depth: u32) -> Budget {
    Budget {
        max_cost,
        max_iterations: Some(max_iterations),
        max_depth: Some(max_depth),
    }
}

async fn run_task(engine: &Engine, request: TaskRequest) -> TaskOutcome {
    within(engine.run_task(request, None, None)).await.unwrap()
}

fn repl(code: &str) -> Reply {
    Reply::text(format!("```repl\n{code}\n```"))
}

/// The depth a call's loop states in its system prompt; `None` for a plain `llm_query`.
fn depth(call: &Call) -> Option<u32> {
    let (role, system) = call.messages.first()?;
    let rest = system
        .split("at depth ")
        .nth(1)
        .filter(|_| role == "system")?;
    rest.split(' ').next()?.parse().ok()
}

/// The model replies the loop has had so far.
fn replies(call: &Call) -> usize {
    call.messages
        .iter()
        .filter(|(role, _)| role == "assistant")
        .count()
}

/// Waits up to 30 s for the engine to have no session left.
async fn no_sessions_left(engine: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !engine.sessions(None).await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the task's sessions stayed open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn rlm_query_nests_to_depth_two_with_half_the_budget_at_each_level() {
    let server = FakeLlm::start(|call| match (depth(call), replies(call)) {
        (Some(0), 0) => repl("answer = rlm_query('summarize', context[:5])\nprint(answer)"),
        (Some(0), _) => Reply::text("The sub-loop answered.\nFINAL_VAR(answer)"),
        (Some(1), 0) => repl("FINAL('depth1:' + rlm_query('deeper', {'text': context}))"),
        (Some(2), 0) => repl("FINAL('depth2 got ' + context['text'])"),
        other => Reply::text(format!("unexpected call {other:?}")),
    });
    let free = Price::default();
    let engine = engine_for(&server, free).await;
    let request = rlm("what is it", Some("hello world"), budget(Some(10.0), 40, 2));
    let outcome = run_task(&engine, request).await;
    assert_eq!(outcome.status, TaskStatus::Done, "{outcome:#?}");
    assert_eq!(outcome.answer.as_deref(), Some("depth1:depth2 got hello"));
    assert_eq!(outcome.iterations, 2, "the top loop's own replies");
    // Every call's tokens are the task's, the nested loops' included.
    let calls = server.calls();
    assert_eq!(calls.len(), 4);
    let input: u64 = (calls.iter())
        .flat_map(|call| call.messages.iter().map(|(_, content)| tokens(content)))
        .sum();
    assert_eq!(outcome.tokens.input_tokens, input);
    // Each nested loop's system prompt states its depth and half of what was left.
    let system = |depth_wanted| {
        let call = calls
            .iter()
            .find(|c| depth(c) == Some(depth_wanted))
            .unwrap();
        call.messages[0].1.clone()
    };
    let (first, second) = (system(1), system(2));
    assert!(first.contains("at depth 1 (of at most 2)"), "{first}");
    assert!(first.contains("19 replies and $5.0000"), "{first}");
    assert!(second.contains("9 replies and $2.5000"), "{second}");
    // The context stays in the session: the top prompt only describes it.
    assert!(!calls[0]
        .messages
        .iter()
        .any(|(_, c)| c.contains("hello world")));
    assert!(system(0).contains("a str of length 11"));
    no_sessions_left(&engine).await;
    // Every completion was recorded, the nested loops' included: a replay asks no endpoint.
    assert_eq!(outcome.llm_calls.len(), 4);
    let replay = pyvisor::task::ReplayClient::new(outcome.llm_calls.clone());
    let config = EngineConfig {
        llm: Some(LlmConfig::new("", "replay")),
        ..EngineConfig::default()
    };
    let offline = Engine::start_with_llm(config, Some(std::sync::Arc::new(replay)))
        .await
        .unwrap();
    let request = rlm("what is it", Some("hello world"), budget(Some(10.0), 40, 2));
    let again = run_task(&offline, request).await;
    assert_eq!(again.status, TaskStatus::Done, "{again:#?}");
    assert_eq!(again.answer, outcome.answer);
    assert_eq!(again.tokens, outcome.tokens);
    assert_eq!(server.calls().len(), 4, "the replay asked no endpoint");
}

#[tokio::test]
async fn rlm_query_runs_as_llm_query_when_too_little_is_left_and_says_so() {
    let server = FakeLlm::start(|call| match (depth(call), replies(call)) {
        (Some(0), 0) => repl("print(rlm_query('capital of France?', 'geography'))"),
        (Some(0), _) => Reply::text("FINAL(ok)"),
        (None, _) => Reply::text(format!("plain answer to: {}", call.last())),
        other => Reply::text(format!("unexpected call {other:?}")),
    });
    let engine = engine_for(&server, Price::default()).await;
    // After the first reply 4 iterations are left, under the 5 a sub-loop needs.
    let outcome = run_task(&engine, rlm("q", None, budget(None, 5, 2))).await;
    assert_eq!(outcome.status, TaskStatus::Done, "{outcome:#?}");
    let output = outcome.messages[3].content.clone();
    assert!(
        output.contains("[rlm_query ran as llm_query: 4 iteration(s) left, under 5]"),
        "{output}"
    );
    assert!(
        output.contains("plain answer to: capital of France?\n\nContext:\ngeography"),
        "{output}"
    );
    // At the maximum depth there is no sub-loop either.
    let outcome = run_task(&engine, rlm("q", None, budget(None, 40, 0))).await;
    let output = outcome.messages[3].content.clone();
    assert!(
        output.contains("[rlm_query ran as llm_query: depth 1 is the maximum (max_depth 0)]"),
        "{output}"
    );
    assert!(server.calls().iter().all(|c| depth(c) != Some(1)));
}

#[tokio::test]
async fn a_spent_budget_raises_budget_exceeded_in_python_and_ends_the_task() {
    // The first reply is 12 words: $1.20, over the $1.00 of the task.
    let code = "try:\n    llm_query('one more question')\nexcept BudgetExceeded as err:\n    \
                print('refused:', err)";
    let first = repl(code);
    let server = FakeLlm::start(move |call| match replies(call) {
        0 => first.clone(),
        _ => Reply::text("FINAL(too late)"),
    });
    let engine = engine_for(&server, PER_OUTPUT_WORD).await;
    let outcome = run_task(&engine, rlm("q", None, budget(Some(1.0), 40, 2))).await;
    assert_eq!(outcome.status, TaskStatus::BudgetExceeded, "{outcome:#?}");
    assert_eq!(outcome.iterations, 1);
    assert_eq!(
        server.calls().len(),
        1,
        "the refused call never reached the server"
    );
    let words = tokens(&format!("```repl\n{code}\n```"));
    assert!(
        (outcome.cost - 0.1 * words as f64).abs() < 1e-9,
        "{}",
        outcome.cost
    );
    // What was achieved: the run of the code, and its output.
    let result = outcome.result.as_deref().unwrap();
    assert!(
        result.starts_with("refused: the budget of this loop (depth 0) is spent"),
        "{result}"
    );
    assert_eq!(outcome.final_code.as_deref(), Some(code));
    let stats = engine.stats().await.unwrap().llm.unwrap();
    assert!((stats.cost - outcome.cost).abs() < 1e-9);
}

#[tokio::test]
async fn final_var_and_truncated_output_with_a_context_file_that_never_reaches_a_prompt() {
    let server = FakeLlm::start(|call| match replies(call) {
        0 => repl("total = sum(context['values'])\nprint('x' * 10000)"),
        1 => Reply::text("FINAL_VAR(missing)"),
        _ => Reply::text("Here it is.\nFINAL_VAR(total)"),
    });
    let engine = engine_for(&server, Price::default()).await;
    let mut file = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    let marker = "zebra-marker-4471";
    write!(file, r#"{{"values": [1, 2, 39], "note": "{marker}"}}"#).unwrap();
    let mut request = rlm("sum the values", None, budget(None, 10, 1));
    request.context = Some(TaskContext::File {
        path: file.path().to_string_lossy().into_owned(),
    });
    let outcome = run_task(&engine, request).await;
    assert_eq!(outcome.status, TaskStatus::Done, "{outcome:#?}");
    assert_eq!(outcome.answer.as_deref(), Some("42"));
    assert_eq!(outcome.iterations, 3);
    let output = &outcome.messages[3].content;
    assert!(
        output.contains("[output truncated: the first 4000 of 10001 characters are shown]"),
        "{output}"
    );
    assert!(output.len() < 4300, "{}", output.len());
    let missing = &outcome.messages[5].content;
    assert!(
        missing.contains("FINAL_VAR: no variable named 'missing'"),
        "{missing}"
    );
    assert!(outcome.messages[0].content.contains("a dict of length 2"));
    for call in server.calls() {
        assert!(!call.raw.contains(marker), "the context reached a prompt");
    }
    // A bad context path is the task's error, with the reason.
    let mut request = rlm("q", None, budget(None, 10, 1));
    request.context = Some(TaskContext::File {
        path: "/nonexistent/context.txt".into(),
    });
    let outcome = run_task(&engine, request).await;
    assert_eq!(outcome.status, TaskStatus::Error);
    assert!(outcome.error.unwrap().contains("No such file"));
    // An rlm task runs in a session of its own.
    let mut request = rlm("q", None, Budget::default());
    request.session_id = Some("s-1".into());
    let refused = engine.run_task(request, None, None).await.unwrap_err();
    assert!(
        refused.to_string().contains("session of its own"),
        "{refused}"
    );
}

#[tokio::test]
async fn session_code_cannot_raise_its_budget_or_depth() {
    // Forged frames carry budget and depth fields the host does not read; the injected
    // functions' globals are the session's to break, not the budget's.
    let forge = r#"
import queue
from pyvisor_worker import bridge, protocol, state
bridge.__dict__['BUDGET'] = 10**9
llm_query.__globals__['_numbers'] = iter(range(10**6, 10**7))
def forged(kind, ctx=None):
    slot = queue.SimpleQueue()
    number = 987654321 + len(bridge._waiting)
    bridge._waiting[number] = slot
    frame = {"type": "llm_call", "id": state.current_id, "call": number, "kind": kind,
             "prompts": ["again"], "model": None, "depth": 0, "max_depth": 99,
             "budget": {"max_cost": 1000.0, "max_iterations": 1000}}
    if ctx is not None:
        frame["context"] = ctx
    protocol.send(frame)
    return slot.get(timeout=60)
print(forged("rlm", "c")["answers"])
print(forged("llm")["error"])
"#;
    let forge = forge.to_owned();
    let server = FakeLlm::start(move |call| match (depth(call), replies(call)) {
        (Some(0), 0) => repl(&forge),
        (Some(0), _) => Reply::text("FINAL(end)"),
        (None, _) => Reply::text("plain"),
        other => Reply::text(format!("unexpected call {other:?}")),
    });
    let engine = engine_for(&server, PER_OUTPUT_WORD).await;
    // Depth 0 is the maximum: the forged rlm call runs as an llm_query all the same.
    let outcome = run_task(&engine, rlm("q", None, budget(None, 40, 0))).await;
    assert_eq!(outcome.status, TaskStatus::Done, "{outcome:#?}");
    let output = outcome.result.clone().unwrap_or_default();
    assert!(
        output.contains("rlm_query ran as llm_query: depth 1 is the maximum"),
        "{output}"
    );
    // The first reply spends more than the $1.00 there is: the forged call is refused.
    let outcome = run_task(&engine, rlm("q", None, budget(Some(1.0), 40, 0))).await;
    assert_eq!(outcome.status, TaskStatus::BudgetExceeded, "{outcome:#?}");
    let output = outcome.result.clone().unwrap_or_default();
    assert!(output.contains("'kind': 'BudgetExceeded'"), "{output}");
    assert!(server.calls().iter().all(|c| depth(c) != Some(1)));
    assert_eq!(
        server.calls().iter().filter(|c| depth(c).is_none()).count(),
        2,
        "only the first run's two forged calls reached the server"
    );
}

#[tokio::test]
async fn a_kept_session_stays_with_its_variables_and_its_bridge_closed() {
    let server = FakeLlm::start(|call| match replies(call) {
        0 => repl("kept = 41 + 1\nFINAL(kept)"),
        _ => Reply::text("unexpected"),
    });
    let engine = engine_for(&server, Price::default()).await;
    let mut request = rlm("q", None, Budget::default());
    request.keep_session = true;
    let outcome = run_task(&engine, request).await;
    assert_eq!(outcome.answer.as_deref(), Some("42"));
    let session = engine.session(&outcome.session_id, None).await.unwrap();
    let result = run(
        &session,
        "try:\n    llm_query('x')\nexcept LlmError as e:\n    print(e)\nkept",
    )
    .await;
    assert_eq!(result.status, ExecutionStatus::Ok);
    assert!(result
        .stdout
        .contains("the task that made this session has ended"));
    assert_eq!(result.result.unwrap().repr, "42");
    // A session of the engine's own bridge has no rlm_query outside a task.
    let options = pyvisor::SessionOptions {
        llm: Some(true),
        ..Default::default()
    };
    let plain = engine.create_session(options).await.unwrap();
    let result = run(
        &plain,
        "try:\n    rlm_query('x')\nexcept LlmError as e:\n    print(e)",
    )
    .await;
    assert!(
        result
            .stdout
            .contains("only in the sessions of an rlm task"),
        "{result:?}"
    );
}
