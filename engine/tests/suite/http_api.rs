//! The HTTP server of docs/protocol.md (HTTP) against a real engine with real Python workers, over real
//! HTTP and WebSocket connections on 127.0.0.1.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use metrics_exporter_prometheus::PrometheusHandle;
use pyvisor::rpc::Dispatcher;
use pyvisor::server::http::{install_prometheus, HttpAccess, HttpOptions, HttpServer};
use pyvisor::{Engine, SessionLimits};
use pyvisor_actors::metrics as names;
use serde_json::{json, Value};

mod websocket;

const TOKEN: &str = "s3cret-token";
/// The request limit of the test servers: small, so that an oversize body is cheap to send.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// An engine, a dispatcher over it and an HTTP server in front of them.
struct Server {
    engine: Engine,
    dispatcher: Arc<Dispatcher>,
    http: HttpServer,
    ready: Arc<AtomicBool>,
    token: Option<&'static str>,
}

/// The process-wide recorder, installed before any engine records anything.
fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| install_prometheus().expect("the recorder installs"))
        .clone()
}

async fn start() -> Server {
    start_with(None).await
}

async fn start_with(token: Option<&'static str>) -> Server {
    let metrics = prometheus();
    let config = common::small_engine_config(common::state_dir());
    let engine = Engine::start(config).await.expect("engine starts");
    let dispatcher = Dispatcher::new(engine.clone(), SessionLimits::default());
    let ready = Arc::new(AtomicBool::new(false));
    let options = HttpOptions {
        addr: "127.0.0.1:0".parse().expect("an address"),
        token: token.map(str::to_owned),
        access: HttpAccess::default(),
        max_request_bytes: MAX_REQUEST_BYTES,
        max_connections: 64,
        metrics: Some(metrics),
        ready: ready.clone(),
    };
    let http = HttpServer::start(dispatcher.clone(), options).expect("the server binds");
    Server {
        engine,
        dispatcher,
        http,
        ready,
        token,
    }
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http.local_addr())
    }

    fn ws_url(&self, path: &str) -> String {
        format!("ws://{}{path}", self.http.local_addr())
    }

    /// A client that waits long enough for slow executions and sends the token, if any.
    fn client(&self) -> awc::Client {
        let builder = awc::Client::builder().timeout(Duration::from_secs(60));
        match self.token {
            Some(token) => builder.bearer_auth(token).finish(),
            None => builder.finish(),
        }
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self.client().get(self.url(path)).send().await;
        read(response).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self.client().post(self.url(path)).send_json(&body).await;
        read(response).await
    }

    async fn delete(&self, path: &str) -> (u16, Value) {
        let response = self.client().delete(self.url(path)).send().await;
        read(response).await
    }

    /// Creates a session; returns its id.
    async fn create(&self) -> String {
        let (status, created) = self.post("/v1/sessions", json!({})).await;
        assert_eq!(status, 201, "{created}");
        created["session_id"]
            .as_str()
            .expect("a session id")
            .to_owned()
    }

    async fn execute(&self, id: &str, code: &str) -> Value {
        let path = format!("/v1/sessions/{id}/execute");
        let (status, result) = self.post(&path, json!({"code": code})).await;
        assert_eq!(status, 200, "{result}");
        result
    }

    async fn stop(self) {
        self.http.stop(Duration::from_secs(5)).await;
        drop(self.engine);
    }
}

type Response = Result<awc::ClientResponse, awc::error::SendRequestError>;

/// The status and the JSON body of a response.
async fn read(response: Response) -> (u16, Value) {
    let mut response = response.expect("the server answers");
    let status = response.status().as_u16();
    let body = response.body().await.expect("a body");
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, value)
}

