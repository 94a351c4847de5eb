//! Worker confinement (docs/security.md), attacked from session code on real workers, as
//! root: each worker has its own uid from the range, Landlock, seccomp, a private environment
//! and verified worker code; every attack fails with a named error while another session of
//! the same engine keeps answering.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use pyvisor::{EngineConfig, ExecutionStatus, SandboxConfig, Session, SessionOptions};
use pyvisor_tests::{attack, confined, engine_with, run, state_dir, value, PYTHON};

async fn session(engine: &pyvisor::Engine, network: Option<bool>) -> Session {
    let options = SessionOptions {
        network,
        ..SessionOptions::default()
    };
    engine
        .create_session(options)
        .await
        .expect("session starts")
}

/// The layers under test need root and an interpreter every uid can read: without them the
/// test fails (CI runs as root), it never passes by skipping. Returns false, for the callers'
/// early return, which never happens.
fn skip_unless_root() -> bool {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privilege separation is tested as root, as CI runs"
    );
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is needed: an interpreter every uid can read"
    );
    false
}

#[tokio::test]
async fn sessions_run_as_their_own_uid_without_capabilities_or_the_hosts_env() {
    if skip_unless_root() {
        return;
    }
    std::env::set_var("PYVISOR_TEST_SECRET", "hunter2");
    let engine = engine_with(confined(61_100)).await;
    let (a, b) = (session(&engine, None).await, session(&engine, None).await);
    let uid_a: u32 = value(&a, "import os\nos.getuid()").await.parse().unwrap();
    let uid_b: u32 = value(&b, "import os\nos.getuid()").await.parse().unwrap();
    assert!((61_100..=61_109).contains(&uid_a) && (61_100..=61_109).contains(&uid_b));
    assert_ne!(uid_a, uid_b, "one uid per live worker");
    assert_eq!(value(&a, "os.getgroups()").await, "[]");
    let caps = "[l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]";
    assert_eq!(value(&a, caps).await, "'0000000000000000'");
    let leaked = "sorted(k for k in os.environ if k.startswith('PYVISOR'))";
    assert_eq!(value(&a, leaked).await, "[]");
    let tmp = value(&a, "os.environ['TMPDIR'], os.getcwd()").await;
    assert!(
        tmp.contains("/w-") && !tmp.starts_with("('/tmp/"),
        "private dirs: {tmp}"
    );
    let info = a.info().await.unwrap();
    let sandbox = info.sandbox.expect("the worker reports its confinement");
    assert_eq!(sandbox.uid, Some(uid_a));
    assert!(sandbox.seccomp && sandbox.landlock.is_some() && sandbox.network);
    assert_eq!(value(&b, "1 + 1").await, "2");
}

