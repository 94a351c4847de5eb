//! `Session::fork` (docs/protocol.md `session.fork`) on real workers: clones start from the
//! source's namespace and diverge, the source never sees a clone's change, a fork waits for a
//! running execution, a killed clone comes back from its own checkpoints (the first one
//! linking what its source had stored), threads are said to be gone, and the count, quota and
//! `max_total` limits hold, a clone running under its source's limits. A clone counts its
//! executions on from its source's. Isolation between clones: fork_isolation.rs.

use std::time::{Duration, Instant};

use pyvisor::{
    EngineConfig, EngineError, ExecuteRequest, ExecutionStatus, PoolConfig, PoolError, Quotas,
    Session, SessionLimits, SessionOptions, SupervisorError,
};
use pyvisor_tests::{engine_with, manual_checkpoints, run, started, value, within};

fn config() -> EngineConfig {
    EngineConfig {
        state: manual_checkpoints(),
        ..EngineConfig::default()
    }
}

/// One clone of `source`, once its first checkpoint (taken at the fork, in the background)
/// is stored.
async fn checkpointed_clone(source: &Session) -> Session {
    let clone = within(source.fork(1, vec![]))
        .await
        .unwrap()
        .sessions
        .remove(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while clone.checkpoints().await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the clone never checkpointed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    clone
}

#[tokio::test]
async fn clones_start_from_the_source_and_diverge() {
    let engine = engine_with(config()).await;
    let source = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    value(&source, "data = list(range(5))\nimport os\nos.getpid()").await;
    let forked = within(source.fork(2, vec![])).await.unwrap();
    assert_eq!(forked.sessions.len(), 2);
    assert_eq!(forked.threads, 0);
    let (a, b) = (&forked.sessions[0], &forked.sessions[1]);
    assert_ne!(a.id(), source.id());
    assert_ne!(a.id(), b.id());
    assert_eq!(value(a, "data").await, "[0, 1, 2, 3, 4]");
    value(a, "data.append('a')\n1").await;
    value(b, "data.append('b')\n1").await;
    assert_eq!(value(a, "data").await, "[0, 1, 2, 3, 4, 'a']");
    assert_eq!(value(b, "data").await, "[0, 1, 2, 3, 4, 'b']");
    assert_eq!(value(&source, "data").await, "[0, 1, 2, 3, 4]");
    // Processes and groups of their own.
    let pids: Vec<String> = futures::future::join_all(
        [&source, a, b].map(|s| value(s, "(os.getpid(), os.getpgid(0) == os.getpid())")),
    )
    .await;
    assert!(pids.iter().all(|p| p.ends_with("True)")), "{pids:?}");
    assert_eq!(
        pids.iter().collect::<std::collections::HashSet<_>>().len(),
        3
    );
}

#[tokio::test]
async fn a_clone_counts_on_from_its_source_so_tracebacks_show_the_sources_cells() {
    let engine = engine_with(config()).await;
    let source = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    run(
        &source,
        "def boom():\n    raise ValueError('raised in the source')",
    )
    .await;
    let before = run(&source, "1").await.execution_count;
    let clone = within(source.fork(1, vec![]))
        .await
        .unwrap()
        .sessions
        .remove(0);
    // A clone numbering its cells from 1 would put this source over the source's cell 1.
    let first = run(&clone, "x = 'the clone line'\nx").await;
    assert_eq!(first.execution_count, before + 1);
    let failed = run(&clone, "boom()").await;
    let traceback = failed.error.expect("boom() raised").traceback.join("");
    assert!(
        traceback.contains("raise ValueError('raised in the source')"),
        "{traceback}"
    );
    assert!(!traceback.contains("the clone line"), "{traceback}");
    assert_eq!(run(&source, "1").await.execution_count, before + 1);
}

#[tokio::test]
async fn a_fork_waits_for_the_running_execution_and_says_threads_are_gone() {
    let engine = engine_with(config()).await;
    let source = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    value(
        &source,
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n1",
    )
    .await;
    // Under way in the worker before the fork is asked for.
    let running = started(
        &source,
        ExecuteRequest::new("print('running', flush=True)\ntime.sleep(0.3)\nstate = 'after'"),
    )
    .await;
    let forked = within(source.fork(1, vec!["busy-clone".into()]))
        .await
        .unwrap();
    assert_eq!(running.result().await.unwrap().status, ExecutionStatus::Ok);
    let clone = &forked.sessions[0];
    assert_eq!(clone.name(), Some("busy-clone"));
    assert_eq!(forked.threads, 1);
    let first = run(clone, "state").await;
    assert_eq!(
        first.result.unwrap().repr,
        "'after'",
        "the fork came after the execution"
    );
    assert!(first.stderr.contains("1 thread(s)"), "{:?}", first.stderr);
    let second = run(clone, "threading.active_count()").await;
    assert_eq!(
        second.result.unwrap().repr,
        "1",
        "no thread of the source runs here"
    );
    assert!(second.stderr.is_empty(), "{:?}", second.stderr);
}

#[tokio::test]
async fn a_killed_clone_comes_back_from_its_own_checkpoints() {
    let engine = engine_with(config()).await;
    let source = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    value(&source, "data = {'from': 'source'}\n1").await;
    let clone = checkpointed_clone(&source).await;
    value(&clone, "data['clone'] = True\nunsaved = 1\n1").await;
    let killed = run(
        &clone,
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    )
    .await;
    assert_eq!(killed.status, ExecutionStatus::Crashed);
    // Back from the fork's checkpoint: the namespace of the fork, not the source's later one.
    value(&source, "data['source'] = 'later'\n1").await;
    assert_eq!(value(&clone, "data").await, "{'from': 'source'}");
    assert_eq!(value(&clone, "'unsaved' in globals()").await, "False");
    assert!(
        source.checkpoints().await.unwrap().is_empty(),
        "the source has its own lineage"
    );
    assert_eq!(
        value(&source, "data").await,
        "{'from': 'source', 'source': 'later'}"
    );
}

/// Blob files of every session under `state` of at least `min_bytes`: (inode, link count).
fn large_blobs(state: &std::path::Path, min_bytes: u64) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let sessions = std::fs::read_dir(state.join("sessions")).unwrap();
    let blob_dirs = sessions.flatten().map(|entry| entry.path().join("blobs"));
    blob_dirs
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .filter_map(|blob| blob.metadata().ok())
        .filter(|meta| meta.len() >= min_bytes)
        .map(|meta| (meta.ino(), meta.nlink()))
        .collect()
}

