//! `pyvisor daemon start|stop|status` against real processes in a private home, and the
//! systemd unit of `examples/systemd/` checked against the directives the docs rely on.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::Conn;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use pyvisor_actors::worker::is_running;
use serde_json::json;
use tempfile::TempDir;

/// A private home for one background daemon; SIGKILLs whatever daemon its PID file names
/// when dropped, so a failed test leaves nothing running.
struct Home {
    dir: TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: TempDir::new().expect("create a temp dir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `pyvisor daemon ARGS…` run to completion.
    fn daemon(&self, args: &[&str]) -> Output {
        common::command(self.path())
            .arg("daemon")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run pyvisor daemon")
    }

    fn socket(&self) -> PathBuf {
        self.path().join("run/pyvisor/pyvisor.sock")
    }

    fn pid_file(&self) -> PathBuf {
        self.path().join("run/pyvisor/pyvisor.pid")
    }

    /// The lock file `daemon start` and `stop` take beside the PID file.
    fn lock_file(&self) -> PathBuf {
        self.path().join("run/pyvisor/pyvisor.pid.lock")
    }

    /// The pid the PID file names, if there is one.
    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pid_file())
            .ok()
            .map(|text| text.trim().parse().expect("the PID file holds a pid"))
    }

    fn write_pid(&self, pid: u32) {
        std::fs::create_dir_all(self.pid_file().parent().unwrap()).unwrap();
        std::fs::write(self.pid_file(), format!("{pid}\n")).unwrap();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("run/pyvisor/pyvisor.log")).unwrap_or_default()
    }

    /// `daemon start`, which must succeed; the daemon's pid.
    fn start(&self, args: &[&str]) -> u32 {
        let out = self.daemon(&[&["start"], args].concat());
        assert_eq!(out.status.code(), Some(0), "{}{}", show(&out), self.log());
        let pid = self.pid().expect("start writes the PID file");
        assert!(
            stdout(&out).contains(&format!("started (pid {pid}, socket ")),
            "{}",
            show(&out)
        );
        pid
    }

    /// Live processes whose command line mentions this home: the daemon's workers, zygote
    /// and their children (their scripts live in its cache dir).
    fn engine_processes(&self) -> Vec<u32> {
        let needle = self.path().join("cache").to_string_lossy().into_owned();
        std::fs::read_dir("/proc")
            .expect("/proc is readable")
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&needle))
            })
            .filter(|pid| is_running(*pid))
            .collect()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("serve") {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

/// Waits up to `limit` for `done`.
fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}stderr:\n{}",
        out.status.code(),
        stdout(out),
        stderr(out)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_status_stop_round_trip() {
    let home = Home::new();
    let out = home.daemon(&["status"]);
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    assert!(stdout(&out).contains("not running"), "{}", show(&out));

    let pid = home.start(&[]);
    assert!(is_running(pid));
    let out = home.daemon(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let text = stdout(&out);
    assert!(text.contains(&format!("running (pid {pid})")), "{text}");
    assert!(
        text.contains(&home.socket().display().to_string()),
        "{text}"
    );
    for figure in ["uptime:", "sessions:   0", "pool:", "executions: 0"] {
        assert!(text.contains(figure), "{figure:?} missing: {text}");
    }
    // The log says where the daemon listens, without colour codes.
    let log = home.log();
    let listening = format!(
        "pyvisor: JSON-RPC on unix socket {}",
        home.socket().display()
    );
    assert!(log.contains(&listening), "{log}");
    assert!(!log.contains('\x1b'), "{log:?}");

    let mut conn = Conn::connect(&home.socket()).await.unwrap();
    let health = conn.call("engine.health", json!({})).await;
    assert_eq!(health["status"], "ok", "{health}");
    drop(conn);

    // A second start finds the first and leaves it alone.
    let out = home.daemon(&["start"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        stdout(&out).contains(&format!("already running (pid {pid})")),
        "{}",
        show(&out)
    );
    assert_eq!(home.pid(), Some(pid));

    let out = home.daemon(&["stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        stdout(&out).contains(&format!("stopped (pid {pid})")),
        "{}",
        show(&out)
    );
    assert!(!is_running(pid), "the daemon outlived `daemon stop`");
    assert!(!home.pid_file().exists(), "stop removes the PID file");
    assert!(!home.lock_file().exists(), "stop leaves no pid.lock behind");
    assert!(!home.socket().exists(), "the daemon removes its socket");
    let out = home.daemon(&["status"]);
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    // Stopping what is not running is not an error, and leaves no lock file either.
    let out = home.daemon(&["stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(stdout(&out).contains("not running"), "{}", show(&out));
    assert!(!home.lock_file().exists(), "stop leaves no pid.lock behind");
    // The next start locks a new file and runs.
    let again = home.start(&[]);
    assert!(is_running(again));
    let out = home.daemon(&["stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(!home.lock_file().exists(), "stop leaves no pid.lock behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_the_same_state_dir_is_refused_while_the_first_lives() {
    let home = Home::new();
    let pid = home.start(&[]);
    let serve = |args: &[&str]| {
        common::command(home.path())
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // Started by hand on the same socket: the live socket refuses it.
    let out = serve(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        stderr(&out).contains("another pyvisor daemon is serving there"),
        "{}",
        show(&out)
    );
    // On a socket of its own: the engine's lock on the state directory refuses it.
    let other = home.path().join("run/other.sock");
    let out = serve(&["--socket", other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(!other.exists(), "the refused daemon left its socket");
    assert!(
        stderr(&out).contains(&format!("in use by another pyvisor engine (pid {pid})")),
        "{}",
        show(&out)
    );
    // Given the PID file as `daemon start` gives it: the daemon's lock refuses it first.
    let out = serve(&["--pid-file", home.pid_file().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        stderr(&out).contains(&format!("already running (pid {pid})")),
        "{}",
        show(&out)
    );
    // The first daemon still owns its PID file and answers on its socket.
    assert_eq!(home.pid(), Some(pid));
    let mut conn = Conn::connect(&home.socket()).await.unwrap();
    let health = conn.call("engine.health", json!({})).await;
    assert_eq!(health["status"], "ok", "{health}");
    drop(conn);
    let out = home.daemon(&["stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
}

#[test]
fn a_lock_left_by_a_sigkilled_daemon_does_not_block_a_new_one() {
    let home = Home::new();
    let pid = home.start(&[]);
    killpg(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !is_running(pid)),
        "the daemon outlived SIGKILL"
    );
    // Its PID file is left, and no lock with it: stale. A child the daemon was forking when
    // it died holds the lock (and the socket) until that child's exec closes them, so the
    // lock may outlive the daemon by a moment (seen once in CI: "running but not answering").
    assert_eq!(home.pid(), Some(pid));
    let mut out = home.daemon(&["status"]);
    eventually(Duration::from_secs(10), || {
        out = home.daemon(&["status"]);
        out.status.code() == Some(1)
    });
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        stdout(&out).contains(&format!("stale PID file {}", home.pid_file().display())),
        "{}",
        show(&out)
    );
    let again = home.start(&[]);
    assert_ne!(again, pid);
    let out = home.daemon(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let out = home.daemon(&["stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(!is_running(again));
}

#[test]
fn stale_pid_file_of_a_dead_process_is_replaced() {
    let home = Home::new();
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    home.write_pid(dead_pid);

    let out = home.daemon(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(stdout(&out).contains("stale PID file"), "{}", show(&out));

    let out = home.daemon(&["start"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        stderr(&out).contains(&format!(
            "stale PID file {}: process {dead_pid} is not running; replacing it",
            home.pid_file().display()
        )),
        "{}",
        show(&out)
    );
    let pid = home.pid().unwrap();
    assert_ne!(pid, dead_pid);
    assert!(is_running(pid));
    let out = home.daemon(&["stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(!is_running(pid));
}

#[test]
fn pid_file_naming_another_program_is_not_ours_and_that_program_is_spared() {
    let home = Home::new();
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    let other_pid = other.id();
    home.write_pid(other_pid);

    let out = home.daemon(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        stdout(&out).contains(&format!("process {other_pid} is not a pyvisor daemon")),
        "{}",
        show(&out)
    );

    // stop: nothing of ours runs; the stale file goes, the sleep stays.
    let out = home.daemon(&["stop", "--force", "--timeout", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(stdout(&out).contains("not running"), "{}", show(&out));
    assert!(
        stderr(&out).contains("removed the stale PID file"),
        "{}",
        show(&out)
    );
    assert!(!home.pid_file().exists());
    assert!(other.try_wait().unwrap().is_none(), "stop signalled sleep");

    // start: the file is replaced by the new daemon's pid.
    home.write_pid(other_pid);
    let out = home.daemon(&["start"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        stderr(&out).contains(&format!("process {other_pid} is not a pyvisor daemon")),
        "{}",
        show(&out)
    );
    let pid = home.pid().unwrap();
    assert_ne!(pid, other_pid);
    let out = home.daemon(&["stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(!is_running(pid));
    assert!(other.try_wait().unwrap().is_none(), "stop signalled sleep");
    other.kill().unwrap();
    other.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_force_kills_a_daemon_that_outlasts_the_timeout_and_its_workers() {
    let home = Home::new();
    // A long grace period: the daemon waits for the sleeping execution after SIGTERM.
    let config = home.path().join("slow-stop.toml");
    std::fs::write(
        &config,
        "[server]\nshutdown_grace_s = 30\n[pool]\nmin_idle = 1\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let pid = home.start(&["--config", config]);

    let mut conn = Conn::connect(&home.socket()).await.unwrap();
    let session = conn.call("session.create", json!({})).await["session_id"].clone();
    conn.send(
        &json!({"jsonrpc": "2.0", "id": "sleep", "method": "session.execute",
        "params": {"session_id": session, "stream": true,
                   "code": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"}}),
    )
    .await;
    let note = conn.read().await.expect("the execution starts");
    assert_eq!(note["method"], "session.output", "{note}");
    let workers = home.engine_processes();
    assert!(!workers.is_empty(), "no worker mentions the cache dir");

    // Without --force, stop gives up and says so; the daemon keeps draining.
    let out = home.daemon(&["stop", "--config", config, "--timeout", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(stderr(&out).contains("still stopping"), "{}", show(&out));
    assert!(is_running(pid));
    assert_eq!(home.pid(), Some(pid));

    let out = home.daemon(&["stop", "--config", config, "--force", "--timeout", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(stderr(&out).contains("SIGKILL"), "{}", show(&out));
    assert!(
        stdout(&out).contains(&format!("killed (pid {pid})")),
        "{}",
        show(&out)
    );
    assert!(!is_running(pid));
    assert!(!home.pid_file().exists(), "stop removes the PID file");
    assert!(
        eventually(Duration::from_secs(10), || home
            .engine_processes()
            .is_empty()),
        "workers outlived the killed daemon: {:?} (before: {workers:?})",
        home.engine_processes()
    );
    let out = home.daemon(&["status", "--config", config]);
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
}

#[test]
fn a_daemon_that_fails_at_start_up_shows_its_log() {
    let home = Home::new();
    let config = home.path().join("broken.toml");
    std::fs::write(&config, "[engine]\npython = \"/nonexistent/python3\"\n").unwrap();
    let out = home.daemon(&["start", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let text = stderr(&out);
    assert!(text.contains("exited during start-up"), "{text}");
    assert!(text.contains("/nonexistent/python3"), "{text}");
    assert!(
        !home.pid_file().exists(),
        "a failed start leaves no PID file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_started_otherwise_is_reported_but_not_adopted() {
    let home = Home::new();
    // `serve` run by hand (or by systemd): its socket answers, and there is no PID file.
    let serve = common::Daemon::start_in(home.path(), &[], &[]).await;
    let socket = serve.socket.to_str().unwrap().to_owned();
    let daemon = |args: &[&str]| {
        common::command(home.path())
            .env("PYVISOR_SERVER__SOCKET", &socket)
            .arg("daemon")
            .args(args)
            .output()
            .unwrap()
    };
    let out = daemon(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(stdout(&out).contains("pid unknown"), "{}", show(&out));
    let out = daemon(&["start"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(stderr(&out).contains("did not start"), "{}", show(&out));
    let out = daemon(&["stop"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(stderr(&out).contains("did not start"), "{}", show(&out));
    assert!(
        is_running(serve.child.id()),
        "stop signalled a daemon it does not own"
    );
}

#[test]
fn configuration_errors_are_usage_errors() {
    let home = Home::new();
    let missing = home.path().join("missing.toml");
    for command in ["start", "stop", "status"] {
        let out = home.daemon(&[command, "--config", missing.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{command}: {}", show(&out));
        assert!(stderr(&out).contains("no such file"), "{}", show(&out));
    }
}

/// `[Section]` → `Key` → values, in file order (a key may repeat).
type Unit = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// A systemd unit file read as simple INI: comments, sections, `Key=value`.
fn parse_unit(text: &str) -> Unit {
    let mut unit = Unit::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not Key=value: {line:?}"));
        assert!(!section.is_empty(), "{key} outside a section");
        unit.entry(section.clone())
            .or_default()
            .entry(key.trim().to_owned())
            .or_default()
            .push(value.trim().to_owned());
    }
    unit
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/systemd")
}

#[test]
fn systemd_unit_has_the_directives_the_daemon_relies_on() {
    let text = std::fs::read_to_string(examples().join("pyvisor.service")).unwrap();
    let unit = parse_unit(&text);
    let service = &unit["Service"];
    let one = |key: &str| -> &str {
        match service.get(key).map(Vec::as_slice) {
            Some([value]) => value,
            other => panic!("[Service] {key}= should appear once, found {other:?}"),
        }
    };
    for (key, value) in [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        (
            "ExecStart",
            "/usr/local/bin/pyvisor serve --config /etc/pyvisor/config.toml",
        ),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("KillMode", "mixed"),
        ("Restart", "on-failure"),
        ("WatchdogSec", "30"),
        ("User", "pyvisor"),
        ("Delegate", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("StateDirectory", "pyvisor"),
        ("RuntimeDirectory", "pyvisor"),
        ("RuntimeDirectoryMode", "0700"),
        ("CacheDirectory", "pyvisor"),
    ] {
        assert_eq!(one(key), value, "[Service] {key}");
    }
    assert!(
        !service.contains_key("DynamicUser"),
        "a dynamic user cannot own the state dir stably"
    );
    assert!(
        !service.contains_key("ProtectControlGroups"),
        "the daemon writes its delegated cgroup"
    );
    assert!(unit["Install"]["WantedBy"].contains(&"multi-user.target".to_owned()));

    // The config the unit starts with is valid and agrees with the unit's directories and
    // timeouts.
    let config = examples().join("config.toml");
    let home = Home::new();
    let out = common::command(home.path())
        .args(["config", "check"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let settings = pyvisor::config::Settings::load(Some(&config))
        .unwrap()
        .settings;
    assert_eq!(
        settings.socket_path(),
        Path::new("/run/pyvisor/pyvisor.sock")
    );
    let engine = settings.engine_config();
    assert_eq!(
        engine.state.dir.as_deref(),
        Some(Path::new("/var/lib/pyvisor"))
    );
    assert_eq!(
        engine.cache_dir.as_deref(),
        Some(Path::new("/var/cache/pyvisor"))
    );
    assert!(settings.server.watchdog);
    let stop_timeout: f64 = one("TimeoutStopSec").parse().unwrap();
    assert!(
        stop_timeout > settings.server.shutdown_grace_s + 5.0,
        "TimeoutStopSec={stop_timeout} leaves no time to checkpoint after the grace period"
    );
}
