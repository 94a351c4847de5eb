//! The files API of docs/protocol.md (`session.files.*` and the HTTP file routes) against real
//! sandboxed workers with uids of their own, over JSON-RPC (the dispatcher every transport
//! uses) and real HTTP on 127.0.0.1: round trips both ways, byte ranges, every path escape (`..`,
//! absolute, a symlink to /etc, a symlink swapped in while the client reads), the size and
//! disk limits, and owners that cannot reach each other's files.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use pyvisor::rpc::{code, Caller, Dispatcher, Outbound};
use pyvisor::server::http::{HttpAccess, HttpOptions, HttpServer};
use pyvisor::{Engine, EngineConfig, SandboxConfig, SessionLimits};
use serde_json::{json, Value};

/// An interpreter every session uid can run (the test's own may live under /root, 0700).
const PYTHON: &str = "/usr/bin/python3";
const ALICE: &str = "alice-token";
const BOB: &str = "bob-token";

struct Server {
    _engine: Engine,
    dispatcher: Arc<Dispatcher>,
    http: HttpServer,
}

/// An engine whose workers each run as a uid of `first_uid..first_uid+9`, with an HTTP server
/// that knows the owners alice and bob by their tokens.
async fn start(first_uid: u32) -> Server {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the files API is tested as root with uid separation, as CI runs"
    );
    let state = common::state_dir();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let config = EngineConfig {
        python: PYTHON.into(),
        sandbox: SandboxConfig {
            uid_range: Some(first_uid..=first_uid + 9),
            landlock: true,
            ..SandboxConfig::default()
        },
        ..common::small_engine_config(state)
    };
    let engine = Engine::start(config).await.expect("engine starts");
    let dispatcher = Dispatcher::new(engine.clone(), SessionLimits::default());
    let owner = common::owner_token;
    let options = HttpOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        token: None,
        access: HttpAccess {
            owner_tokens: vec![owner("alice", ALICE), owner("bob", BOB)],
            ..HttpAccess::default()
        },
        max_request_bytes: 64 * 1024,
        max_connections: 16,
        metrics: None,
        ready: Default::default(),
    };
    let http = HttpServer::start(dispatcher.clone(), options).expect("the server binds");
    Server {
        _engine: engine,
        dispatcher,
        http,
    }
}

impl Server {
    /// `method` as `owner` over JSON-RPC: the result, or the error's code and message.
    async fn call(&self, owner: &str, method: &str, params: Value) -> Result<Value, (i64, String)> {
        let (caller, out) = (Caller::owner(owner), Outbound::closed());
        let call = self.dispatcher.call(&caller, method, Some(params), &out);
        match tokio::time::timeout(Duration::from_secs(60), call).await {
            Ok(Ok(raw)) => Ok(serde_json::from_str(raw.get()).unwrap()),
            Ok(Err(err)) => Err((err.code, err.message)),
            Err(_) => panic!("{method} did not answer within 60 s"),
        }
    }

    async fn ok(&self, owner: &str, method: &str, params: Value) -> Value {
        self.call(owner, method, params.clone())
            .await
            .unwrap_or_else(|err| panic!("{method} {params}: {err:?}"))
    }

    async fn code(&self, owner: &str, method: &str, params: Value) -> i64 {
        match self.call(owner, method, params.clone()).await {
            Ok(result) => panic!("{method} {params} succeeded: {result}"),
            Err((code, _)) => code,
        }
    }

    /// A new session of `owner` with `limits`; its id.
    async fn create(&self, owner: &str, limits: Value) -> String {
        let created = self
            .ok(owner, "session.create", json!({"limits": limits}))
            .await;
        created["session_id"].as_str().unwrap().to_owned()
    }

    /// Runs `code` (ending in an expression) in `session`; its repr.
    async fn value(&self, session: &str, code: &str) -> String {
        let params = json!({"session_id": session, "code": code});
        let result = self.ok("alice", "session.execute", params).await;
        assert_eq!(result["status"], "ok", "{code}: {result}");
        result["result"]["repr"].as_str().unwrap().to_owned()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http.local_addr())
    }

    fn client(&self, token: &str) -> awc::Client {
        common::bearer_client(token)
    }
}