/// Waits until session `id` runs an execution.
async fn wait_until_busy(server: &Server, id: &str) {
    for _ in 0..600 {
        let (_, info) = server.get(&format!("/v1/sessions/{id}")).await;
        if info["state"] == "busy" {
            return;
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("session {id} never became busy");
}

/// The `repr` of an execution's final value.
fn repr(result: &Value) -> &str {
    result["result"]["repr"].as_str().unwrap_or("<none>")
}

#[actix_rt::test]
async fn session_lifecycle_over_rest() {
    let server = start().await;
    let id = server.create().await;

    let first = server.execute(&id, "x = 41").await;
    assert_eq!(first["status"], "ok", "{first}");
    let second = server.execute(&id, "x + 1").await;
    assert_eq!(repr(&second), "42", "{second}");

    let (status, info) = server.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["session_id"], id.as_str());
    assert_eq!(info["execution_count"], 2);

    let (status, list) = server.get("/v1/sessions").await;
    assert_eq!(status, 200, "{list}");
    let ids: Vec<&str> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|info| info["session_id"].as_str())
        .collect();
    assert!(ids.contains(&id.as_str()), "{list}");

    let (status, checkpoint) = server
        .post(&format!("/v1/sessions/{id}/checkpoint"), json!({}))
        .await;
    assert_eq!(status, 200, "{checkpoint}");
    let checkpoint_id = checkpoint["checkpoint_id"]
        .as_str()
        .expect("a checkpoint id");
    let (status, checkpoints) = server.get(&format!("/v1/sessions/{id}/checkpoints")).await;
    assert_eq!(status, 200, "{checkpoints}");
    // Automatic checkpoints may come before or after ours.
    let listed = checkpoints.as_array().expect("a list");
    assert!(
        listed
            .iter()
            .any(|entry| entry["checkpoint_id"] == checkpoint_id),
        "{checkpoints}"
    );

    server.execute(&id, "x = 0").await;
    let (status, restored) = server
        .post(
            &format!("/v1/sessions/{id}/restore"),
            json!({"checkpoint_id": checkpoint_id}),
        )
        .await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(repr(&server.execute(&id, "x").await), "41");

    let (status, closed) = server.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{closed}");
    let (status, _) = server.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 404);
    server.stop().await;
}

#[actix_rt::test]
async fn interrupt_from_a_second_request_stops_a_sleep() {
    let server = start().await;
    let id = server.create().await;
    let client = server.client();
    let execute = client
        .post(server.url(&format!("/v1/sessions/{id}/execute")))
        .send_json(&json!({"code": "import time\ntime.sleep(30)"}));
    let running = actix_rt::spawn(async move { read(execute.await).await });

    // Interrupt once the session runs it: the interrupt frame names the execution, so it
    // stops it whether the worker has started the code yet or not.
    wait_until_busy(&server, &id).await;
    let (status, interrupted) = server
        .post(&format!("/v1/sessions/{id}/interrupt"), json!({}))
        .await;
    assert_eq!(status, 200, "{interrupted}");
    assert_eq!(interrupted["interrupted"], true);

    let (status, result) = running.await.expect("the request task ends");
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["status"], "interrupted", "{result}");
    server.stop().await;
}

#[actix_rt::test]
async fn a_python_error_is_a_result_not_an_http_error() {
    let server = start().await;
    let id = server.create().await;
    let result = server.execute(&id, "1 / 0").await;
    assert_eq!(result["status"], "error");
    assert_eq!(result["error"]["type"], "ZeroDivisionError");
    server.stop().await;
}

#[actix_rt::test]
async fn unknown_session_is_404_with_code_32001() {
    let server = start().await;
    let (status, body) = server.get("/v1/sessions/no-such-session").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], -32001);
    let (status, body) = server
        .post("/v1/sessions/no-such-session/execute", json!({"code": "1"}))
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], -32001);
    server.stop().await;
}

#[actix_rt::test]
async fn malformed_json_body_is_400_parse_error() {
    let server = start().await;
    let response = server
        .client()
        .post(server.url("/v1/sessions"))
        .insert_header(("content-type", "application/json"))
        .send_body("{\"name\": ")
        .await;
    let (status, body) = read(response).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], -32700);

    let (status, body) = server
        .post("/v1/sessions/any/execute", json!({"cod": "1"}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], -32602);
    server.stop().await;
}

#[actix_rt::test]
async fn session_id_in_the_body_must_match_the_path() {
    let server = start().await;
    let id = server.create().await;
    let path = format!("/v1/sessions/{id}/execute");
    let (status, body) = server
        .post(&path, json!({"session_id": "other", "code": "1"}))
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server
        .post(&path, json!({"session_id": id, "code": "1"}))
        .await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

#[actix_rt::test]
async fn oversize_body_is_413() {
    let server = start().await;
    let code = format!("x = '{}'", "a".repeat(MAX_REQUEST_BYTES));
    let (status, body) = server
        .post("/v1/sessions/any/execute", json!({"code": code}))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], -32005);
    server.stop().await;
}

