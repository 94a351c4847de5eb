//! A clone's isolation from its source and its siblings (docs/security.md "Forks"), attacked
//! from session code on real workers, as root with uid separation, Landlock and seccomp on.
//! A clone keeps its source's uid, and its own Landlock layer keeps it from signalling,
//! tracing or reading the files of its source and siblings, or reaching their abstract unix
//! sockets, while the same code works between processes of one session. Its files start as a
//! copy of its source's, in a directory of its own; a lineage of clones goes at most
//! `MAX_CLONE_GENERATIONS` deep; the uid's sweep waits for the last of the family; a clone
//! that would carry a thread past its isolation refuses to start.

use pyvisor::{EngineError, ExecutionStatus, Session, SessionOptions, SpawnError, SupervisorError};
use pyvisor_tests::{
    attack, confined, engine_with, process_running, run, value, within, SETSID_GRANDCHILD,
};

/// The layers under test need root: without it the test fails (CI runs as root).
fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "a clone's isolation is tested as root, as CI runs"
    );
}

async fn new_session(engine: &pyvisor::Engine) -> Session {
    engine
        .create_session(SessionOptions::default())
        .await
        .expect("session starts")
}

/// The one clone of a fork of `source`.
async fn clone_of(source: &Session) -> Session {
    within(source.fork(1, vec![]))
        .await
        .expect("the fork")
        .sessions
        .remove(0)
}

/// The Landlock ABI `session`'s worker confines itself with.
async fn landlock_abi(session: &Session) -> u32 {
    let info = session.info().await.unwrap();
    let sandbox = info.sandbox.expect("the worker reports its confinement");
    sandbox.landlock.expect("Landlock is on")
}

/// What a clone under Landlock ABI `abi` reports it is isolated by.
fn isolation_under(abi: u32) -> Vec<String> {
    let mut expected = vec!["files", "ptrace"];
    if abi >= 6 {
        expected.extend(["signals", "abstract_sockets"]);
    }
    expected.into_iter().map(str::to_owned).collect()
}

