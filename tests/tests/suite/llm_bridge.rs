//! The LLM bridge in sessions: `llm_query` and `llm_query_batched` answered by the host from a
//! real HTTP server on loopback speaking the OpenAI chat completions API. Only sessions that
//! opt in get the functions; batched prompts go out concurrently within one window; an
//! interrupt or a timeout of the execution ends a pending call; the key never reaches the
//! session; session code cannot pick a model outside the config; a flood from one session
//! is bounded and leaves the others served; and a session whose client answers asks the
//! answerer of each execution, also once restored by a later engine.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyvisor::{
    Engine, EngineConfig, ExecuteRequest, ExecutionStatus, LlmConfig, Session, SessionOptions,
};
use pyvisor_tests::fake_llm::{FakeLlm, Reply};
use pyvisor_tests::{engine_with, run, within};

/// An engine whose `[llm]` is `server`, changed by `adjust`.
async fn engine_for(server: &FakeLlm, adjust: impl FnOnce(&mut LlmConfig)) -> Engine {
    let mut llm = LlmConfig::new(&server.url, "fake-1");
    llm.models.insert("small".into(), "fake-small".into());
    adjust(&mut llm);
    let mut config = EngineConfig::default();
    config.pool.min_idle = 1;
    config.llm = Some(llm);
    engine_with(config).await
}

async fn llm_session(engine: &Engine) -> Session {
    let options = SessionOptions {
        llm: Some(true),
        ..SessionOptions::default()
    };
    engine.create_session(options).await.expect("a session")
}

/// The value of `code`'s last expression; panics on any other outcome.
async fn value(session: &Session, code: &str) -> String {
    let result = run(session, code).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{code}: {result:?}");
    result.result.map(|r| r.repr).unwrap_or_default()
}

/// Waits up to 30 s for `condition`.
async fn until(mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "the condition never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn llm_query_answers_with_the_models_reply() {
    let server = FakeLlm::start(|call| Reply::text(format!("echo: {}", call.last())));
    let engine = engine_for(&server, |_| {}).await;
    let session = llm_session(&engine).await;
    let answer = value(&session, "llm_query('what is two plus two')").await;
    assert_eq!(answer, "'echo: what is two plus two'");
    let small = value(&session, "llm_query('hi', model='small')").await;
    assert_eq!(small, "'echo: hi'");
    let calls = server.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].model.as_str(), calls[1].model.as_str()),
        ("fake-1", "fake-small")
    );
    assert_eq!(
        calls[0].messages,
        vec![("user".into(), "what is two plus two".into())]
    );
    let stats = engine.stats().await.unwrap().llm.expect("llm stats");
    assert_eq!(stats.calls, 2);
    assert_eq!(stats.input_tokens, 5 + 1);
    assert_eq!(stats.output_tokens, 6 + 2);
}

#[tokio::test]
async fn a_session_without_llm_has_none_of_the_functions() {
    let server = FakeLlm::scripted(vec![Reply::text("never")]);
    let engine = engine_for(&server, |_| {}).await;
    let plain = engine.create_session(Default::default()).await.unwrap();
    let names = "import builtins\n[n for n in ('llm_query', 'llm_query_batched', 'rlm_query', \
                 'LlmError', 'BudgetExceeded') if hasattr(builtins, n) or n in globals()]";
    assert_eq!(value(&plain, names).await, "[]");
    let result = run(&plain, "llm_query('x')").await;
    assert_eq!(result.status, ExecutionStatus::Error);
    assert_eq!(result.error.unwrap().type_name, "NameError");
    // Even a frame written by hand gets no answer from the host: the bridge is not there.
    let forged = "from pyvisor_worker import bridge\ntry:\n    bridge.llm_query('x')\n\
                  except bridge.LlmError as e:\n    print('refused:', e)";
    let result = run(&plain, forged).await;
    assert!(
        result
            .stdout
            .contains("refused: this session has no LLM bridge"),
        "{result:?}"
    );
    assert!(server.calls().is_empty());
    // With the bridge on by default, a session that does not say has it.
    let server = FakeLlm::scripted(vec![Reply::text("yes")]);
    let engine = engine_for(&server, |llm| llm.sessions = true).await;
    let default = engine.create_session(Default::default()).await.unwrap();
    assert_eq!(value(&default, "llm_query('x')").await, "'yes'");
}