#[tokio::test]
async fn a_clones_first_checkpoint_links_what_its_source_had_stored() {
    let state = pyvisor_tests::state_dir();
    let engine = engine_with(EngineConfig {
        state: pyvisor::StateConfig {
            dir: Some(state.clone()),
            ..manual_checkpoints()
        },
        ..EngineConfig::default()
    })
    .await;
    let source = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    let digest = "hashlib.sha256(big).hexdigest()";
    value(
        &source,
        "import hashlib, os\nbig = os.urandom(8 << 20)\nsmall = {'n': 1}\n1",
    )
    .await;
    let sum = value(&source, digest).await;
    within(source.checkpoint()).await.unwrap();
    // Changed after the source's checkpoint: the clone must write this group itself.
    value(&source, "small['n'] = 2\n1").await;
    let clone = checkpointed_clone(&source).await;
    let big_blobs = large_blobs(&state, 8 << 20);
    assert_eq!(
        big_blobs, [big_blobs[0]; 2],
        "the clone's checkpoint links the source's blob, not a copy of its own"
    );
    assert_eq!(big_blobs[0].1, 2);

    // The clone's lineage stands alone: the source and its checkpoints go, then the clone
    // crashes and comes back from its own checkpoint, with the change made before the fork.
    within(source.close()).await.unwrap();
    let killed = run(&clone, "os.kill(os.getpid(), 9)").await;
    assert_eq!(killed.status, ExecutionStatus::Crashed);
    assert_eq!(value(&clone, "small").await, "{'n': 2}");
    assert_eq!(value(&clone, digest).await, sum);
}

#[tokio::test]
async fn the_source_checkpoints_again_after_a_fork_that_seeded_its_clone() {
    let engine = engine_with(config()).await;
    let source = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    // Each fork looks whether the source's last checkpoint is stored; the next checkpoint of
    // the source then waits on that same turn, which the look must not have used up.
    for round in 0..3 {
        value(&source, &format!("n = {round}\n1")).await;
        within(source.checkpoint()).await.unwrap();
        let clone = checkpointed_clone(&source).await;
        assert_eq!(value(&clone, "n").await, round.to_string());
        within(clone.close()).await.unwrap();
    }
    within(source.checkpoint()).await.unwrap();
    assert_eq!(value(&source, "n").await, "2");
}