#[tokio::test]
async fn a_clone_cannot_signal_trace_or_read_its_source_or_its_siblings() {
    require_root();
    let engine = engine_with(confined(62_780)).await;
    let source = new_session(&engine).await;
    let source_dir = value(
        &source,
        "import os, socket\nopen('notes.txt', 'w').write('from the source')\nos.getcwd()",
    )
    .await;
    let forked = within(source.fork(2, vec![])).await.unwrap();
    let (a, b) = (&forked.sessions[0], &forked.sessions[1]);
    let (source_pid, b_pid) = (source.pid().unwrap(), b.pid().unwrap());
    let b_dir = value(b, "open('mine.txt', 'w').write('b')\nos.getcwd()").await;
    value(&source, "open('later.txt', 'w').write('after the fork')\n1").await;

    // Each clone has a directory of its own holding a copy of the source's files as they
    // were at the fork; what it changes there stays its own.
    let a_dir = value(a, "os.getcwd()").await;
    assert!(a_dir != source_dir && a_dir != b_dir, "{a_dir} {b_dir}");
    assert_eq!(
        value(a, "open('notes.txt').read()").await,
        "'from the source'"
    );
    assert_eq!(attack(a, "open('later.txt')").await, "ENOENT");
    value(a, "open('notes.txt', 'w').write('changed by a')\n1").await;
    assert_eq!(
        value(&source, "open('notes.txt').read()").await,
        "'from the source'"
    );
    let files = a.files();
    let copied = files.read("notes.txt", 0, None).await.unwrap();
    assert_eq!(
        copied.data, b"changed by a",
        "the files API reaches a's own"
    );
    files
        .write("from-api.txt", b"a".to_vec(), false)
        .await
        .unwrap();
    assert!(source.files().read("from-api.txt", 0, None).await.is_err());

    // The source and a sibling, attacked from a clone.
    let abi = landlock_abi(a).await;
    for (pid, dir) in [(source_pid, &source_dir), (b_pid, &b_dir)] {
        let dir = dir.trim_matches('\'');
        if abi >= 6 {
            assert_eq!(attack(a, &format!("os.kill({pid}, 9)")).await, "EPERM");
        } else {
            // Without Landlock's scopes (ABI < 6) a clone may signal its family: the
            // fallback docs/security.md states.
            assert_eq!(attack(a, &format!("os.kill({pid}, 0)")).await, "none");
        }
        let read = format!("open('{dir}/notes.txt').read()");
        assert_eq!(attack(a, &read).await, "EACCES", "{read}");
        assert_eq!(attack(a, &format!("os.listdir('{dir}')")).await, "EACCES");
        let plant = format!("open('{dir}/planted', 'w')");
        assert_eq!(attack(a, &plant).await, "EACCES");
        let mem = format!("open('/proc/{pid}/mem', 'rb')");
        assert_eq!(attack(a, &mem).await, "EACCES");
        let environ = format!("open('/proc/{pid}/environ', 'rb').read()");
        assert_eq!(attack(a, &environ).await, "EACCES");
        let fds = format!("os.listdir('/proc/{pid}/fd')");
        assert_eq!(attack(a, &fds).await, "EACCES");
    }
    assert_eq!(
        value(&source, "open('notes.txt').read()").await,
        "'from the source'"
    );
    assert_eq!(value(b, "open('mine.txt').read()").await, "'b'");

    // An abstract unix socket of the source, made after the fork.
    let name = format!("pyvisor-fork-test-{source_pid}");
    let listen = format!(
        "server = socket.socket(socket.AF_UNIX)\nserver.bind('\\0{name}')\nserver.listen(4)\n1"
    );
    value(&source, &listen).await;
    let connect = format!("socket.socket(socket.AF_UNIX).connect('\\0{name}')");
    let expected = if abi >= 6 { "EPERM" } else { "none" };
    assert_eq!(attack(a, &connect).await, expected);
    assert_eq!(attack(&source, &connect).await, "none");

    // The same code works between the processes of one session (the child read once it has
    // said it runs, past its exec).
    let own = value(
        a,
        "import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', \
         \"import time; print('up', flush=True); time.sleep(60)\"], stdout=subprocess.PIPE)\n\
         child.stdout.readline()\n\
         mine = socket.socket(socket.AF_UNIX)\nmine.bind('\\0pyvisor-own-%d' % os.getpid())\n\
         mine.listen(1)\nlen(open('/proc/%d/environ' % child.pid, 'rb').read()) > 0",
    )
    .await;
    assert_eq!(own, "True");
    let to_mine = "socket.socket(socket.AF_UNIX).connect('\\0pyvisor-own-%d' % os.getpid())";
    assert_eq!(attack(a, to_mine).await, "none");
    assert_eq!(attack(a, "os.kill(child.pid, 9)").await, "none");

    // Each says what isolates it; the source is no clone.
    let info = a.info().await.unwrap().sandbox.unwrap();
    assert_eq!(info.clone_isolation, Some(isolation_under(abi)));
    let source_info = source.info().await.unwrap().sandbox.unwrap();
    assert_eq!(source_info.clone_isolation, None);
    assert_eq!(info.uid, source_info.uid, "a clone keeps its source's uid");
}

#[tokio::test]
async fn clones_of_clones_are_isolated_down_to_the_layer_limit() {
    require_root();
    let engine = engine_with(confined(62_800)).await;
    let source = new_session(&engine).await;
    value(&source, "import os\nopen('depth', 'w').write('0')\n1").await;
    let mut lineage = vec![source];
    for depth in 1..=pyvisor::MAX_CLONE_GENERATIONS {
        let clone = clone_of(lineage.last().unwrap()).await;
        let copied = value(&clone, "open('depth').read()").await;
        assert_eq!(
            copied,
            format!("'{}'", depth - 1),
            "the copy of its source's"
        );
        value(&clone, &format!("open('depth', 'w').write('{depth}')\n1")).await;
        lineage.push(clone);
    }
    // The deepest clone, under 16 layers, is isolated from the clone it came from.
    let (parent, deepest) = (&lineage[lineage.len() - 2], lineage.last().unwrap());
    let parent_dir = value(parent, "os.getcwd()").await;
    let read = format!("open({parent_dir} + '/depth').read()");
    assert_eq!(attack(deepest, &read).await, "EACCES");
    if landlock_abi(deepest).await >= 6 {
        let kill = format!("os.kill({}, 9)", parent.pid().unwrap());
        assert_eq!(attack(deepest, &kill).await, "EPERM");
    }
    let err = deepest.fork(1, vec![]).await.unwrap_err();
    assert!(
        matches!(
            &err,
            EngineError::Supervisor(SupervisorError::Clone { source, .. })
                if matches!(**source, SpawnError::CloneTooDeep { limit }
                    if limit == pyvisor::MAX_CLONE_GENERATIONS)
        ),
        "{err}"
    );
    assert_eq!(value(deepest, "open('depth').read()").await, "'15'");
}

