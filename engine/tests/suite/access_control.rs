//! Who the caller is on the Unix socket, and what it may reach: real daemons, real sockets,
//! and clients that really run under other uids (a small Python relay started with
//! setgid/setuid), as an attacker on the same host would.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use pyvisor::rpc::{Caller, Dispatcher};
use pyvisor::server::{SocketAccess, UnixServer};
use pyvisor::{Engine, EngineConfig, PoolConfig, SessionLimits, StateConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The group allowed on the socket, and the uids of the test's users (no passwd entries).
const GROUP: u32 = 62001;
const ALICE: u32 = 62001;
const BOB: u32 = 62002;
const OPERATOR: u32 = 62003;

/// Relays JSON lines between its stdin/stdout and the socket `argv[1]`; exits when the
/// daemon closes the connection.
const RELAY: &str = r#"
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def send():
    for line in sys.stdin.buffer:
        s.sendall(line)
threading.Thread(target=send, daemon=True).start()
for line in s.makefile("rb"):
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
os._exit(0)
"#;

/// A JSON-RPC client running as another uid.
struct AsUser {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl AsUser {
    fn connect(socket: &Path, uid: u32) -> AsUser {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(RELAY)
            .arg(socket)
            .uid(uid)
            .gid(GROUP)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the relay");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        AsUser {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            next_id: 0,
        }
    }

    /// The next line from the daemon; `None` once it closed the connection.
    async fn read(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("the daemon answers within 60 s")
            .expect("read from the relay")?;
        Some(serde_json::from_str(&line).expect("JSON lines"))
    }

    /// The whole response to one request.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut bytes = serde_json::to_vec(&line).unwrap();
        bytes.push(b'\n');
        self.stdin
            .write_all(&bytes)
            .await
            .expect("write to the relay");
        loop {
            let message = self.read().await.expect("the daemon closed the connection");
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let response = self.request(method, params).await;
        match response.get("result") {
            Some(result) => result.clone(),
            None => panic!("{method} failed: {response}"),
        }
    }

    /// The error of a request that must fail.
    async fn error(&mut self, method: &str, params: Value) -> (i64, String) {
        let response = self.request(method, params).await;
        let code = response["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{method} should fail: {response}"));
        let message = response["error"]["message"].as_str().unwrap().to_owned();
        (code, message)
    }
}

