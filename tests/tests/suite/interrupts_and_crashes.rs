//! Interrupts and timeouts really stop code and leave the session usable; a dead worker
//! gives status `crashed` with a clear message and the session comes back fresh.

use std::time::Duration;

use pyvisor::{ExecuteRequest, ExecutionStatus};
use pyvisor_tests::{
    eventually_gone, process_gone, process_running, run, session, started, within,
};

#[tokio::test]
async fn interrupt_stops_blocking_sleep() {
    let (_engine, session) = session().await;
    run(&session, "kept = 1").await;
    let execution = started(&session, "import time\nprint('go')\ntime.sleep(60)").await;
    assert!(session.interrupt().await.unwrap());
    let result = tokio::time::timeout(Duration::from_secs(10), execution.result())
        .await
        .expect("the interrupt stops the sleep long before 60 s")
        .unwrap();
    assert_eq!(result.status, ExecutionStatus::Interrupted);
    assert_eq!(result.error.unwrap().type_name, "KeyboardInterrupt");
    assert_eq!(run(&session, "kept").await.result.unwrap().repr, "1");
}

#[tokio::test]
async fn interrupt_when_idle_reports_nothing_running() {
    let (_engine, session) = session().await;
    assert!(!session.interrupt().await.unwrap());
    assert_eq!(run(&session, "2").await.result.unwrap().repr, "2");
}

#[tokio::test]
async fn timeout_gives_status_timeout_and_the_session_stays_usable() {
    let (_engine, session) = session().await;
    run(&session, "kept = 'still here'").await;
    let request =
        ExecuteRequest::new("import time\ntime.sleep(60)").timeout(Duration::from_millis(300));
    let result = within(session.execute(request).await.unwrap().result())
        .await
        .unwrap();
    assert_eq!(result.status, ExecutionStatus::Timeout);
    assert_eq!(
        run(&session, "kept").await.result.unwrap().repr,
        "'still here'"
    );
}

#[tokio::test]
async fn code_that_ignores_interrupts_is_killed_after_the_grace_period() {
    let mut config = pyvisor::EngineConfig::default();
    config.limits.interrupt_grace = Duration::from_millis(300);
    let engine = pyvisor_tests::engine_with(config).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    let stubborn = "import time\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass";
    let request = ExecuteRequest::new(stubborn).timeout(Duration::from_millis(200));
    let result = within(session.execute(request).await.unwrap().result())
        .await
        .unwrap();
    assert_eq!(result.status, ExecutionStatus::Timeout);
    assert!(result.error.unwrap().message.contains("SIGKILL"));
    // The session restarted with a fresh worker.
    assert_eq!(run(&session, "1 + 1").await.result.unwrap().repr, "2");
}

#[tokio::test]
async fn os_exit_gives_crashed_and_a_fresh_session() {
    let (_engine, session) = session().await;
    let old_pid = session.info().await.unwrap().pid.unwrap();
    run(&session, "lost = 1").await;
    let result = run(&session, "import os\nos._exit(1)").await;
    assert_eq!(result.status, ExecutionStatus::Crashed);
    let message = result.error.unwrap().message;
    assert!(message.contains("exited with code 1"), "{message}");
    assert!(process_gone(old_pid).await, "the dead worker was reaped");
    let fresh = run(&session, "'lost' in globals()").await;
    assert_eq!(fresh.result.unwrap().repr, "False");
    assert_eq!(session.info().await.unwrap().restarts, 1);
}

#[tokio::test]
async fn sigkill_of_the_worker_gives_crashed() {
    let (_engine, session) = session().await;
    let result = run(
        &session,
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    )
    .await;
    assert_eq!(result.status, ExecutionStatus::Crashed);
    assert!(result.error.unwrap().message.contains("SIGKILL"));
    assert_eq!(run(&session, "3").await.result.unwrap().repr, "3");
}

#[tokio::test]
async fn garbage_on_the_protocol_pipe_is_a_typed_crash_not_a_panic() {
    let (_engine, session) = session().await;
    let result = run(
        &session,
        "import os\nos.write(4, b'\\x00\\x00\\x00\\x05junk!')\nimport time\ntime.sleep(5)",
    )
    .await;
    assert_eq!(result.status, ExecutionStatus::Crashed);
    let message = result.error.unwrap().message;
    assert!(message.contains("protocol error"), "{message}");
    assert_eq!(run(&session, "4").await.result.unwrap().repr, "4");
}

#[tokio::test]
async fn oversize_frame_from_the_worker_is_refused() {
    let (_engine, session) = session().await;
    let result = run(
        &session,
        "import os\nos.write(4, (2**31).to_bytes(4, 'big'))\nimport time\ntime.sleep(5)",
    )
    .await;
    assert_eq!(result.status, ExecutionStatus::Crashed);
    assert!(result.error.unwrap().message.contains("exceeds the limit"));
}