async fn body(
    response: &mut awc::ClientResponse<
        impl futures::Stream<Item = Result<bytes::Bytes, awc::error::PayloadError>> + Unpin,
    >,
) -> Vec<u8> {
    response
        .body()
        .limit(64 << 20)
        .await
        .expect("a body")
        .to_vec()
}

#[actix_rt::test]
async fn files_go_both_ways_over_json_rpc_and_http_and_belong_to_the_session() {
    let server = start(62_700).await;
    let id = server.create("alice", json!({})).await;
    // JSON-RPC: base64 in, the session's code sees it, as a file its own uid owns.
    let written = server
        .ok(
            "alice",
            "session.files.write",
            json!({"session_id": id, "path": "in/data.csv", "data": STANDARD.encode("a,b\n1,2\n")}),
        )
        .await;
    assert_eq!(written["size"], 8);
    let seen = server
        .value(
            &id,
            "import os\nst = os.stat('in/data.csv')\n(open('in/data.csv').read(), st.st_uid == os.getuid())",
        )
        .await;
    assert_eq!(seen, "('a,b\\n1,2\\n', True)");
    let appended = server
        .ok(
            "alice",
            "session.files.write",
            json!({"session_id": id, "path": "in/data.csv", "data": STANDARD.encode("3,4\n"), "append": true}),
        )
        .await;
    assert_eq!(appended["size"], 12);

    // HTTP: 3 MiB up in many chunks, read back in ranges over JSON-RPC.
    let big: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = big
        .chunks(100_000)
        .map(|chunk| Ok(bytes::Bytes::copy_from_slice(chunk)))
        .collect();
    let mut response = server
        .client(ALICE)
        .put(server.url(&format!("/v1/sessions/{id}/files/out/big.bin")))
        .content_type("application/octet-stream")
        .send_stream(futures::stream::iter(chunks))
        .await
        .expect("the upload is answered");
    assert_eq!(response.status(), 200);
    let answer: Value = serde_json::from_slice(&body(&mut response).await).unwrap();
    assert_eq!(answer["size"], big.len());
    let mut back = Vec::new();
    loop {
        let part = server
            .ok(
                "alice",
                "session.files.read",
                json!({"session_id": id, "path": "out/big.bin", "offset": back.len(), "length": 1_000_000}),
            )
            .await;
        back.extend(STANDARD.decode(part["data"].as_str().unwrap()).unwrap());
        assert_eq!(part["size"], big.len());
        if part["eof"] == true {
            break;
        }
    }
    assert!(back == big, "the ranges read back differ from the upload");

    // What the session's code writes comes down over HTTP, whole.
    server
        .value(
            &id,
            "open('made.bin', 'wb').write(bytes(range(256)) * 4096)",
        )
        .await;
    let mut response = server
        .client(ALICE)
        .get(server.url(&format!("/v1/sessions/{id}/files/made.bin")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let expected: Vec<u8> = (0..=255u8).cycle().take(256 * 4096).collect();
    assert!(body(&mut response).await == expected);

    // Listings, over both, and a removal.
    let listed = server
        .ok("alice", "session.files.list", json!({"session_id": id}))
        .await;
    let names: Vec<(&str, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("in", "dir"), ("made.bin", "file"), ("out", "dir")]);
    server
        .ok(
            "alice",
            "session.files.remove",
            json!({"session_id": id, "path": "out/big.bin"}),
        )
        .await;
    let mut response = server
        .client(ALICE)
        .get(server.url(&format!("/v1/sessions/{id}/files?dir=out")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let out: Value = serde_json::from_slice(&body(&mut response).await).unwrap();
    assert_eq!(
        out,
        json!([]),
        "nothing left of the upload, no temporary file either"
    );
    let missing = server
        .code(
            "alice",
            "session.files.read",
            json!({"session_id": id, "path": "out/big.bin"}),
        )
        .await;
    assert_eq!(missing, code::INVALID_PARAMS);
}

#[actix_rt::test]
async fn a_download_sends_the_one_byte_range_asked_for() {
    let server = start(62_770).await;
    let id = server.create("alice", json!({})).await;
    server
        .value(&id, "open('f.bin', 'wb').write(bytes(range(256)) * 4096)")
        .await;
    let file: Vec<u8> = (0..=255u8).cycle().take(256 * 4096).collect();
    let size = file.len();
    let url = server.url(&format!("/v1/sessions/{id}/files/f.bin"));
    let get = |range: Option<&'static str>, if_range: bool| {
        let mut request = server.client(ALICE).get(&url);
        if let Some(range) = range {
            request = request.insert_header(("Range", range));
        }
        if if_range {
            request = request.insert_header(("If-Range", "\"some-etag\""));
        }
        async move {
            let mut response = request.send().await.expect("answered");
            let header =
                |name: &str| (response.headers().get(name)).map(|v| v.to_str().unwrap().to_owned());
            let (range, accepts) = (header("content-range"), header("accept-ranges"));
            (
                response.status().as_u16(),
                range,
                accepts,
                body(&mut response).await,
            )
        }
    };

    let (status, range, accepts, whole) = get(None, false).await;
    assert_eq!(
        (status, range, accepts.as_deref()),
        (200, None, Some("bytes"))
    );
    assert!(whole == file);
    let cases = [
        ("bytes=1000-1999", 1000..2000),
        ("bytes=-10", size - 10..size),
        ("bytes=1048000-", 1_048_000..size),
        // An end past the file is cut to the file.
        ("bytes=1048500-9999999", 1_048_500..size),
    ];
    for (asked, expected) in cases {
        let (status, range, _, part) = get(Some(asked), false).await;
        assert_eq!(status, 206, "{asked}");
        let content_range = format!("bytes {}-{}/{size}", expected.start, expected.end - 1);
        assert_eq!(range.as_deref(), Some(content_range.as_str()), "{asked}");
        assert!(part == file[expected], "{asked}: other bytes");
    }
    // Past the end: 416, with the size.
    let (status, range, _, refused) = get(Some("bytes=2000000-2000010"), false).await;
    assert_eq!(status, 416);
    assert_eq!(range.as_deref(), Some("bytes */1048576"));
    let refused: Value = serde_json::from_slice(&refused).unwrap();
    assert_eq!(refused["error"]["code"], code::INVALID_PARAMS);
    // Several ranges, a conditional range and a malformed one: the whole file.
    for (asked, if_range) in [
        ("bytes=0-1,5-6", false),
        ("bytes=0-9", true),
        ("bytes=9-0", false),
        ("lines=1-2", false),
    ] {
        let (status, range, _, whole) = get(Some(asked), if_range).await;
        assert_eq!((status, range), (200, None), "{asked}");
        assert!(whole == file, "{asked}");
    }
}

#[actix_rt::test]
async fn every_path_escape_is_refused_with_invalid_params() {
    let server = start(62_710).await;
    let id = server.create("alice", json!({})).await;
    server
        .value(
            &id,
            "import os\nos.symlink('/etc', 'etc')\nos.symlink('/etc/passwd', 'pw')\nos.symlink('../../../../etc/passwd', 'up')\nos.mkfifo('fifo')\nopen('ok.txt', 'w').write('fine')\nos.symlink('ok.txt', 'alias')\nopen('twice', 'w').write('x')\nos.link('twice', 'hard')\n1",
        )
        .await;
    let escapes = [
        "../x",
        "a/../../x",
        "/etc/passwd",
        "etc/passwd",
        "pw",
        "up",
        "fifo",
        "hard",
    ];
    for path in escapes {
        let params = json!({"session_id": id, "path": path});
        let code = server
            .code("alice", "session.files.read", params.clone())
            .await;
        assert_eq!(code, code::INVALID_PARAMS, "read {path}");
        let write =
            json!({"session_id": id, "path": path, "data": STANDARD.encode("x"), "append": true});
        let code = server.code("alice", "session.files.write", write).await;
        assert_eq!(code, code::INVALID_PARAMS, "write {path}");
    }
    for path in ["../x", "/tmp", "etc"] {
        let code = server
            .code(
                "alice",
                "session.files.list",
                json!({"session_id": id, "path": path}),
            )
            .await;
        assert_eq!(code, code::INVALID_PARAMS, "list {path}");
    }
    // A write through the link to /etc is refused, and /etc is untouched.
    let write =
        json!({"session_id": id, "path": "etc/pyvisor-escape", "data": STANDARD.encode("x")});
    assert_eq!(
        server.code("alice", "session.files.write", write).await,
        code::INVALID_PARAMS
    );
    assert!(!std::path::Path::new("/etc/pyvisor-escape").exists());
    // Removing the link removes the link, not its target.
    server
        .ok(
            "alice",
            "session.files.remove",
            json!({"session_id": id, "path": "pw"}),
        )
        .await;
    assert!(std::path::Path::new("/etc/passwd").exists());
    // A symlink that stays inside is followed.
    let read = server
        .ok(
            "alice",
            "session.files.read",
            json!({"session_id": id, "path": "alias"}),
        )
        .await;
    assert_eq!(
        STANDARD.decode(read["data"].as_str().unwrap()).unwrap(),
        b"fine"
    );
    // Over HTTP too: 400 for the escapes (actix folds a literal `..` in the URL path itself).
    for path in ["etc/passwd", "pw", "%2E%2E/x"] {
        let response = server
            .client(ALICE)
            .get(server.url(&format!("/v1/sessions/{id}/files/{path}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "GET {path}");
    }
}

#[actix_rt::test]
async fn a_symlink_swapped_in_while_the_client_reads_never_leads_out() {
    let server = start(62_720).await;
    let id = server.create("alice", json!({})).await;
    // A thread of the session swaps the directory `d` (holding its own `passwd`) for a
    // symlink to /etc and back, as fast as it can, until told to stop.
    server
        .value(
            &id,
            r#"
import os, threading
os.mkdir('real')
open('real/passwd', 'w').write('session-owned')
stop = threading.Event()
def swap():
    while not stop.is_set():
        try:
            os.symlink('/etc', 'tmp-link'); os.replace('tmp-link', 'd')
        except OSError:
            pass
        try:
            os.unlink('d'); os.symlink('real', 'd')
        except OSError:
            pass
threading.Thread(target=swap, daemon=True).start()
1"#,
        )
        .await;
    let (mut served, mut refused) = (0, 0);
    for _ in 0..300 {
        let read = server
            .call(
                "alice",
                "session.files.read",
                json!({"session_id": id, "path": "d/passwd"}),
            )
            .await;
        match read {
            Ok(read) => {
                let data = STANDARD.decode(read["data"].as_str().unwrap()).unwrap();
                assert_eq!(
                    data, b"session-owned",
                    "only the session's own file is ever served"
                );
                served += 1;
            }
            Err((code, message)) => {
                assert_eq!(code, code::INVALID_PARAMS, "{message}");
                refused += 1;
            }
        }
    }
    server.value(&id, "stop.set()\n1").await;
    // Both states were met: `d` -> `real` stays inside (served), `d` -> /etc does not.
    assert!(
        served > 0,
        "no read was served while the link pointed inside"
    );
    assert!(
        refused > 0,
        "no read met the link to /etc: the attack never ran"
    );
}

#[actix_rt::test]
async fn file_and_disk_limits_refuse_with_limit_exceeded() {
    let server = start(62_730).await;
    let id = server
        .create("alice", json!({"file_bytes": 1000, "disk_mb": 1}))
        .await;
    let write = |path: &str, len: usize, append: bool| json!({"session_id": id, "path": path, "data": STANDARD.encode(vec![7u8; len]), "append": append});
    server
        .ok("alice", "session.files.write", write("a", 1000, false))
        .await;
    let over = server
        .code("alice", "session.files.write", write("b", 1001, false))
        .await;
    assert_eq!(over, code::LIMIT_EXCEEDED);
    let appended = server
        .code("alice", "session.files.write", write("a", 1, true))
        .await;
    assert_eq!(appended, code::LIMIT_EXCEEDED);
    // Over HTTP, streamed: refused part way, and nothing is left behind.
    let response = server
        .client(ALICE)
        .put(server.url(&format!("/v1/sessions/{id}/files/c")))
        .content_type("application/octet-stream")
        .send_body(vec![1u8; 5000])
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    // The disk: the session's code fills it nearly, then the API may not pass 1 MiB.
    server
        .value(&id, "open('fill', 'wb').write(b'x' * (1024 * 1024 - 1500))")
        .await;
    let listed = server
        .ok("alice", "session.files.list", json!({"session_id": id}))
        .await;
    let used: u64 = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["size"].as_u64().unwrap())
        .sum();
    assert_eq!(used, 1024 * 1024 - 500, "{listed}");
    server
        .ok("alice", "session.files.write", write("d", 500, false))
        .await;
    let full = server
        .code("alice", "session.files.write", write("e", 600, false))
        .await;
    assert_eq!(full, code::LIMIT_EXCEEDED);
    // Replacing a file counts only the difference.
    server
        .ok("alice", "session.files.write", write("d", 450, false))
        .await;
    let grown = server
        .code("alice", "session.files.write", write("d", 551, false))
        .await;
    assert_eq!(grown, code::LIMIT_EXCEEDED);
    let listed = server
        .ok("alice", "session.files.list", json!({"session_id": id}))
        .await;
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "d", "fill"]);
    // Limits above the ceilings are refused at create.
    let too_big = server
        .code(
            "alice",
            "session.create",
            json!({"limits": {"file_bytes": 1u64 << 40}}),
        )
        .await;
    assert_eq!(too_big, code::INVALID_PARAMS);
}

#[actix_rt::test]
async fn one_owner_cannot_reach_another_owners_files() {
    let server = start(62_740).await;
    let id = server.create("alice", json!({})).await;
    let params = json!({"session_id": id, "path": "secret", "data": STANDARD.encode("alice's")});
    server
        .ok("alice", "session.files.write", params.clone())
        .await;
    for (method, params) in [
        (
            "session.files.read",
            json!({"session_id": id, "path": "secret"}),
        ),
        ("session.files.write", params),
        ("session.files.list", json!({"session_id": id})),
        (
            "session.files.remove",
            json!({"session_id": id, "path": "secret"}),
        ),
    ] {
        assert_eq!(
            server.code("bob", method, params).await,
            code::UNKNOWN_SESSION,
            "{method}"
        );
    }
    let fork = json!({"session_id": id});
    assert_eq!(
        server.code("bob", "session.fork", fork).await,
        code::UNKNOWN_SESSION
    );
    let bob = server.client(BOB);
    let url = server.url(&format!("/v1/sessions/{id}/files/secret"));
    assert_eq!(bob.get(&url).send().await.unwrap().status(), 404);
    assert_eq!(bob.delete(&url).send().await.unwrap().status(), 404);
    let put = bob
        .put(&url)
        .content_type("application/octet-stream")
        .send_body("bob's")
        .await
        .unwrap();
    assert_eq!(put.status(), 404);
    let list = server.url(&format!("/v1/sessions/{id}/files"));
    assert_eq!(bob.get(&list).send().await.unwrap().status(), 404);
    // Alice's file is as she left it.
    let mut response = server.client(ALICE).get(&url).send().await.unwrap();
    assert_eq!(body(&mut response).await, b"alice's");
}