#[actix_rt::test]
async fn token_is_required_on_every_route_when_set() {
    let server = start_with(Some(TOKEN)).await;
    let anonymous = awc::Client::default();
    for path in ["/v1/sessions", "/metrics", "/healthz", "/v1/sessions/s/ws"] {
        let response = anonymous.get(server.url(path)).send().await;
        let challenge = response
            .as_ref()
            .ok()
            .and_then(|response| response.headers().get("www-authenticate").cloned());
        let (status, body) = read(response).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert_eq!(body["error"]["code"], -32007, "{path}");
        assert_eq!(
            challenge.as_ref().and_then(|v| v.to_str().ok()),
            Some("Bearer")
        );
    }
    let wrong = anonymous
        .get(server.url("/v1/sessions"))
        .bearer_auth("s3cret-tokem")
        .send()
        .await;
    assert_eq!(read(wrong).await.0, 401);
    let (status, body) = server.get("/v1/sessions").await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

#[actix_rt::test]
async fn metrics_show_the_spec_names_after_an_execution() {
    let server = start().await;
    let id = server.create().await;
    server.execute(&id, "1 + 1").await;
    server
        .post(&format!("/v1/sessions/{id}/checkpoint"), json!({}))
        .await;
    let mut response = server
        .client()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status().as_u16(), 200);
    let text = String::from_utf8_lossy(&response.body().await.expect("a body")).into_owned();
    for name in [
        names::EXECUTIONS_TOTAL,
        names::EXECUTION_SECONDS,
        names::SESSIONS,
        names::POOL_ACQUIRE_SECONDS,
        names::WORKER_SPAWN_SECONDS,
        names::CHECKPOINT_SECONDS,
        names::CHECKPOINT_BYTES,
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert!(
        text.contains("pyvisor_executions_total{status=\"ok\"}"),
        "{text}"
    );
    assert!(text.contains("pyvisor_execution_seconds_bucket"), "{text}");
    server.stop().await;
}

#[actix_rt::test]
async fn healthz_is_200_and_readyz_follows_the_ready_flag() {
    let server = start().await;
    assert_eq!(server.get("/healthz").await, (200, json!({"status": "ok"})));
    assert_eq!(server.get("/readyz").await.0, 503);
    server.ready.store(true, Ordering::SeqCst);
    assert_eq!(server.get("/readyz").await.0, 200);
    server.dispatcher.set_stopping();
    assert_eq!(server.get("/readyz").await.0, 503);
    assert_eq!(server.get("/healthz").await.0, 200);
    server.stop().await;
}

#[actix_rt::test]
async fn stats_and_health_are_served_under_v1() {
    let server = start().await;
    let (status, stats) = server.get("/v1/stats").await;
    assert_eq!(status, 200, "{stats}");
    assert!(stats["pool"]["max_total"].is_number(), "{stats}");
    let (status, health) = server.get("/v1/health").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["status"], "ok");
    let (status, body) = server.get("/v1/nothing-here").await;
    assert_eq!(status, 404, "{body}");
    server.stop().await;
}

#[actix_rt::test]
async fn stop_lets_a_running_request_finish_within_the_grace() {
    let server = start().await;
    let id = server.create().await;
    let execute = server
        .client()
        .post(server.url(&format!("/v1/sessions/{id}/execute")))
        .send_json(&json!({"code": "import time\ntime.sleep(1)\n'done'"}));
    let running = actix_rt::spawn(async move { read(execute.await).await });
    wait_until_busy(&server, &id).await;
    server.http.stop(Duration::from_secs(30)).await;
    let (status, result) = running.await.expect("the request task ends");
    assert_eq!(status, 200, "{result}");
    assert_eq!(repr(&result), "'done'", "{result}");
}

#[actix_rt::test]
async fn stop_gives_up_on_requests_that_outlast_the_grace() {
    let server = start().await;
    let id = server.create().await;
    let execute = server
        .client()
        .post(server.url(&format!("/v1/sessions/{id}/execute")))
        .send_json(&json!({"code": "import time\ntime.sleep(30)"}));
    let running = actix_rt::spawn(async move { execute.await.map(|r| r.status()) });
    wait_until_busy(&server, &id).await;
    actix_rt::time::timeout(
        Duration::from_secs(20),
        server.http.stop(Duration::from_millis(500)),
    )
    .await
    .expect("stop returns soon after its grace");
    let outcome = actix_rt::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the request is cut off");
    assert!(
        matches!(outcome, Ok(Err(_))),
        "the request should fail: {outcome:?}"
    );
}