#[tokio::test]
async fn an_engine_without_llm_refuses_a_session_that_asks_for_it() {
    let engine = engine_with(EngineConfig::default()).await;
    let refused = engine
        .create_session(SessionOptions {
            llm: Some(true),
            ..SessionOptions::default()
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("refused"));
    assert!(
        refused.to_string().contains("no [llm] endpoint"),
        "{refused}"
    );
}

#[tokio::test]
async fn batched_prompts_reach_the_server_concurrently_within_one_window() {
    let server = FakeLlm::start(|call| {
        Reply::Delayed(
            Duration::from_millis(300),
            Box::new(Reply::text(call.last().to_uppercase())),
        )
    });
    let engine = engine_for(&server, |llm| {
        llm.batch_window = Duration::from_millis(50);
        llm.session_concurrency = 8;
    })
    .await;
    let session = llm_session(&engine).await;
    let answers = value(
        &session,
        "llm_query_batched(['a', 'b', 'c', 'd', 'e', 'f'])",
    )
    .await;
    assert_eq!(answers, "['A', 'B', 'C', 'D', 'E', 'F']");
    assert_eq!(server.most_in_flight(), 6, "all six were served at once");
    // Two threads that call within one window go out together too.
    let code = "import threading\nout = {}\n\
                def ask(p):\n    out[p] = llm_query(p)\n\
                ts = [threading.Thread(target=ask, args=(p,)) for p in ('x', 'y')]\n\
                [t.start() for t in ts]\n[t.join() for t in ts]\nsorted(out.items())";
    assert_eq!(value(&session, code).await, "[('x', 'X'), ('y', 'Y')]");
    let calls = server.calls();
    let (x, y) = (&calls[6], &calls[7]);
    let apart = if x.arrived > y.arrived {
        x.arrived - y.arrived
    } else {
        y.arrived - x.arrived
    };
    assert!(
        apart < Duration::from_millis(300),
        "sent together: {apart:?}"
    );
    assert_eq!(engine.stats().await.unwrap().llm.unwrap().calls, 8);
}

#[tokio::test]
async fn an_interrupt_ends_a_pending_llm_query() {
    let server = FakeLlm::scripted(vec![Reply::Delayed(
        Duration::from_secs(30),
        Box::new(Reply::text("too late")),
    )]);
    let engine = engine_for(&server, |_| {}).await;
    let session = llm_session(&engine).await;
    let execution = session
        .execute("answer = llm_query('think hard')")
        .await
        .unwrap();
    until(|| !server.calls().is_empty()).await;
    assert!(session.interrupt().await.unwrap());
    let result = within(execution.result()).await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Interrupted, "{result:?}");
    assert_eq!(result.error.unwrap().type_name, "KeyboardInterrupt");
    // The session goes on, and the next call is its own.
    assert_eq!(value(&session, "'answer' in globals()").await, "False");
}

#[tokio::test]
async fn a_timeout_of_the_execution_ends_a_pending_llm_query_and_other_threads_get_llm_error() {
    let server = FakeLlm::scripted(vec![Reply::Delayed(
        Duration::from_secs(30),
        Box::new(Reply::text("too late")),
    )]);
    let engine = engine_for(&server, |_| {}).await;
    let session = llm_session(&engine).await;
    let code = "import threading\nseen = []\n\
                def ask():\n    try:\n        llm_query('background')\n    \
                except LlmError as e:\n        seen.append(str(e))\n\
                t = threading.Thread(target=ask)\nt.start()\nllm_query('foreground')";
    let mut request = ExecuteRequest::new(code);
    request.timeout = Some(Duration::from_millis(500));
    let result = within(session.run(request)).await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Timeout, "{result:?}");
    let seen = value(&session, "t.join(10)\nseen").await;
    assert!(
        seen.contains("the execution that made the call has ended"),
        "{seen}"
    );
}

#[tokio::test]
async fn an_endpoint_timeout_raises_llm_error_in_the_session() {
    let server = FakeLlm::scripted(vec![Reply::Delayed(
        Duration::from_secs(10),
        Box::new(Reply::text("too late")),
    )]);
    let engine = engine_for(&server, |llm| llm.timeout = Duration::from_millis(200)).await;
    let session = llm_session(&engine).await;
    let code = "try:\n    llm_query('x')\nexcept LlmError as e:\n    caught = str(e)\ncaught";
    let caught = value(&session, code).await;
    assert!(caught.contains("no answer within"), "{caught}");
    assert_eq!(engine.stats().await.unwrap().llm.unwrap().errors, 1);
}

