//! A `pyvisor serve` process for the daemon tests: a private home, state and runtime
//! directory in a temp dir, raw JSON-RPC over its socket, and a guard that kills it.

pub mod postgres;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// A running daemon; killed and reaped when dropped.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    /// The daemon's home: config, state, runtime dir and its log (`daemon.log`).
    pub home: PathBuf,
    _dir: Option<TempDir>,
}

impl Daemon {
    /// A daemon with one warm worker.
    pub async fn start() -> Daemon {
        Self::start_with(&[], &[]).await
    }

    /// A daemon with extra `serve` arguments and environment variables.
    pub async fn start_with(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let dir = TempDir::new().expect("create a temp dir");
        let mut daemon = Self::start_in(dir.path(), args, env).await;
        daemon._dir = Some(dir);
        daemon
    }

    /// A daemon whose home is `home` (kept after the daemon, for a restart in it).
    pub async fn start_in(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let socket = home.join("run").join("pyvisor.sock");
        let child = command(home)
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(home))
            .spawn()
            .expect("spawn pyvisor serve");
        let mut daemon = Daemon {
            child,
            socket,
            home: home.to_owned(),
            _dir: None,
        };
        daemon.wait_ready().await;
        daemon
    }

    /// Waits until `engine.health` answers on the socket.
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("pyvisor serve exited with {status}: {}", self.log());
            }
            if let Ok(mut conn) = Conn::connect(&self.socket).await {
                if let Ok(health) = conn.try_call("engine.health", json!({})).await {
                    if health["result"]["status"] == "ok" {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("pyvisor serve never answered: {}", self.log());
    }

    /// A new connection to the daemon.
    pub async fn connect(&self) -> Conn {
        Conn::connect(&self.socket)
            .await
            .expect("connect to the daemon")
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal the daemon");
    }

    /// Waits for the daemon to exit, up to `limit`; its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the daemon did not exit within {limit:?}: {}", self.log());
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home.join("daemon.log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pyvisor` with its environment confined to `home`.
pub fn command(home: &Path) -> Command {
    for dir in ["run", "config/pyvisor", "state", "cache"] {
        std::fs::create_dir_all(home.join(dir)).expect("create the daemon's directories");
    }
    // One warm worker is plenty for a test; a test may pass its own --config instead.
    let user_config = home.join("config/pyvisor/config.toml");
    if !user_config.exists() {
        std::fs::write(&user_config, "[pool]\nmin_idle = 1\n").expect("write the user config");
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_pyvisor"));
    command
        .current_dir(home)
        .env_remove("PYVISOR_CONFIG")
        .env("HOME", home)
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("PYVISOR_LOG", "info");
    command
}

fn log_file(home: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.join("daemon.log"))
        .expect("open the daemon log")
}

/// A raw JSON-RPC connection: lines in, lines out.
pub struct Conn {
    reader: BufReader<OwnedReadHalf>,
    pub writer: OwnedWriteHalf,
    next_id: u64,
}

impl Conn {
    pub async fn connect(path: &Path) -> std::io::Result<Conn> {
        let (reader, writer) = UnixStream::connect(path).await?.into_split();
        Ok(Conn {
            reader: BufReader::new(reader),
            writer,
            next_id: 0,
        })
    }

    /// Writes `bytes` as they are.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.writer
            .write_all(bytes)
            .await
            .expect("write to the daemon");
    }

    /// Writes one message and its newline.
    pub async fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).expect("encode a message");
        line.push(b'\n');
        self.send_raw(&line).await;
    }

    /// The next message from the daemon; `None` when it closed the connection.
    pub async fn read(&mut self) -> Option<Value> {
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(60), self.reader.read_line(&mut line))
            .await
            .expect("the daemon answers within 60 s")
            .ok()?;
        if read == 0 {
            return None;
        }
        Some(serde_json::from_str(&line).expect("the daemon sends JSON lines"))
    }

    /// Sends a request with a fresh id; returns the notifications that came before its
    /// response, and the response.
    pub async fn request(&mut self, method: &str, params: Value) -> (Vec<Value>, Value) {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let mut notes = Vec::new();
        loop {
            let message = self.read().await.expect("the daemon closed the connection");
            if message.get("id") == Some(&json!(id)) {
                return (notes, message);
            }
            notes.push(message);
        }
    }

    /// The `result` of a request that must succeed.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let (_, response) = self.request(method, params).await;
        match response.get("result") {
            Some(result) => result.clone(),
            None => panic!("{method} failed: {response}"),
        }
    }

    /// The `error.code` of a request that must fail.
    pub async fn error_code(&mut self, method: &str, params: Value) -> i64 {
        let (_, response) = self.request(method, params).await;
        response["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{method} should fail: {response}"))
    }

    /// Like [`Self::request`] but a dead connection is an error, not a panic.
    pub async fn try_call(&mut self, method: &str, params: Value) -> std::io::Result<Value> {
        self.next_id += 1;
        let line =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        let mut bytes = serde_json::to_vec(&line)?;
        bytes.push(b'\n');
        self.writer.write_all(&bytes).await?;
        let mut reply = String::new();
        // Generous: a loaded CI machine may take seconds; a daemon that stopped serving never
        // answers.
        let read = tokio::time::timeout(Duration::from_secs(20), self.reader.read_line(&mut reply))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(serde_json::from_str(&reply)?)
    }
}

/// A socket no daemon listens on, so that a command runs embedded whatever runs on this host.
pub const NO_DAEMON: &str = "/nonexistent/pyvisor-test/pyvisor.sock";

/// `pyvisor <subcommand> <args>` with `stdin` as its input, in an embedded engine.
pub fn run_embedded(subcommand: &str, args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pyvisor"));
    command.env("PYVISOR_SERVER__SOCKET", NO_DAEMON);
    run(command, subcommand, args, stdin)
}

/// `pyvisor <subcommand> <args>` with `stdin` as its input, through `daemon`.
pub fn run_in(daemon: &Daemon, subcommand: &str, args: &[&str], stdin: &str) -> Output {
    let mut command = self::command(&daemon.home);
    command.env("PYVISOR_SERVER__SOCKET", &daemon.socket);
    run(command, subcommand, args, stdin)
}

/// `pyvisor <subcommand> <args>` through `command` with `stdin` as its input.
pub fn run(mut command: Command, subcommand: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = command
        .arg(subcommand)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pyvisor runs");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes())
        .expect("write pyvisor's stdin");
    child.wait_with_output().expect("wait for pyvisor")
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A plain HTTP/1.1 GET; the status code and the body.
pub async fn http_get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Settings of an engine for the in-process HTTP tests: a pool of one or two warm workers and
/// `state` as its state directory.
pub fn small_engine_config(state: PathBuf) -> pyvisor::EngineConfig {
    pyvisor::EngineConfig {
        pool: pyvisor::PoolConfig {
            min_idle: 1,
            max_idle: 2,
            ..Default::default()
        },
        state: pyvisor::StateConfig {
            dir: Some(state),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A new state directory, kept after the test (workers may still write to it as it ends).
pub fn state_dir() -> PathBuf {
    tempfile::Builder::new()
        .prefix("pyvisor-test-state-")
        .tempdir()
        .expect("a temporary directory")
        .keep()
}

/// The bearer token `token` of `owner`.
pub fn owner_token(owner: &str, token: &str) -> pyvisor::server::http::OwnerToken {
    pyvisor::server::http::OwnerToken {
        owner: owner.into(),
        token: token.into(),
    }
}

/// An HTTP client that sends `token` as its bearer token, with a minute's timeout.
pub fn bearer_client(token: &str) -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .bearer_auth(token)
        .finish()
}