#[tokio::test]
async fn closing_a_clone_or_its_source_spares_the_rest_of_the_family() {
    require_root();
    let engine = engine_with(confined(62_820)).await;
    let source = new_session(&engine).await;
    let forked = within(source.fork(2, vec![])).await.unwrap();
    let mut clones = forked.sessions.into_iter();
    let (a, b) = (clones.next().unwrap(), clones.next().unwrap());
    let sleeper_of = |repr: String| repr.parse::<u32>().expect("a pid");
    let b_sleeper = sleeper_of(value(&b, SETSID_GRANDCHILD).await);
    let source_sleeper = sleeper_of(value(&source, SETSID_GRANDCHILD).await);
    value(&a, SETSID_GRANDCHILD).await;

    // Closing a clone sweeps nothing of the uid its source and sibling run as.
    within(a.close()).await.unwrap();
    assert_eq!(value(&source, "1 + 1").await, "2");
    assert_eq!(value(&b, "1 + 1").await, "2");
    assert!(process_running(b_sleeper) && process_running(source_sleeper));

    // Nor does closing the source: the clone goes on in its own directory.
    within(source.close()).await.unwrap();
    assert!(
        process_running(b_sleeper),
        "the clone's own process lives on"
    );
    value(&b, "import os\nopen('still-here', 'w').write('yes')\n1").await;
    assert_eq!(value(&b, "open('still-here').read()").await, "'yes'");

    // The last of the family takes its processes with it.
    within(b.close()).await.unwrap();
    let gone = pyvisor_tests::eventually_gone(b_sleeper, process_running).await;
    assert!(gone, "the clone's process outlived the family");
}

#[tokio::test]
async fn an_isolated_clone_restores_and_comes_back_from_its_own_checkpoints() {
    require_root();
    let engine = engine_with(confined(62_840)).await;
    let source = new_session(&engine).await;
    value(&source, "data = {'from': 'source'}\n1").await;
    let clone = clone_of(&source).await;
    value(&clone, "data['clone'] = True\n1").await;
    within(clone.checkpoint()).await.unwrap();
    // A restore hands the live clone copies of its blobs, in its own nest.
    value(&clone, "data['later'] = 1\n1").await;
    within(clone.restore(None)).await.unwrap();
    assert_eq!(
        value(&clone, "data").await,
        "{'from': 'source', 'clone': True}"
    );
    let killed = run(&clone, "import os\nos.kill(os.getpid(), 9)").await;
    assert_eq!(killed.status, ExecutionStatus::Crashed);
    assert_eq!(
        value(&clone, "data").await,
        "{'from': 'source', 'clone': True}"
    );
    // Its new worker is spawned, not forked: a uid of its own, and no clone any more.
    let (clone_info, source_info) = (clone.info().await.unwrap(), source.info().await.unwrap());
    let (clone_sandbox, source_sandbox) =
        (clone_info.sandbox.unwrap(), source_info.sandbox.unwrap());
    assert_ne!(clone_sandbox.uid, source_sandbox.uid);
    assert_eq!(clone_sandbox.clone_isolation, None);
    assert_eq!(value(&source, "data").await, "{'from': 'source'}");
}

#[tokio::test]
async fn a_clone_with_a_thread_before_its_layer_refuses_to_start() {
    require_root();
    let engine = engine_with(confined(62_860)).await;
    let source = new_session(&engine).await;
    // A thread started in the clone at the fork would keep the source's reach there.
    value(
        &source,
        "import os, threading, time\n\
         os.register_at_fork(after_in_child=lambda: threading.Thread(target=time.sleep, args=(60,), daemon=True).start())\n1",
    )
    .await;
    let err = source.fork(1, vec![]).await.unwrap_err();
    assert!(
        matches!(
            &err,
            EngineError::Supervisor(SupervisorError::Fork { reason, .. })
                if reason.contains("threads run in it before its Landlock layer")
        ),
        "{err}"
    );
    assert_eq!(value(&source, "1 + 1").await, "2");
}