#[tokio::test]
async fn the_key_stays_in_the_engine() {
    std::env::set_var("PYVISOR_TEST_BRIDGE_KEY", "sk-bridge-secret-77");
    let server = FakeLlm::start(|call| Reply::text(format!("you said {}", call.last())));
    let engine = engine_for(&server, |llm| {
        llm.api_key_env = Some("PYVISOR_TEST_BRIDGE_KEY".into());
    })
    .await;
    let session = llm_session(&engine).await;
    let code = "import os\nanswer = llm_query('hello')\n\
                env = open('/proc/self/environ', 'rb').read()\n\
                (answer, 'PYVISOR_TEST_BRIDGE_KEY' in os.environ, b'sk-bridge-secret' in env)";
    assert_eq!(
        value(&session, code).await,
        "('you said hello', False, False)"
    );
    // The key went to the server, and only in its header.
    let call = &server.calls()[0];
    assert_eq!(
        call.authorization.as_deref(),
        Some("Bearer sk-bridge-secret-77")
    );
    assert_eq!(call.raw.matches("sk-bridge-secret-77").count(), 1);
    // A key variable that workers would inherit is refused at start.
    let mut config = EngineConfig::default();
    let mut llm = LlmConfig::new(&server.url, "fake-1");
    llm.api_key_env = Some("LC_LLM_KEY".into());
    std::env::set_var("LC_LLM_KEY", "sk-leaky");
    config.llm = Some(llm);
    let refused = Engine::start(config)
        .await
        .err()
        .unwrap_or_else(|| panic!("refused"));
    assert!(refused.to_string().contains("workers inherit"), "{refused}");
}

#[tokio::test]
async fn session_code_cannot_choose_a_model_outside_the_config() {
    let server = FakeLlm::scripted(vec![Reply::text("never")]);
    let engine = engine_for(&server, |_| {}).await;
    let session = llm_session(&engine).await;
    let code = "try:\n    llm_query('x', model='gpt-very-expensive')\n\
                except LlmError as e:\n    caught = str(e)\ncaught";
    let caught = value(&session, code).await;
    assert!(
        caught.contains("not one of the configured models"),
        "{caught}"
    );
    let result = run(&session, "llm_query(42)").await;
    assert_eq!(result.error.unwrap().type_name, "TypeError");
    assert!(server.calls().is_empty());
}

