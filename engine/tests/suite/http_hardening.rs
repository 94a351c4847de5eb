//! The HTTP API under attack, against a real engine over real connections on 127.0.0.1:
//! owner-bound tokens on every route and on the WebSocket, cross-site requests (foreign
//! Origin, `text/plain` bodies), DNS rebinding (foreign Host), a slow client trickling its
//! body or headers, a non-loopback bind without a token, and a token file others could read.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use awc::ws;
use futures::{SinkExt, StreamExt};
use pyvisor::config::{LoadContext, Settings};
use pyvisor::rpc::Dispatcher;
use pyvisor::server::http::{HttpAccess, HttpOptions, HttpServer};
use pyvisor::{Engine, EngineConfig, PoolConfig, SessionLimits, StateConfig};
use serde_json::{json, Value};

const ADMIN: &str = "admin-token";
const ALICE: &str = "alice-token";
const BOB: &str = "bob-token";
/// Short, so that the slow-client tests are quick.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

struct Server {
    engine: Engine,
    http: HttpServer,
}

async fn start() -> Server {
    let config = common::small_engine_config(common::state_dir());
    let engine = Engine::start(config).await.expect("the engine starts");
    let dispatcher = Dispatcher::new(engine.clone(), SessionLimits::default());
    let owner = common::owner_token;
    let options = HttpOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        token: Some(ADMIN.into()),
        access: HttpAccess {
            owner_tokens: vec![owner("alice", ALICE), owner("bob", BOB)],
            allowed_origins: vec!["https://app.example".into()],
            allowed_hosts: vec!["pyvisor.example".into()],
            request_timeout: REQUEST_TIMEOUT,
        },
        max_request_bytes: 64 * 1024,
        max_connections: 64,
        metrics: None,
        ready: Arc::new(AtomicBool::new(true)),
    };
    let http = HttpServer::start(dispatcher, options).expect("the server binds");
    Server { engine, http }
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http.local_addr())
    }

    fn client(&self, token: &str) -> awc::Client {
        common::bearer_client(token)
    }

    /// `method path` with `token` and a JSON body (none for GET and DELETE).
    async fn send(&self, token: &str, method: &str, path: &str, body: Value) -> (u16, Value) {
        let request = self
            .client(token)
            .request(method.parse().unwrap(), self.url(path));
        let response = if matches!(method, "GET" | "DELETE") {
            request.send().await
        } else {
            request.send_json(&body).await
        };
        let mut response = response.expect("the server answers");
        let status = response.status().as_u16();
        let body = response.body().await.expect("a body");
        let value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        (status, value)
    }

    async fn create(&self, token: &str) -> String {
        let (status, created) = self.send(token, "POST", "/v1/sessions", json!({})).await;
        assert_eq!(status, 201, "{created}");
        created["session_id"].as_str().unwrap().to_owned()
    }

    async fn stop(self) {
        self.http.stop(Duration::from_secs(5)).await;
        drop(self.engine);
    }
}

