//! The `/v1/memory` HTTP routes and the memory metrics on a real HTTP server with real Python
//! workers. A test binary of its own: the metrics recorder is process-wide, and the counts
//! checked here must be this test's alone.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use pyvisor::rpc::Dispatcher;
use pyvisor::server::http::{install_prometheus, HttpAccess, HttpOptions, HttpServer};
use pyvisor::{Engine, EngineConfig, SessionLimits, StateConfig};
use pyvisor_actors::memory as names;
use serde_json::{json, Value};

const SETUP: &str = "import pandas as pd\ndf = pd.DataFrame({'a': [1.0, None, 3.0]})";
const FAILING: &str = "df = df.fillna(method='ffill')";

#[actix_rt::test]
async fn memory_routes_over_http_and_metrics() {
    let metrics = install_prometheus().expect("the recorder installs");
    let state_dir = tempfile::Builder::new()
        .prefix("pyvisor-test-state-")
        .tempdir()
        .unwrap()
        .keep();
    let config = EngineConfig {
        state: StateConfig {
            dir: Some(state_dir),
            ..Default::default()
        },
        ..Default::default()
    };
    let engine = Engine::start(config).await.expect("engine starts");
    let dispatcher = Dispatcher::new(engine.clone(), SessionLimits::default());
    let options = HttpOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        token: None,
        access: HttpAccess::default(),
        max_request_bytes: 64 * 1024,
        max_connections: 16,
        metrics: Some(metrics),
        ready: Arc::new(AtomicBool::new(true)),
    };
    let http = HttpServer::start(dispatcher, options).expect("the server binds");
    let url = |path: &str| format!("http://{}{path}", http.local_addr());
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish();
    let post = |path: &str, body: Value| {
        let request = client.post(url(path));
        async move {
            let mut response = request.send_json(&body).await.expect("an answer");
            let status = response.status().as_u16();
            let body: Value = response.json().limit(1 << 20).await.expect("JSON");
            (status, body)
        }
    };
    for _ in 0..3 {
        let (_, created) = post("/v1/sessions", json!({"owner": "carol"})).await;
        let id = created["session_id"].as_str().unwrap().to_owned();
        let execute = format!("/v1/sessions/{id}/execute");
        post(&execute, json!({"code": SETUP})).await;
        let (status, result) = post(&execute, json!({"code": FAILING})).await;
        assert_eq!(status, 200, "{result}");
    }
    let (status, checked) = post(
        "/v1/memory/check",
        json!({"owner": "carol", "code": FAILING}),
    )
    .await;
    assert_eq!(status, 200, "{checked}");
    assert_eq!(
        checked["insights"].as_array().unwrap().len(),
        1,
        "{checked}"
    );
    let (status, found) = post(
        "/v1/memory/search",
        json!({"owner": "carol", "query": FAILING}),
    )
    .await;
    assert_eq!(status, 200, "{found}");
    assert!(!found.as_array().unwrap().is_empty());
    let (status, refused) = post(
        "/v1/memory/feedback",
        json!({"outcome_id": "x-1", "score": 1}),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    let mut response = client
        .get(url("/v1/memory/stats?owner=carol"))
        .send()
        .await
        .unwrap();
    let stats: Value = response.json().await.unwrap();
    assert_eq!(stats["interruptions"], 1, "{stats}");
    assert_eq!(stats["outcomes"], 6, "{stats}");
    let mut response = client.get(url("/metrics")).send().await.unwrap();
    let text = String::from_utf8_lossy(&response.body().await.unwrap()).into_owned();
    for name in [
        names::INTERRUPTIONS_TOTAL,
        names::OUTCOMES_TOTAL,
        names::CHECK_SECONDS,
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert!(
        text.contains("pyvisor_memory_outcomes_total{status=\"error\"} 3"),
        "{text}"
    );
    http.stop(Duration::from_secs(5)).await;
}