#[tokio::test]
async fn a_flood_from_one_session_is_bounded_and_leaves_another_served() {
    // The flood's requests wait at the server until the test lets them go.
    let release = Arc::new(AtomicBool::new(false));
    let flood_done = Arc::new(AtomicUsize::new(0));
    let (gate, counted) = (release.clone(), flood_done.clone());
    let server = FakeLlm::start(move |call| {
        if call.last().starts_with("flood") {
            while !gate.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            counted.fetch_add(1, Ordering::SeqCst);
        }
        Reply::text("ok")
    });
    let engine = engine_for(&server, |llm| {
        llm.max_concurrency = 6;
        llm.session_concurrency = 3;
        llm.max_pending = 12;
        llm.batch_window = Duration::ZERO;
    })
    .await;
    let flooder = llm_session(&engine).await;
    let other = llm_session(&engine).await;
    let code = "import threading\nrefused = []\n\
                def ask(i):\n    try:\n        llm_query_batched(['flood %d' % i] * 4)\n    \
                except LlmError as e:\n        refused.append(str(e))\n\
                ts = [threading.Thread(target=ask, args=(i,)) for i in range(20)]\n\
                [t.start() for t in ts]\n[t.join() for t in ts]\n(len(refused), refused[0])";
    let flood = flooder.execute(code).await.unwrap();
    // 12 prompts may wait (three batches of four): the other seventeen threads are refused.
    within(async {
        while engine.stats().await.unwrap().llm.unwrap().refused < 17 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    until(|| server.calls().len() >= 3).await;
    assert_eq!(value(&other, "llm_query('hello')").await, "'ok'");
    assert_eq!(
        flood_done.load(Ordering::SeqCst),
        0,
        "served during the flood"
    );
    // The flooder holds no more than its share of the requests in flight.
    assert_eq!(server.calls().len(), 3 + 1);
    release.store(true, Ordering::SeqCst);
    let result = within(flood.result()).await.unwrap();
    let repr = result.result.unwrap().repr;
    assert!(
        repr.starts_with("(17, ") && repr.contains("llm.max_pending"),
        "{repr}"
    );
    assert_eq!(flood_done.load(Ordering::SeqCst), 12);
    assert_eq!(server.most_in_flight(), 4);
    assert_eq!(engine.stats().await.unwrap().llm.unwrap().refused, 17);
}

/// An engine config whose sessions a later engine with the same config restores: a state
/// directory of its own, checkpoints taken only when asked, and `llm` as the engine's bridge.
fn restorable(llm: Option<LlmConfig>) -> EngineConfig {
    let mut config = EngineConfig::default();
    config.pool.min_idle = 1;
    config.llm = llm;
    config.state = pyvisor::StateConfig {
        dir: Some(pyvisor_tests::state_dir()),
        ..pyvisor_tests::manual_checkpoints()
    };
    config
}

/// Shuts `first` down and starts a second engine with `config` (and so its state directory).
async fn restarted(first: Engine, config: EngineConfig) -> Engine {
    within(first.shutdown(Duration::from_secs(5)))
        .await
        .unwrap();
    drop(first);
    engine_with(config).await
}

#[tokio::test]
async fn a_named_session_restored_from_disk_keeps_its_bridge() {
    let server = FakeLlm::start(|call| Reply::text(format!("echo: {}", call.last())));
    let config = restorable(Some(LlmConfig::new(&server.url, "fake-1")));
    let first = engine_with(config.clone()).await;
    for (name, llm) in [("agent", true), ("plain", false)] {
        let options = SessionOptions {
            name: Some(name.into()),
            llm: Some(llm),
            ..SessionOptions::default()
        };
        let session = first.create_session(options).await.unwrap();
        run(&session, "x = 1").await;
    }
    let second = restarted(first, config).await;
    let back = second.session("agent", None).await.unwrap();
    assert!(back.restored());
    assert_eq!(value(&back, "llm_query('again')").await, "'echo: again'");
    let plain = second.session("plain", None).await.unwrap();
    assert!(plain.restored());
    assert_eq!(
        value(&plain, "'llm_query' in dir(__builtins__)").await,
        "False"
    );
}

/// What an embedder's client answers: every prompt echoed, with who answered.
struct Echo(&'static str);

impl pyvisor_actors::bridge::LlmBridge for Echo {
    fn call(
        &self,
        call: pyvisor_actors::bridge::BridgeCall,
    ) -> futures::future::BoxFuture<'static, Result<Vec<String>, pyvisor_actors::bridge::LlmFailure>>
    {
        let answers = (call.prompts.iter())
            .map(|prompt| format!("{}: {prompt}", self.0))
            .collect();
        Box::pin(std::future::ready(Ok(answers)))
    }
}

fn answered_by(who: &'static str, code: &str) -> ExecuteRequest {
    let answerer = pyvisor_actors::bridge::SessionBridge(Arc::new(Echo(who)));
    ExecuteRequest::new(code).with_llm(answerer)
}

#[tokio::test]
async fn a_session_whose_client_answers_asks_the_one_that_runs_each_execution_even_after_a_restore()
{
    // No [llm]: the client-answered bridge needs no endpoint.
    let config = restorable(None);
    let first = engine_with(config.clone()).await;
    let options = SessionOptions {
        name: Some("agent".into()),
        llm_by_client: true,
        ..SessionOptions::default()
    };
    let session = first.create_session(options).await.unwrap();
    let ran = session
        .run(answered_by("first", "llm_query('a')"))
        .await
        .unwrap();
    assert_eq!(ran.result.unwrap().repr, "'first: a'");
    let ran = session
        .run(answered_by("second", "llm_query('b')"))
        .await
        .unwrap();
    assert_eq!(
        ran.result.unwrap().repr,
        "'second: b'",
        "each execution its own client"
    );
    // An execution nobody answers for: LlmError at once, and the session goes on.
    let refused = value(
        &session,
        "try:\n    llm_query('c')\nexcept LlmError as e:\n    r = str(e)\nr",
    )
    .await;
    assert!(refused.contains("no client to answer"), "{refused}");
    let second = restarted(first, config).await;
    let back = second.session("agent", None).await.unwrap();
    assert!(back.restored());
    let ran = back
        .run(answered_by("later", "llm_query('d')"))
        .await
        .unwrap();
    assert_eq!(ran.result.unwrap().repr, "'later: d'");
}