#[tokio::test]
async fn closing_the_protocol_pipe_is_detected() {
    let (_engine, session) = session().await;
    let result = run(
        &session,
        "import os\nos.close(4)\nimport time\ntime.sleep(5)",
    )
    .await;
    assert_eq!(result.status, ExecutionStatus::Crashed);
    assert_eq!(run(&session, "5").await.result.unwrap().repr, "5");
}

#[tokio::test]
async fn queued_executions_run_in_order_and_no_queue_refuses_when_busy() {
    let (_engine, session) = session().await;
    let slow = session
        .execute("import time\ntime.sleep(0.3)\norder = [1]")
        .await
        .unwrap();
    let next = session.execute("order.append(2)\norder").await.unwrap();
    let busy = session
        .execute(ExecuteRequest::new("1").no_queue())
        .await
        .unwrap_err();
    assert!(busy.to_string().contains("busy"), "{busy}");
    within(slow.result()).await.unwrap();
    assert_eq!(
        within(next.result()).await.unwrap().result.unwrap().repr,
        "[1, 2]"
    );
}

#[tokio::test]
async fn closing_a_session_ends_its_worker() {
    let (engine, session) = session().await;
    let pid = session.pid().expect("a created session knows its worker");
    let id = session.id().to_owned();
    session.close().await.unwrap();
    assert!(process_gone(pid).await);
    let live = engine.sessions(None).await.unwrap();
    assert!(live.iter().all(|session| session.id() != id));
}

#[tokio::test]
async fn dropping_the_engine_ends_every_worker() {
    let engine = pyvisor_tests::engine().await;
    let mut workers = Vec::new();
    let mut grandchildren = Vec::new();
    for _ in 0..3 {
        let session = engine.create_session(Default::default()).await.unwrap();
        // A grandchild in the worker's process group must go too.
        let child = run(
            &session,
            "import subprocess\nsubprocess.Popen(['sleep', '60']).pid",
        )
        .await;
        grandchildren.push(child.result.unwrap().repr.parse::<u32>().unwrap());
        workers.push(session.pid().expect("a created session knows its worker"));
    }
    drop(engine);
    for pid in workers {
        assert!(
            process_gone(pid).await,
            "worker {pid} outlived the engine or was not reaped"
        );
    }
    for pid in grandchildren {
        // Reaping a grandchild is init's job; it only has to be dead.
        assert!(
            eventually_gone(pid, process_running).await,
            "grandchild {pid} outlived the engine"
        );
    }
}

#[tokio::test]
async fn an_interrupt_right_after_execute_is_never_lost() {
    let (_engine, session) = session().await;
    run(&session, "kept = 'still here'").await;
    let pid = session.info().await.unwrap().pid.unwrap();
    for round in 0..50 {
        // No wait: the worker may not have taken the execution up when the interrupt comes.
        let execution = session
            .execute("import time\ntime.sleep(30)")
            .await
            .unwrap();
        assert!(session.interrupt().await.unwrap(), "round {round}");
        let result = within(execution.result()).await.unwrap();
        assert_eq!(
            result.status,
            ExecutionStatus::Interrupted,
            "round {round}: {result:?}"
        );
        assert_eq!(result.error.unwrap().type_name, "KeyboardInterrupt");
    }
    assert_eq!(
        run(&session, "kept").await.result.unwrap().repr,
        "'still here'"
    );
    let info = session.info().await.unwrap();
    assert_eq!(info.pid, Some(pid), "the worker was never replaced");
    assert_eq!(info.restarts, 0);
}

#[tokio::test]
async fn a_late_interrupt_does_not_disturb_the_next_execution() {
    let (_engine, session) = session().await;
    for round in 0..50 {
        // The interrupt races the end of `x = 1`: it may come while that runs, or after the
        // worker has finished it; either way it must not reach the next execution.
        let first = session.execute("x = 1").await.unwrap();
        session.interrupt().await.unwrap();
        let next = session.execute("'next'").await.unwrap();
        let first = within(first.result()).await.unwrap();
        assert!(
            matches!(
                first.status,
                ExecutionStatus::Ok | ExecutionStatus::Interrupted
            ),
            "round {round}: {first:?}"
        );
        let next = within(next.result()).await.unwrap();
        assert_eq!(next.status, ExecutionStatus::Ok, "round {round}: {next:?}");
        assert_eq!(next.result.unwrap().repr, "'next'");
    }
    assert_eq!(session.info().await.unwrap().restarts, 0);
}
