//! Tasks run by a daemon's transports, against a real HTTP server on loopback speaking the
//! OpenAI chat completions API: `/v1/tasks` on a real HTTP server with a token per owner (a
//! task runs and answers its result; another owner can neither see its session nor cancel it;
//! its owner can; a request without a token is refused), and the Rust client's `run_task` on
//! a real Unix socket (what `pyvisor task` does against a daemon), whose steps arrive as they
//! happen and before the result.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyvisor::client::Client;
use pyvisor::rpc::Dispatcher;
use pyvisor::server::http::{HttpAccess, HttpOptions, HttpServer, OwnerToken};
use pyvisor::server::{SocketAccess, UnixServer};
use pyvisor::task::{Budget, TaskKind, TaskRequest, TaskStatus};
use pyvisor::{EngineConfig, LlmConfig, SessionLimits};
use pyvisor_tests::fake_llm::{FakeLlm, Reply};
use pyvisor_tests::{engine_with, within};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request on a connection of its own: the status and the JSON body.
async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let json = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// Ada's rlm task `task_id`, posted on a task of its own: its status and result.
fn start_task(
    addr: std::net::SocketAddr,
    prompt: &str,
    task_id: &str,
) -> tokio::task::JoinHandle<(u16, Value)> {
    let task = json!({"kind": "rlm", "prompt": prompt, "task_id": task_id});
    tokio::spawn(request(
        addr,
        "POST",
        "/v1/tasks",
        Some("tok-ada"),
        Some(task),
    ))
}

/// Waits up to 30 s for `condition`.
async fn until(mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "the condition never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_over_http_belong_to_their_owner() {
    // The model answers once the test lets it.
    let open = Arc::new(AtomicBool::new(false));
    let gate = open.clone();
    let server = FakeLlm::start(move |_| {
        while !gate.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Reply::text("```repl\nFINAL(6 * 7)\n```")
    });
    let mut config = EngineConfig::default();
    config.pool.min_idle = 1;
    config.llm = Some(LlmConfig::new(&server.url, "fake-1"));
    let engine = engine_with(config).await;
    let token = |owner: &str, token: &str| OwnerToken {
        owner: owner.into(),
        token: token.into(),
    };
    let options = HttpOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        token: None,
        access: HttpAccess {
            owner_tokens: vec![token("ada", "tok-ada"), token("bob", "tok-bob")],
            ..HttpAccess::default()
        },
        max_request_bytes: 64 * 1024,
        max_connections: 16,
        metrics: None,
        ready: Arc::new(AtomicBool::new(true)),
    };
    let dispatcher = Dispatcher::new(engine.clone(), SessionLimits::default());
    let http = HttpServer::start(dispatcher, options).expect("the server binds");
    let addr = http.local_addr();

    let running = start_task(addr, "six times seven", "t-ada");
    until(|| !server.calls().is_empty()).await;
    // Bob sees none of ada's sessions and cannot cancel her task.
    let (status, listed) = request(addr, "GET", "/v1/sessions", Some("tok-bob"), None).await;
    assert_eq!(status, 200);
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
    let (_, ada_listed) = request(addr, "GET", "/v1/sessions", Some("tok-ada"), None).await;
    assert_eq!(ada_listed.as_array().map(Vec::len), Some(1), "{ada_listed}");
    let cancel = "/v1/tasks/t-ada/cancel";
    let (status, refused) = request(addr, "POST", cancel, Some("tok-bob"), None).await;
    assert_eq!((status, refused), (200, json!({"cancelled": false})));
    let (status, _) = request(addr, "POST", cancel, None, None).await;
    assert_eq!(status, 401, "no token");
    open.store(true, Ordering::SeqCst);
    let (status, outcome) = within(running).await.unwrap();
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(outcome["status"], "done", "{outcome}");
    assert_eq!(outcome["answer"], "42");
    assert_eq!(outcome["task_id"], "t-ada");

    // Ada cancels her own running task.
    open.store(false, Ordering::SeqCst);
    let calls = server.calls().len();
    let running = start_task(addr, "again", "t-two");
    until(|| server.calls().len() > calls).await;
    let cancel = "/v1/tasks/t-two/cancel";
    let (_, cancelled) = request(addr, "POST", cancel, Some("tok-ada"), None).await;
    assert_eq!(cancelled, json!({"cancelled": true}));
    let (status, outcome) = within(running).await.unwrap();
    assert_eq!((status, &outcome["status"]), (200, &json!("cancelled")));
    open.store(true, Ordering::SeqCst);
    // Bad params are a 400 naming the field.
    let bad = json!({"kind": "sideways", "prompt": "x"});
    let (status, error) = request(addr, "POST", "/v1/tasks", Some("tok-ada"), Some(bad)).await;
    assert_eq!(status, 400, "{error}");
    http.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_runs_a_task_on_the_socket_and_sees_each_step_as_it_happens() {
    let server = FakeLlm::start(|call| {
        let replies = call.messages.iter().filter(|(role, _)| role == "assistant");
        match replies.count() {
            0 => Reply::text("```repl\nprint(len(context))\n```"),
            _ => Reply::text("FINAL(eleven)"),
        }
    });
    let mut config = EngineConfig::default();
    config.pool.min_idle = 1;
    config.llm = Some(LlmConfig::new(&server.url, "fake-1"));
    let engine = engine_with(config).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("pyvisor.sock");
    let unix = Arc::new(UnixServer::bind(&socket, None).await.unwrap());
    let dispatcher = Dispatcher::new(engine.clone(), SessionLimits::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn({
        let unix = unix.clone();
        let access = Arc::new(SocketAccess::default());
        async move { unix.serve(dispatcher, access, 1 << 20, 16, stopped).await }
    });
    let client = Client::connect(&socket).await.unwrap();
    let request = TaskRequest {
        kind: TaskKind::Rlm,
        prompt: "how long is it".into(),
        data: Default::default(),
        context: Some(pyvisor::task::TaskContext::Text("hello world".into())),
        model: None,
        budget: Budget::default(),
        session_id: None,
        task_id: None,
        keep_session: false,
    };
    let (steps, mut stepped) = tokio::sync::mpsc::unbounded_channel();
    let outcome = within(client.run_task(request, steps)).await.unwrap();
    assert_eq!(outcome.status, TaskStatus::Done, "{outcome:#?}");
    assert_eq!(outcome.answer.as_deref(), Some("eleven"));
    let mut roles = Vec::new();
    while let Ok(step) = stepped.try_recv() {
        roles.push(step.role.clone());
        if let Some(run) = step.execution {
            assert_eq!(run.stdout, "11\n");
        }
    }
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(roles.len(), outcome.messages.len());
    stop.send_replace(true);
    drop(client);
    within(serving).await.unwrap();
}