#[actix_rt::test]
async fn an_owner_token_reaches_no_other_owners_session_on_any_route() {
    let server = start().await;
    let bobs = server.create(BOB).await;
    let (_, ran) = server
        .send(
            BOB,
            "POST",
            &format!("/v1/sessions/{bobs}/execute"),
            json!({"code": "secret = 1"}),
        )
        .await;
    assert_eq!(ran["status"], "ok", "{ran}");
    let missing = "s-000000-999";
    for (method, route, body) in [
        ("GET", "", json!(null)),
        ("POST", "/execute", json!({"code": "secret"})),
        (
            "POST",
            "/input",
            json!({"execution_id": "e-1", "value": "x"}),
        ),
        ("POST", "/interrupt", json!({})),
        ("POST", "/checkpoint", json!({})),
        ("POST", "/restore", json!({})),
        ("GET", "/checkpoints", json!(null)),
        ("POST", "/hint", json!({"code": ["secret"]})),
        ("DELETE", "", json!(null)),
    ] {
        let (status, refused) = server
            .send(
                ALICE,
                method,
                &format!("/v1/sessions/{bobs}{route}"),
                body.clone(),
            )
            .await;
        let (_, absent) = server
            .send(
                ALICE,
                method,
                &format!("/v1/sessions/{missing}{route}"),
                body,
            )
            .await;
        assert_eq!(status, 404, "{method} {route}: {refused}");
        assert_eq!(refused["error"]["code"], -32001, "{method} {route}");
        assert_eq!(
            refused["error"]["message"].as_str().unwrap(),
            absent["error"]["message"]
                .as_str()
                .unwrap()
                .replace(missing, &bobs),
            "{method} {route}: reads like a missing session"
        );
    }
    let (status, _) = server
        .send(ALICE, "GET", "/v1/sessions?owner=bob", json!(null))
        .await;
    assert_eq!(status, 401, "naming another owner is -32007");
    let (_, listed) = server.send(ALICE, "GET", "/v1/sessions", json!(null)).await;
    assert_eq!(listed, json!([]), "alice lists nothing of bob's");
    let (_, all) = server.send(ADMIN, "GET", "/v1/sessions", json!(null)).await;
    assert_eq!(all.as_array().unwrap().len(), 1, "the admin token sees all");
    assert_eq!(all[0]["owner"], "bob");

    // The WebSocket: another owner's path is not found; a message about another session
    // than the path's is refused.
    let ws_url = |id: &str| format!("ws://{}/v1/sessions/{id}/ws", server.http.local_addr());
    let refused = server.client(ALICE).ws(ws_url(&bobs)).connect().await;
    match refused {
        Err(awc::error::WsClientError::InvalidResponseStatus(status)) => {
            assert_eq!(status.as_u16(), 404)
        }
        Err(other) => panic!("expected 404, got {other:?}"),
        Ok(_) => panic!("alice opened a WebSocket on bob's session"),
    }
    let alices = server.create(ALICE).await;
    let other_of_alice = server.create(ALICE).await;
    let (_, mut socket) = server
        .client(ALICE)
        .ws(ws_url(&alices))
        .connect()
        .await
        .expect("alice's own WebSocket connects");
    for (id, target, code) in [(1, &bobs, -32001), (2, &other_of_alice, -32602)] {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "session.execute",
            "params": {"session_id": target, "code": "1"}});
        socket
            .send(ws::Message::Text(message.to_string().into()))
            .await
            .unwrap();
        let reply = loop {
            match socket.next().await.expect("open").expect("a frame") {
                ws::Frame::Text(text) => break serde_json::from_slice::<Value>(&text).unwrap(),
                ws::Frame::Ping(bytes) => socket.send(ws::Message::Pong(bytes)).await.unwrap(),
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_eq!(reply["error"]["code"], code, "{reply}");
    }
    // Bob's session is untouched and serves him.
    let (_, after) = server
        .send(
            BOB,
            "POST",
            &format!("/v1/sessions/{bobs}/execute"),
            json!({"code": "secret"}),
        )
        .await;
    assert_eq!(after["result"]["repr"], "1", "{after}");
    server.stop().await;
}

#[actix_rt::test]
async fn cross_site_requests_and_foreign_hosts_are_refused() {
    let server = start().await;
    let url = server.url("/v1/sessions");
    // What a web page can send without asking: a text/plain POST, from its own Origin.
    let page = server
        .client(ADMIN)
        .post(&url)
        .insert_header(("Origin", "https://evil.example"))
        .insert_header(("Content-Type", "text/plain"))
        .send_body(r#"{"name": "pwned"}"#)
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 403);
    let no_origin = server
        .client(ADMIN)
        .post(&url)
        .insert_header(("Content-Type", "text/plain"))
        .send_body(r#"{"name": "pwned"}"#)
        .await
        .unwrap();
    assert_eq!(no_origin.status().as_u16(), 415);
    let form = server
        .client(ADMIN)
        .post(&url)
        .insert_header(("Content-Type", "application/x-www-form-urlencoded"))
        .send_body("name=pwned")
        .await
        .unwrap();
    assert_eq!(form.status().as_u16(), 415);
    // DNS rebinding: the page's name resolves to 127.0.0.1, the Host header still says it.
    let rebound = server
        .client(ADMIN)
        .get(server.url("/v1/sessions"))
        .insert_header(("Host", "evil.example:8787"))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status().as_u16(), 421);
    // Allowed names and origins pass.
    let allowed = server
        .client(ADMIN)
        .get(server.url("/v1/sessions"))
        .insert_header(("Host", "pyvisor.example"))
        .insert_header(("Origin", "https://app.example"))
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status().as_u16(), 200);
    let (_, listed) = server.send(ADMIN, "GET", "/v1/sessions", json!(null)).await;
    assert_eq!(listed, json!([]), "no refused request created anything");
    // Duplicate keys are refused, naming the key.
    let duplicate = server
        .client(ADMIN)
        .post(&url)
        .content_type("application/json")
        .send_body(r#"{"name": "a", "name": "b"}"#)
        .await
        .unwrap();
    assert_eq!(duplicate.status().as_u16(), 400);
    server.stop().await;
}

