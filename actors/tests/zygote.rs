//! The zygote fork server with real Python: forked workers have the preload modules, are
//! contained like spawned ones, and every way the zygote or a worker can die is handled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyvisor_actors::worker::{
    CgroupManager, CgroupMechanism, Worker, WorkerEvent, WorkerOrigin, WorkerSpec, Zygote,
};
use pyvisor_actors::{OutputStream, SpawnError};
use pyvisor_protocol::{HostMessage, ResultValue, WorkerMessage, WorkerStatus};

mod common;

use common::{python_has, setup, spec, PATIENCE};

async fn start_zygote(preload: &[&str]) -> Result<Arc<Zygote>, SpawnError> {
    let setup = setup();
    let preload: Vec<String> = preload.iter().map(|m| m.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Zygote::start(
            &setup.python,
            &setup.script,
            &preload,
            Some(setup.janitor.clone()),
            Duration::from_secs(30),
        )
        .map(Arc::new)
    })
    .await
    .expect("the start does not panic")
}

async fn forked(spec: &WorkerSpec) -> Worker {
    let worker = Worker::start(spec).await.expect("the worker starts");
    assert_eq!(worker.origin, WorkerOrigin::Forked, "the zygote forked it");
    worker
}

/// What one execution printed and returned.
#[derive(Debug)]
struct Outcome {
    stdout: String,
    status: WorkerStatus,
    result: Option<ResultValue>,
}

async fn run(worker: &mut Worker, code: &str) -> Outcome {
    tokio::time::timeout(PATIENCE, execute(worker, code))
        .await
        .expect("the execution ends")
}

async fn execute(worker: &mut Worker, code: &str) -> Outcome {
    worker
        .writer
        .send(&HostMessage::Execute {
            id: "e".into(),
            code: code.into(),
            repr_limit: 65536,
            transaction: Default::default(),
            facts: false,
            cell: None,
        })
        .expect("the code fits in a frame");
    let mut stdout = Vec::new();
    loop {
        match worker.events.recv().await.expect("the worker is alive") {
            WorkerEvent::Output {
                stream: OutputStream::Stdout,
                bytes,
            } => stdout.extend(bytes),
            WorkerEvent::Message(WorkerMessage::Result { status, result, .. }) => {
                return Outcome {
                    stdout: String::from_utf8(stdout).expect("utf-8 output"),
                    status,
                    result,
                }
            }
            WorkerEvent::Exited(status) => panic!("the worker exited ({status:?})"),
            WorkerEvent::ProtocolError(reason) => panic!("protocol error: {reason}"),
            _ => {}
        }
    }
}

async fn printed(worker: &mut Worker, code: &str) -> String {
    let outcome = run(worker, code).await;
    assert_eq!(outcome.status, WorkerStatus::Ok, "{outcome:?}");
    outcome.stdout.trim().to_owned()
}