#[actix_rt::test]
async fn fork_over_rest_makes_sessions_that_start_from_the_source() {
    let server = start().await;
    let id = server.create().await;
    server.execute(&id, "seen = ['source']").await;
    let path = format!("/v1/sessions/{id}/fork");
    let (status, forked) = server
        .post(&path, json!({"names": ["left", "right"]}))
        .await;
    assert_eq!(status, 200, "{forked}");
    let clones = forked["sessions"].as_array().unwrap();
    assert_eq!(clones.len(), 2);
    assert_eq!(clones[0]["name"], "left");
    assert!(clones[0]["pid"].as_u64().is_some());
    assert!(forked["duration_ms"].as_f64().unwrap() > 0.0);
    // By name, like any session.
    server.execute("left", "seen.append('left')").await;
    assert_eq!(
        repr(&server.execute("left", "seen").await),
        "['source', 'left']"
    );
    assert_eq!(repr(&server.execute("right", "seen").await), "['source']");
    assert_eq!(repr(&server.execute(&id, "seen").await), "['source']");
    // Bad requests are 400 and leave the engine serving.
    for body in [
        json!({"count": 0}),
        json!({"count": 17}),
        json!({"count": 2, "names": ["x"]}),
        json!({"copies": 1}),
    ] {
        let (status, answer) = server.post(&path, body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    let (status, _) = server.post("/v1/sessions/nobody/fork", json!({})).await;
    assert_eq!(status, 404);
    server.stop().await;
}

/// The next line of a streamed (`application/x-ndjson`) answer, as JSON.
async fn next_line(
    response: &mut (impl Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>> + Unpin),
    pending: &mut Vec<u8>,
) -> Value {
    loop {
        if let Some(end) = pending.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            return serde_json::from_slice(&line).expect("a JSON line");
        }
        let chunk = actix_rt::time::timeout(Duration::from_secs(60), response.next())
            .await
            .expect("a line within 60 s")
            .expect("the answer goes on")
            .expect("a readable chunk");
        pending.extend_from_slice(&chunk);
    }
}

#[actix_rt::test]
async fn execute_streams_json_lines_when_asked_and_input_is_answered_over_http() {
    let server = start().await;
    let id = server.create().await;
    let code = "print('a', flush=True)\nname = input('who? ')\nprint('hi', name)";
    let mut response = server
        .client()
        .post(server.url(&format!("/v1/sessions/{id}/execute")))
        .insert_header(("accept", "application/x-ndjson"))
        .send_json(&json!({"code": code}))
        .await
        .expect("the server answers");
    assert_eq!(response.status().as_u16(), 200);
    let kind = response.headers().get("content-type").expect("a type");
    assert_eq!(kind.to_str().unwrap(), "application/x-ndjson");
    let mut pending = Vec::new();
    // The execution waits in input() until it is answered: these lines came while it ran.
    let mut before = String::new();
    let asked = loop {
        let line = next_line(&mut response, &mut pending).await;
        if line["method"] == "session.input_request" {
            break line;
        }
        assert_eq!(line["method"], "session.output", "{line}");
        before.push_str(line["params"]["data"].as_str().expect("text"));
    };
    assert_eq!(before, "a\n");
    let execution = asked["params"]["execution_id"].clone();
    let answer = json!({"execution_id": execution, "value": "ada"});
    let (status, body) = server
        .post(&format!("/v1/sessions/{id}/input"), answer)
        .await;
    assert_eq!(status, 200, "{body}");
    let mut after = String::new();
    let last = loop {
        let line = next_line(&mut response, &mut pending).await;
        if line.get("method").is_none() {
            break line;
        }
        after.push_str(line["params"]["data"].as_str().expect("text"));
    };
    assert_eq!(after, "hi ada\n");
    assert_eq!(last["result"]["status"], "ok", "{last}");
    assert_eq!(last["result"]["execution_id"], execution, "{last}");
    assert!(
        pending.is_empty() && response.next().await.is_none(),
        "the result is last"
    );

    // An error of the call is the last (and only) line.
    let mut response = server
        .client()
        .post(server.url("/v1/sessions/s-missing/execute"))
        .insert_header(("accept", "application/x-ndjson"))
        .send_json(&json!({"code": "1"}))
        .await
        .expect("the server answers");
    let failed = next_line(&mut response, &mut Vec::new()).await;
    assert_eq!(failed["error"]["code"], -32001, "{failed}");
    server.stop().await;
}