#[actix_rt::test]
async fn a_trickled_body_or_header_is_cut_off() {
    let server = start().await;
    let head = format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: 64\r\n\r\n{{"
    );
    let parts: Vec<&[u8]> = vec![b" "; 60];
    let (answer, took) = actix_rt::task::spawn_blocking({
        let addr = server.http.local_addr();
        move || RawTarget(addr).raw(&head, &parts, Duration::from_millis(100))
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        took < REQUEST_TIMEOUT * 4,
        "cut off after {took:?}, the timeout is {REQUEST_TIMEOUT:?}"
    );
    // Headers that never end.
    let (answer, took) = actix_rt::task::spawn_blocking({
        let addr = server.http.local_addr();
        move || RawTarget(addr).raw("GET /healthz HTTP/1.1\r\nHost: 127", &[], Duration::ZERO)
    })
    .await
    .unwrap();
    assert!(
        took < REQUEST_TIMEOUT * 4,
        "cut off after {took:?}: {answer}"
    );
    // And the server still serves.
    let (status, _) = server.send(ADMIN, "GET", "/v1/sessions", json!(null)).await;
    assert_eq!(status, 200);
    server.stop().await;
}

/// Raw requests, off the async runtime (they block).
struct RawTarget(std::net::SocketAddr);

impl RawTarget {
    /// Sends `head`, then each of `body_parts` after `pause`; the whole answer (until the
    /// server closes) and how long it took.
    fn raw(&self, head: &str, body_parts: &[&[u8]], pause: Duration) -> (String, Duration) {
        let mut stream = TcpStream::connect(self.0).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let started = Instant::now();
        stream.write_all(head.as_bytes()).unwrap();
        for part in body_parts {
            std::thread::sleep(pause);
            if stream.write_all(part).is_err() {
                break;
            }
        }
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        (
            String::from_utf8_lossy(&answer).into_owned(),
            started.elapsed(),
        )
    }
}

#[actix_rt::test]
async fn a_public_address_without_a_token_does_not_start() {
    let state = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineConfig {
        pool: PoolConfig {
            min_idle: 0,
            ..PoolConfig::default()
        },
        state: StateConfig {
            dir: Some(state.path().to_owned()),
            ..StateConfig::default()
        },
        ..EngineConfig::default()
    })
    .await
    .unwrap();
    let options = HttpOptions {
        addr: "0.0.0.0:0".parse().unwrap(),
        token: None,
        access: HttpAccess::default(),
        max_request_bytes: 1024,
        max_connections: 4,
        metrics: None,
        ready: Arc::new(AtomicBool::new(true)),
    };
    let dispatcher = Dispatcher::new(engine, SessionLimits::default());
    match HttpServer::start(dispatcher, options) {
        Err(err) => {
            let message = err.to_string();
            assert!(message.contains("0.0.0.0:0"), "{message}");
            assert!(message.contains("server.token"), "{message}");
        }
        Ok(_) => panic!("served 0.0.0.0 without a token"),
    }
}

#[test]
fn a_token_file_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("alice.token");
    std::fs::write(&token_file, "alice-token\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.path().join("pyvisor.toml");
    std::fs::write(
        &config,
        format!(
            "[[server.tokens]]\nowner = \"alice\"\ntoken_file = \"{}\"\n",
            token_file.display()
        ),
    )
    .unwrap();
    let ctx = LoadContext {
        vars: Default::default(),
        cwd: dir.path().to_owned(),
        system_file: dir.path().join("none.toml"),
    };
    let err = Settings::load_with(Some(&config), &ctx)
        .expect_err("a 0644 token file is refused")
        .to_string();
    assert!(err.contains("server.tokens"), "{err}");
    assert!(err.contains(&token_file.display().to_string()), "{err}");
    assert!(err.contains("0644"), "{err}");

    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let loaded = Settings::load_with(Some(&config), &ctx).expect("0600 is fine");
    let access = loaded.settings.server.http_access().unwrap();
    assert_eq!(access.owner_tokens[0].owner, "alice");
    assert_eq!(access.owner_tokens[0].token, "alice-token");
}