/// The exit the pump reports after the worker's other events.
async fn exit_of(worker: &mut Worker) -> Option<std::process::ExitStatus> {
    tokio::time::timeout(PATIENCE, async {
        loop {
            match worker.events.recv().await {
                Some(WorkerEvent::Exited(status)) => return status,
                Some(_) => {}
                None => panic!("the event stream ended without an exit"),
            }
        }
    })
    .await
    .expect("the exit is seen")
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

#[tokio::test]
async fn forked_worker_has_the_preload_module_imported_and_runs_code() {
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let mut worker = forked(&spec(&["decimal"], Some(zygote))).await;
    let check = "import sys\nprint('decimal' in sys.modules, sys.argv[1:])";
    assert_eq!(printed(&mut worker, check).await, "True []");
    let outcome = run(
        &mut worker,
        "from decimal import Decimal\nDecimal('1.1') * 2",
    )
    .await;
    assert_eq!(outcome.result.unwrap().repr, "Decimal('2.2')");

    // A plain worker without preload does not have it: the check above can fail.
    let mut plain = Worker::start(&spec(&[], None)).await.unwrap();
    assert_eq!(plain.origin, WorkerOrigin::Spawned);
    assert_eq!(printed(&mut plain, check).await, "False []");
}

#[tokio::test]
async fn forked_worker_has_pandas_preloaded() {
    if !python_has("pandas") {
        println!("pandas is not installed: skipping the pandas zygote test");
        return;
    }
    let zygote = start_zygote(&["pandas"]).await.unwrap();
    let mut worker = forked(&spec(&["pandas"], Some(zygote))).await;
    let code = "import sys\nprint('pandas' in sys.modules)\n\
                import pandas as pd\nprint(pd.DataFrame({'a': [1, 2, 3]})['a'].sum())";
    assert_eq!(printed(&mut worker, code).await, "True\n6");
}

#[tokio::test]
async fn plain_spawn_preloads_modules_before_hello() {
    let mut worker = Worker::start(&spec(&["decimal", "fractions"], None))
        .await
        .unwrap();
    assert_eq!(worker.origin, WorkerOrigin::Spawned);
    let code =
        "import sys\nprint('decimal' in sys.modules, 'fractions' in sys.modules, sys.argv[1:])";
    assert_eq!(printed(&mut worker, code).await, "True True []");
}

#[tokio::test]
async fn forked_worker_is_contained_like_a_spawned_one() {
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let zygote_pid = zygote.pid().expect("the zygote is up");
    let cwd = tempfile::tempdir().unwrap();
    let mut spec = spec(&["decimal"], Some(zygote));
    spec.cwd = Some(cwd.path().to_path_buf());
    spec.env = vec![("PYVISOR_TEST_VAR".into(), "forked".into())];
    let mut worker = forked(&spec).await;
    let code = format!(
        "import os\n\
         def is_open(fd):\n\
         \x20   try:\n\
         \x20       os.fstat(fd)\n\
         \x20       return True\n\
         \x20   except OSError:\n\
         \x20       return False\n\
         print(os.getpgid(0) == os.getpid(), os.getpgid(0) != os.getpgid({zygote_pid}))\n\
         print(sorted(fd for fd in map(int, os.listdir('/proc/self/fd')) if is_open(fd)))\n\
         print(os.getcwd() == {:?}, os.environ['PYVISOR_TEST_VAR'])\n\
         print(os.getppid() == {zygote_pid})",
        cwd.path().canonicalize().unwrap().to_str().unwrap()
    );
    assert_eq!(
        printed(&mut worker, &code).await,
        "True True\n[0, 1, 2, 3, 4, 5]\nTrue forked\nTrue"
    );
}

#[tokio::test]
async fn forked_worker_honours_its_rlimits() {
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let mut spec = spec(&["decimal"], Some(zygote));
    spec.limits.open_files = Some(256);
    let mut worker = forked(&spec).await;
    let code = "files = []\n\
                try:\n\
                \x20   for _ in range(300):\n\
                \x20       files.append(open('/dev/null'))\n\
                except OSError as e:\n\
                \x20   print(type(e).__name__, len(files) < 256)\n\
                for f in files:\n\
                \x20   f.close()";
    assert_eq!(printed(&mut worker, code).await, "OSError True");
}

#[tokio::test]
async fn forked_worker_is_interrupted_like_a_spawned_one() {
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let mut worker = forked(&spec(&["decimal"], Some(zygote))).await;
    assert_eq!(printed(&mut worker, "print('ready')").await, "ready");
    worker
        .writer
        .send(&HostMessage::Execute {
            id: "sleep".into(),
            code: "import time\nprint('sleeping', flush=True)\ntime.sleep(60)".into(),
            repr_limit: 1024,
            transaction: Default::default(),
            facts: false,
            cell: None,
        })
        .unwrap();
    let outcome = tokio::time::timeout(PATIENCE, async {
        loop {
            match worker.events.recv().await.expect("the worker is alive") {
                WorkerEvent::Output { .. } => worker.interrupt("sleep"),
                WorkerEvent::Message(WorkerMessage::Result { error, .. }) => return error,
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .expect("the interrupt ends the execution");
    assert_eq!(outcome.unwrap().type_name, "KeyboardInterrupt");
    assert_eq!(
        printed(&mut worker, "print('still here')").await,
        "still here"
    );
}

#[tokio::test]
async fn a_killed_spare_child_does_not_stop_forking() {
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let zygote_pid = zygote.pid().unwrap();
    let spec = spec(&["decimal"], Some(zygote));
    for round in 0..3 {
        // Between requests the zygote's children are its spare and workers that are ending.
        let children = format!("/proc/{zygote_pid}/task/{zygote_pid}/children");
        for child in std::fs::read_to_string(children)
            .unwrap()
            .split_whitespace()
        {
            let _ = kill(Pid::from_raw(child.parse().unwrap()), Signal::SIGKILL);
        }
        // A spare killed as it is handed the request looks like a worker that died at once:
        // that start falls back to a plain spawn. Either way, it starts.
        let mut worker = Worker::start(&spec).await.expect("a worker starts");
        assert_eq!(printed(&mut worker, "print(1)").await, "1");
        let mut worker = forked(&spec).await;
        assert_eq!(
            printed(&mut worker, &format!("print({round})")).await,
            round.to_string()
        );
    }
}

#[tokio::test]
async fn forked_worker_killed_while_its_zygote_lives_reports_the_signal() {
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let mut worker = forked(&spec(&["decimal"], Some(zygote.clone()))).await;
    worker.kill();
    let status = exit_of(&mut worker)
        .await
        .expect("the zygote reports the status");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(zygote.pid().is_some(), "the zygote lives on");
}

#[tokio::test]
async fn workers_outlive_a_killed_zygote_and_their_exit_is_still_seen() {
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let mut worker = forked(&spec(&["decimal"], Some(zygote.clone()))).await;
    let zygote_pid = zygote.pid().unwrap();
    kill(Pid::from_raw(zygote_pid as i32), Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while alive(zygote_pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!alive(zygote_pid), "the zygote is dead");
    assert_eq!(printed(&mut worker, "print(6 * 7)").await, "42");
    worker.kill();
    assert_eq!(
        exit_of(&mut worker).await,
        None,
        "no status: its zygote is gone"
    );
}

#[tokio::test]
async fn a_killed_zygote_does_not_break_spawning_and_is_restarted() {
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let spec = spec(&["decimal"], Some(zygote.clone()));
    let first_pid = zygote.pid().unwrap();
    kill(Pid::from_raw(first_pid as i32), Signal::SIGKILL).unwrap();

    // Whether by plain spawn or a zygote restarted in time, the next start works.
    let mut next = Worker::start(&spec).await.expect("a worker starts");
    let check = "import sys\nprint('decimal' in sys.modules)";
    assert_eq!(printed(&mut next, check).await, "True");

    let deadline = Instant::now() + PATIENCE;
    let mut again = loop {
        let worker = Worker::start(&spec).await.expect("a worker starts");
        if worker.origin == WorkerOrigin::Forked {
            break worker;
        }
        assert!(
            Instant::now() < deadline,
            "no restarted zygote forked a worker"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let second_pid = zygote.pid().expect("the restarted zygote is up");
    assert_ne!(second_pid, first_pid);
    assert_eq!(printed(&mut again, check).await, "True");
}

#[tokio::test]
async fn plain_spawn_with_a_missing_preload_module_fails_naming_it() {
    let err = Worker::start(&spec(&["pyvisor_no_such_module"], None))
        .await
        .unwrap_err();
    match err {
        SpawnError::Handshake { reason } => {
            assert!(reason.contains("pyvisor_no_such_module"), "{reason}");
        }
        other => panic!("expected a handshake error, got {other}"),
    }
}

#[tokio::test]
async fn a_zygote_with_a_missing_preload_module_fails_to_start_naming_it() {
    let err = start_zygote(&["pyvisor_no_such_module"]).await.unwrap_err();
    assert!(
        matches!(&err, SpawnError::Zygote { reason } if reason.contains("pyvisor_no_such_module")),
        "{err}"
    );
}

#[tokio::test]
async fn dropping_the_last_handle_ends_the_zygote_but_not_its_workers() {
    let zygote = start_zygote(&[]).await.unwrap();
    let zygote_pid = zygote.pid().unwrap();
    let spec = spec(&[], Some(zygote));
    let mut worker = forked(&spec).await;
    // The spec holds the last handle (a worker holds none); dropping it waits for the end.
    drop(spec);
    assert!(!alive(zygote_pid), "the zygote ended with its last handle");
    assert_eq!(printed(&mut worker, "print('alive')").await, "alive");
}

#[tokio::test]
async fn forked_worker_joins_its_cgroup_before_it_runs() {
    let cgroups = CgroupManager::detect(None);
    if cgroups.mechanism() == CgroupMechanism::None {
        println!("no cgroup containment on this machine: skipping the cgroup zygote test");
        return;
    }
    let zygote = start_zygote(&["decimal"]).await.unwrap();
    let mut spec = spec(&["decimal"], Some(zygote));
    spec.cgroups = Some(Arc::new(cgroups));
    spec.limits.processes = Some(16);
    let mut worker = forked(&spec).await;
    assert_eq!(
        worker.containment,
        spec.cgroups.as_ref().unwrap().mechanism().as_str()
    );
    let code = "print(any(line.split(':')[2].rsplit('/', 1)[-1].startswith('w-') \
                for line in open('/proc/self/cgroup')))";
    assert_eq!(printed(&mut worker, code).await, "True");
}