impl Drop for AsUser {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A daemon whose socket the group [`GROUP`] may use, with [`OPERATOR`] as an admin.
async fn shared_daemon(home: &Path) -> Daemon {
    // The test's temp dir is root's 0700: let the other uids through to the socket's dir.
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o711)).unwrap();
    let config = home.join("config/pyvisor");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        format!(
            "[pool]\nmin_idle = 1\n[server]\nsocket_group = \"{GROUP}\"\nadmin_uids = [{OPERATOR}]\n"
        ),
    )
    .unwrap();
    Daemon::start_in(home, &[], &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_reaches_only_its_own_sessions() {
    let home = tempfile::tempdir().unwrap();
    let daemon = shared_daemon(home.path()).await;
    let mode = std::fs::metadata(&daemon.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o660,
        "the socket is shared with its group only"
    );
    let mut alice = AsUser::connect(&daemon.socket, ALICE);
    let mut bob = AsUser::connect(&daemon.socket, BOB);

    let created = alice.call("session.create", json!({"name": "work"})).await;
    let theirs = created["session_id"].as_str().unwrap().to_owned();
    let info = alice
        .call("session.info", json!({"session_id": theirs}))
        .await;
    assert_eq!(info["owner"], "uid:62001", "the owner is the peer's user");
    alice
        .call(
            "session.execute",
            json!({"session_id": theirs, "code": "secret = 42"}),
        )
        .await;

    // Bob's "work" is his own: names are per owner.
    let own = bob.call("session.create", json!({"name": "work"})).await;
    let own = own["session_id"].as_str().unwrap().to_owned();
    assert_ne!(own, theirs);
    assert_eq!(own.len(), theirs.len());

    // Every method answers for alice's session exactly as for one that does not exist.
    let missing = format!("{}9", &theirs[..theirs.len() - 1]);
    let missing = if missing == theirs {
        format!("{theirs}0")
    } else {
        missing
    };
    let attempts = |id: &str| {
        vec![
            (
                "session.execute",
                json!({"session_id": id, "code": "print(secret)"}),
            ),
            (
                "session.input",
                json!({"session_id": id, "execution_id": "e-1", "value": "x"}),
            ),
            ("session.interrupt", json!({"session_id": id})),
            ("session.info", json!({"session_id": id})),
            ("session.checkpoint", json!({"session_id": id})),
            ("session.restore", json!({"session_id": id})),
            ("session.checkpoints", json!({"session_id": id})),
            (
                "session.hint",
                json!({"session_id": id, "code": ["secret"]}),
            ),
            (
                "memory.check",
                json!({"session_id": id, "code": "print(secret)"}),
            ),
            ("session.close", json!({"session_id": id})),
        ]
    };
    for ((method, attack), (_, probe)) in attempts(&theirs).into_iter().zip(attempts(&missing)) {
        let (code, message) = bob.error(method, attack).await;
        let (missing_code, missing_message) = bob.error(method, probe).await;
        assert_eq!(code, -32001, "{method}: {message}");
        assert_eq!(missing_code, -32001, "{method}");
        assert_eq!(
            message,
            missing_message.replace(&missing, &theirs),
            "{method}: another owner's session must read like a missing one"
        );
    }
    // Naming another owner is refused outright.
    for (method, params) in [
        ("session.create", json!({"owner": "uid:62001"})),
        ("session.list", json!({"owner": "uid:62001"})),
        (
            "session.info",
            json!({"session_id": theirs, "owner": "uid:62001"}),
        ),
        ("memory.check", json!({"owner": "uid:62001", "code": "x"})),
        (
            "memory.search",
            json!({"owner": "uid:62001", "query": "secret = 42"}),
        ),
        ("memory.stats", json!({"owner": "uid:62001"})),
    ] {
        assert_eq!(bob.error(method, params).await.0, -32007, "{method}");
    }
    // Without an owner, memory answers for bob's own outcomes only.
    let found = bob
        .call("memory.search", json!({"query": "secret = 42"}))
        .await;
    assert_eq!(found, json!([]), "{found}");
    let stats = bob.call("memory.stats", json!({})).await;
    assert_eq!(stats["outcomes"], 0, "{stats}");
    let listed = bob.call("session.list", json!({})).await;
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|info| info["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [own.as_str()], "bob lists only his own");

    // Alice's session is untouched and still serves her.
    let result = alice
        .call(
            "session.execute",
            json!({"session_id": theirs, "code": "secret"}),
        )
        .await;
    assert_eq!(result["result"]["repr"], "42", "{result}");

    // Admins: root and server.admin_uids see all, and `owner` confines them.
    let mut root = daemon.connect().await;
    let mut operator = AsUser::connect(&daemon.socket, OPERATOR);
    for all in [
        root.call("session.list", json!({})).await,
        operator.call("session.list", json!({})).await,
    ] {
        assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
    }
    let confined = root
        .call("session.list", json!({"owner": "uid:62001"}))
        .await;
    assert_eq!(confined.as_array().unwrap().len(), 1);
    assert_eq!(confined[0]["session_id"], theirs.as_str());
    let code = root
        .error_code(
            "session.info",
            json!({"session_id": own, "owner": "uid:62001"}),
        )
        .await;
    assert_eq!(
        code, -32001,
        "an admin acting for alice does not reach bob's"
    );
    let made = root
        .call("session.create", json!({"owner": "uid:62002"}))
        .await;
    let info = bob
        .call("session.info", json!({"session_id": made["session_id"]}))
        .await;
    assert_eq!(
        info["owner"], "uid:62002",
        "an admin creates for the owner it names"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_survives_a_daemon_restart() {
    let home = tempfile::tempdir().unwrap();
    let mut daemon = shared_daemon(home.path()).await;
    let mut alice = AsUser::connect(&daemon.socket, ALICE);
    let created = alice.call("session.create", json!({"name": "keep"})).await;
    let id = created["session_id"].as_str().unwrap().to_owned();
    alice
        .call(
            "session.execute",
            json!({"session_id": id, "code": "kept = 7"}),
        )
        .await;
    drop(alice);
    // A graceful stop checkpoints every session.
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(Duration::from_secs(60)), Some(0));
    drop(daemon);

    let daemon = shared_daemon(home.path()).await;
    // Bob asking for "keep" gets a fresh session of his own, never alice's state.
    let mut bob = AsUser::connect(&daemon.socket, BOB);
    let his = bob.call("session.create", json!({"name": "keep"})).await;
    assert_eq!(his["restored"], false, "{his}");
    let his_id = his["session_id"].as_str().unwrap().to_owned();
    let probe = bob
        .call(
            "session.execute",
            json!({"session_id": his_id, "code": "kept"}),
        )
        .await;
    assert_eq!(probe["error"]["type"], "NameError", "{probe}");
    // The admin namespace does not hold it either.
    let mut root = daemon.connect().await;
    assert_eq!(
        root.error_code("session.info", json!({"session_id": "keep"}))
            .await,
        -32001
    );

    let mut alice = AsUser::connect(&daemon.socket, ALICE);
    let back = alice.call("session.create", json!({"name": "keep"})).await;
    assert_eq!(back["restored"], true, "{back}");
    let back_id = back["session_id"].as_str().unwrap().to_owned();
    let info = alice
        .call("session.info", json!({"session_id": back_id}))
        .await;
    assert_eq!(info["owner"], "uid:62001", "{info}");
    let kept = alice
        .call(
            "session.execute",
            json!({"session_id": back_id, "code": "kept"}),
        )
        .await;
    assert_eq!(kept["result"]["repr"], "7", "{kept}");
    // Bob cannot reach the restored session by id either.
    let (code, _) = bob
        .error("session.info", json!({"session_id": back_id}))
        .await;
    assert_eq!(code, -32001);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_uids_are_refused_at_accept() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let config = EngineConfig {
        pool: PoolConfig {
            min_idle: 0,
            ..PoolConfig::default()
        },
        state: StateConfig {
            dir: Some(dir.path().join("state")),
            ..StateConfig::default()
        },
        ..EngineConfig::default()
    };
    let engine = Engine::start(config).await.expect("the engine starts");
    let dispatcher = Dispatcher::new(engine, SessionLimits::default());
    let socket = dir.path().join("run").join("pyvisor.sock");
    let server = Arc::new(UnixServer::bind(&socket, Some(GROUP)).await.unwrap());
    let access = Arc::new(SocketAccess {
        refused_uids: Some(62500..=62599),
        ..SocketAccess::default()
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn({
        let server = server.clone();
        async move { server.serve(dispatcher, access, 1 << 20, 16, stopped).await }
    });

    let mut worker = AsUser::connect(&socket, 62510);
    let refusal = worker.read().await.expect("a reason before the close");
    assert_eq!(refusal["error"]["code"], -32007, "{refusal}");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uid 62510"),
        "{refusal}"
    );
    assert!(worker.read().await.is_none(), "the connection is closed");

    // Everyone else is still served.
    let mut alice = AsUser::connect(&socket, ALICE);
    let health = alice.call("engine.health", json!({})).await;
    assert_eq!(health["status"], "ok");
    let _ = stop.send(true);
    drop(alice);
    serving.await.unwrap();
}

#[test]
fn admins_and_owners_come_from_uids() {
    let access = SocketAccess {
        admin_uids: vec![OPERATOR],
        group: None,
        refused_uids: Some(62500..=62599),
    };
    assert_eq!(access.caller(0), Some(Caller::admin()));
    assert_eq!(access.caller(OPERATOR), Some(Caller::admin()));
    assert_eq!(access.caller(ALICE), Some(Caller::owner("uid:62001")));
    assert_eq!(access.caller(62599), None);
    // A uid with a passwd entry is named after its user (nobody is in every base system).
    assert_eq!(access.caller(65534), Some(Caller::owner("nobody")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_and_long_names_are_invalid_params() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    // Which session_id would win is up to the parser: the request is refused instead.
    conn.send_raw(
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session.info\",\
          \"params\":{\"session_id\":\"a\",\"session_id\":\"b\"}}\n",
    )
    .await;
    let reply = conn.read().await.expect("an answer");
    assert_eq!(reply["id"], 1, "{reply}");
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("session_id: duplicate key"), "{message}");

    let long = "n".repeat(129);
    let (_, reply) = conn.request("session.create", json!({"name": long})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("name: at most 128 bytes"));
    let (_, reply) = conn.request("session.create", json!({"owner": long})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    // The connection still serves.
    let created = conn
        .call("session.create", json!({"name": "n".repeat(128)}))
        .await;
    assert!(created["session_id"].is_string());
}