#[tokio::test]
async fn fork_counts_names_and_quotas_are_enforced() {
    let mut config = config();
    config.quotas = Quotas {
        max_sessions_per_owner: Some(3),
        ..Quotas::default()
    };
    let engine = engine_with(config).await;
    let options = SessionOptions {
        name: Some("src".into()),
        owner: Some("quota".into()),
        ..SessionOptions::default()
    };
    let source = engine.create_session(options).await.unwrap();
    for (count, names) in [(0, vec![]), (17, vec![]), (2, vec!["one".to_owned()])] {
        let err = source.fork(count, names).await.unwrap_err();
        assert!(matches!(err, EngineError::InvalidFork(_)), "{err}");
    }
    let err = source.fork(1, vec!["src".into()]).await.unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Supervisor(SupervisorError::CloneNameTaken { .. })
        ),
        "{err}"
    );
    let err = source.fork(3, vec![]).await.unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Supervisor(SupervisorError::TooManySessions { .. })
        ),
        "{err}"
    );
    let forked = within(source.fork(2, vec![])).await.unwrap();
    assert!(forked.sessions.iter().all(|s| s.owner() == Some("quota")));
    let err = forked.sessions[0].fork(1, vec![]).await.unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Supervisor(SupervisorError::TooManySessions { .. })
        ),
        "clones count against the quota: {err}"
    );
    forked.sessions[1].clone().close().await.unwrap();
    let again = within(forked.sessions[0].fork(1, vec![])).await.unwrap();
    assert_eq!(again.sessions.len(), 1, "a closed clone frees its place");
}

#[tokio::test]
async fn clones_take_the_sources_limits_and_need_room_under_max_total() {
    let mut config = config();
    config.pool = PoolConfig {
        min_idle: 0,
        max_idle: 1,
        max_total: 3,
        ..PoolConfig::default()
    };
    let engine = engine_with(config).await;
    let options = SessionOptions {
        limits: Some(SessionLimits {
            timeout: Duration::from_secs(1),
            ..SessionLimits::default()
        }),
        ..SessionOptions::default()
    };
    let source = engine.create_session(options).await.unwrap();
    value(&source, "import time\n1").await;
    // Three clones and the source would be four workers: refused whole, nothing taken.
    let err = source.fork(3, vec![]).await.unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Supervisor(SupervisorError::Pool(PoolError::Exhausted {
                max_total: 3,
                ..
            }))
        ),
        "{err}"
    );
    let forked = within(source.fork(2, vec![])).await.unwrap();
    assert_eq!(forked.sessions.len(), 2);
    // A clone runs under its source's limits: the 1 s timeout, not the default 30 s.
    let slow = run(&forked.sessions[0], "time.sleep(30)").await;
    assert_eq!(slow.status, ExecutionStatus::Timeout);
    assert_eq!(value(&forked.sessions[1], "1 + 1").await, "2");
}

/// The pids of `pid`'s children that are zombies (exited, not reaped).
fn zombie_children(pid: u32) -> Vec<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|child| child.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'))
            })
        })
        .collect()
}

#[tokio::test]
async fn closed_clones_leave_no_zombie_in_the_source() {
    let engine = engine_with(config()).await;
    let source = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    let pid = source.pid().expect("the source's pid");
    for _ in 0..3 {
        let forked = within(source.fork(2, vec![])).await.unwrap();
        for clone in forked.sessions {
            clone.close().await.expect("the clone closes");
        }
    }
    value(&source, "1").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let zombies = zombie_children(pid);
        if zombies.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the source never reaped its closed clones: {zombies:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A clone reaps its own clones: the source's reaper did not survive the fork into it.
    let forked = within(source.fork(1, vec![])).await.unwrap();
    let clone = &forked.sessions[0];
    let clone_pid = clone.pid().expect("a clone's pid");
    let grandchildren = within(clone.fork(2, vec![])).await.unwrap();
    for grandchild in grandchildren.sessions {
        grandchild.close().await.expect("the clone's clone closes");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !zombie_children(clone_pid).is_empty() {
        assert!(
            Instant::now() < deadline,
            "a clone never reaped its own closed clones"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(forked);
    // A clone killed by the host rather than closed is reaped too.
    let forked = within(source.fork(1, vec![])).await.unwrap();
    let clone_pid = forked.sessions[0].pid().expect("a clone's pid");
    drop(forked);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(clone_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    value(&source, "2").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !zombie_children(pid).is_empty() {
        assert!(Instant::now() < deadline, "a killed clone stays a zombie");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn large_blocks_get_huge_pages_so_that_a_fork_copies_few_page_table_entries() {
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let engine = engine_with(config()).await;
    let session = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    let huge_kb: u64 = value(
        &session,
        "import os\nblob = os.urandom(64 << 20)\n\
         [int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')][0]",
    )
    .await
    .parse()
    .unwrap();
    if thp.contains("[never]") {
        assert_eq!(huge_kb, 0, "the kernel has transparent huge pages off");
    } else {
        assert!(
            huge_kb >= 32 << 10,
            "64 MB of bytes in {huge_kb} kB of huge pages"
        );
    }
}