#[tokio::test]
async fn session_code_cannot_reach_the_daemon_its_secrets_or_other_workers() {
    if skip_unless_root() {
        return;
    }
    let engine = engine_with(confined(61_120)).await;
    let (a, b) = (session(&engine, None).await, session(&engine, None).await);
    // The daemon's socket and token, as the daemon makes them: root's, 0700 dir, 0600 files.
    let private = tempfile::tempdir().unwrap();
    let socket_path = private.path().join("pyvisor.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config_dir = private.path().join("config");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&config_dir)
        .unwrap();
    std::fs::write(config_dir.join("token"), "secret").unwrap();
    std::fs::set_permissions(
        config_dir.join("token"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let socket = socket_path.display();
    let connect = format!("import socket; socket.socket(socket.AF_UNIX).connect('{socket}')");
    assert_eq!(attack(&a, &connect).await, "EACCES");
    let token = config_dir.join("token");
    let read_token = format!("open('{}').read()", token.display());
    assert_eq!(attack(&a, &read_token).await, "EACCES");
    // Another worker's and the engine's memory and environment.
    let pid_b = b.pid().unwrap();
    let engine_pid = std::process::id();
    for pid in [pid_b, engine_pid] {
        for file in ["mem", "environ"] {
            let read = format!("open('/proc/{pid}/{file}', 'rb').read(1)");
            assert_eq!(attack(&a, &read).await, "EACCES", "/proc/{pid}/{file}");
        }
    }
    // Escapes through syscalls.
    let libc = "import ctypes; libc = ctypes.CDLL(None, use_errno=True)";
    for call in [
        format!("ptrace(16, {pid_b}, 0, 0)"),
        "unshare(0x10000000)".to_owned(),
        "mount(b'none', b'/mnt', b'tmpfs', 0, None)".to_owned(),
    ] {
        let code = format!(
            "{libc}\n    if libc.{call} != 0: raise OSError(ctypes.get_errno(), 'refused')"
        );
        assert_eq!(attack(&a, &code).await, "EPERM", "{call}");
    }
    // The cgroups are the engine's: no raising its own pids.max, no moving to the root group.
    let own_pids_group = "[l.split(':')[2].strip() for l in open('/proc/self/cgroup') if ':pids:' in l or l.startswith('0::')][0]";
    let pids_max =
        format!("open('/sys/fs/cgroup/pids' + {own_pids_group} + '/pids.max', 'w').write('max')");
    assert_eq!(attack(&a, &pids_max).await, "EACCES", "pids.max");
    let escape = "import os; open('/sys/fs/cgroup/pids/cgroup.procs', 'w').write(str(os.getpid()))";
    assert_eq!(attack(&a, escape).await, "EACCES", "cgroup.procs");
    assert_eq!(value(&b, "6 * 7").await, "42", "the other session answers");
}

#[tokio::test]
async fn a_session_cannot_open_another_sessions_checkpoint() {
    if skip_unless_root() {
        return;
    }
    let config = confined(61_140);
    let state = config.state.dir.clone().unwrap();
    let engine = engine_with(config).await;
    let (a, b) = (session(&engine, None).await, session(&engine, None).await);
    run(&a, "secret = 'the answer is 42'").await;
    a.checkpoint()
        .await
        .expect("a confined worker writes its checkpoint");
    let files = files_under(&state.join("sessions"));
    assert!(!files.is_empty(), "the checkpoint is on disk");
    for file in files.iter().take(3) {
        let read = format!("open('{}', 'rb').read()", file.display());
        assert_eq!(attack(&b, &read).await, "EACCES", "{}", file.display());
    }
    assert_eq!(value(&a, "secret").await, "'the answer is 42'");
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[tokio::test]
async fn a_session_cannot_plant_code_in_the_worker_package() {
    if skip_unless_root() {
        return;
    }
    let engine = engine_with(confined(61_160)).await;
    let a = session(&engine, None).await;
    let plant = "import pyvisor_worker, os\n    d = os.path.join(os.path.dirname(pyvisor_worker.__file__), '__pycache__')\n    open(os.path.join(d, 'planted.txt'), 'w').write('x')";
    let outcome = attack(&a, plant).await;
    assert!(
        ["EACCES", "ENOENT", "EROFS"].contains(&outcome.as_str()),
        "{outcome}"
    );
    assert_eq!(value(&a, "1").await, "1");
}

#[tokio::test]
async fn without_network_a_session_cannot_connect_while_another_can() {
    if skip_unless_root() {
        return;
    }
    let engine = engine_with(confined(61_180)).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let offline = session(&engine, Some(false)).await;
    let online = session(&engine, None).await;
    let connect =
        format!("import socket; socket.create_connection(('127.0.0.1', {port}), 5).close()");
    assert_eq!(attack(&offline, &connect).await, "EPERM");
    assert_eq!(attack(&online, &connect).await, "none");
    let info = offline.info().await.unwrap();
    assert!(!info.sandbox.expect("confined").network);
}

#[tokio::test]
async fn landlock_keeps_workers_apart_even_without_uid_separation() {
    let mut config = EngineConfig {
        sandbox: SandboxConfig {
            landlock: true,
            seccomp: true,
            ..SandboxConfig::default()
        },
        ..EngineConfig::default()
    };
    config.state.dir = Some(state_dir());
    let engine = engine_with(config).await;
    let (a, b) = (session(&engine, None).await, session(&engine, None).await);
    let pid_b = b.pid().unwrap();
    for pid in [pid_b, std::process::id()] {
        // environ is a ptrace read on this kernel that Landlock lets through: uid
        // separation guards it (see the test above).
        for file in ["mem"] {
            let read = format!("open('/proc/{pid}/{file}', 'rb').read(1)");
            let engine = if pid == pid_b { "worker" } else { "engine" };
            assert_eq!(
                attack(&a, &read).await,
                "EACCES",
                "{engine} /proc/{pid}/{file}"
            );
        }
    }
    assert_eq!(value(&b, "2 ** 5").await, "32");
    // Landlock alone keeps the store out of reach too: a crash still restores, from copies.
    run(&b, "rows = list(range(50_000))").await;
    b.checkpoint().await.expect("a checkpoint");
    assert_eq!(
        run(&b, "import os; os._exit(3)").await.status,
        ExecutionStatus::Crashed
    );
    assert_eq!(value(&b, "len(rows)").await, "50000");
}

#[tokio::test]
async fn a_crashed_worker_under_its_own_uid_comes_back_from_its_checkpoint() {
    if skip_unless_root() {
        return;
    }
    let engine = engine_with(confined(61_160)).await;
    let session = session(&engine, None).await;
    run(
        &session,
        "frame = {'rows': list(range(50_000))}\nlabel = 'kept'",
    )
    .await;
    session.checkpoint().await.expect("a checkpoint");
    let crashed = run(&session, "import os; os._exit(3)").await;
    assert_eq!(crashed.status, ExecutionStatus::Crashed);
    // The new worker has a uid of its own too, and reads the blobs handed over to it.
    assert_eq!(
        value(&session, "(len(frame['rows']), label)").await,
        "(50000, 'kept')"
    );
    let uid = value(&session, "import os; os.getuid()").await;
    assert_ne!(uid, "0");
}

#[tokio::test]
async fn two_engines_on_one_machine_never_share_a_uid_or_kill_each_others_workers() {
    if skip_unless_root() {
        return;
    }
    // Two daemons given the same range (the default "auto" gives every daemon 61000-61999),
    // with no warm workers: each engine's first worker takes the lowest uid it may.
    let config = || {
        let mut config = confined(61_200);
        config.pool.min_idle = 0;
        config
    };
    let (first, second) = (engine_with(config()).await, engine_with(config()).await);
    let mine = session(&first, None).await;
    let theirs = session(&second, None).await;
    let uid_mine = value(&mine, "import os\nos.getuid()").await;
    let before = value(&theirs, "import os\nkept = 41\nos.getuid(), os.getpid()").await;
    assert!(
        !before.starts_with(&format!("({uid_mine},")),
        "one uid per live worker on the machine: {uid_mine} and {before}"
    );
    // Closing a session kills every process of its uid: never the other engine's worker.
    mine.close().await.expect("close");
    first
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .expect("shutdown");
    let after = run(&theirs, "os.getuid(), os.getpid(), kept + 1").await;
    assert_eq!(after.status, ExecutionStatus::Ok, "{:?}", after.error);
    assert!(after.recovered.is_none(), "{:?}", after.recovered);
    assert_eq!(
        after.result.expect("a value").repr,
        format!("{}, 42)", before.trim_end_matches(')'))
    );
}
