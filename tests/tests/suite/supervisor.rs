//! The supervisor: named sessions, owners, restarts under the same id, and graceful stop.

use std::time::Duration;

use futures::future::join_all;
use pyvisor::{
    EngineConfig, EngineError, ExecuteRequest, ExecutionStatus, SessionError, SessionOptions,
    SessionPhase, SupervisorError,
};
use pyvisor_tests::{engine, engine_with, manual_checkpoints, process_gone, run, started, within};

fn named(name: &str, owner: Option<&str>) -> SessionOptions {
    SessionOptions {
        name: Some(name.to_owned()),
        owner: owner.map(str::to_owned),
        ..Default::default()
    }
}

#[tokio::test]
async fn creating_a_session_under_a_taken_name_attaches_to_it() {
    let engine = engine().await;
    let first = engine
        .create_session(named("notebook", None))
        .await
        .unwrap();
    assert!(!first.attached());
    run(&first, "x = 41").await;
    let again = engine
        .create_session(named("notebook", None))
        .await
        .unwrap();
    assert!(again.attached());
    assert_eq!(again.id(), first.id());
    assert_eq!(run(&again, "x + 1").await.result.unwrap().repr, "42");
    assert_eq!(engine.stats().await.unwrap().sessions, 1);
}

#[tokio::test]
async fn a_session_taken_over_is_never_answered_by_another_of_its_name() {
    let engine = engine().await;
    let here = engine
        .create_session(named("work", Some("alice")))
        .await
        .unwrap();
    let taken_over = SessionOptions {
        take_over: Some("s-from-another-node-1".into()),
        ..named("work", Some("alice"))
    };
    match engine.create_session(taken_over).await {
        Err(EngineError::Supervisor(SupervisorError::NameTaken { name, other, .. })) => {
            assert_eq!(name, "work");
            assert_eq!(other, here.id());
        }
        Err(other) => panic!("expected NameTaken, got {other}"),
        Ok(session) => panic!("answered by session {}", session.id()),
    }
    // Without a clash the session keeps the id it had, and a second take-over finds it.
    let options = SessionOptions {
        take_over: Some("s-from-another-node-2".into()),
        ..named("play", Some("alice"))
    };
    let taken = engine.create_session(options.clone()).await.unwrap();
    assert_eq!(taken.id(), "s-from-another-node-2");
    run(&taken, "x = 1").await;
    let again = engine.create_session(options).await.unwrap();
    assert!(again.attached());
    assert_eq!(run(&again, "x").await.result.unwrap().repr, "1");
}

#[tokio::test]
async fn concurrent_creates_of_one_name_make_one_session() {
    let engine = engine().await;
    let creates = (0..6).map(|_| engine.create_session(named("shared", None)));
    let sessions: Vec<_> = within(join_all(creates))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(sessions.iter().all(|s| s.id() == sessions[0].id()));
    assert_eq!(sessions.iter().filter(|s| !s.attached()).count(), 1);
    assert_eq!(engine.sessions(None).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_closed_name_can_be_used_again() {
    let engine = engine().await;
    let first = engine.create_session(named("scratch", None)).await.unwrap();
    let first_id = first.id().to_owned();
    first.close().await.unwrap();
    let second = engine.create_session(named("scratch", None)).await.unwrap();
    assert!(!second.attached());
    assert_ne!(second.id(), first_id);
}

#[tokio::test]
async fn a_caller_that_states_an_owner_reaches_only_its_own_sessions() {
    let engine = engine().await;
    let alice = engine
        .create_session(named("alice-main", Some("alice")))
        .await
        .unwrap();
    let bob = engine
        .create_session(named("bob-main", Some("bob")))
        .await
        .unwrap();
    let listed: Vec<String> = engine
        .sessions(Some("alice"))
        .await
        .unwrap()
        .iter()
        .map(|s| s.id().to_owned())
        .collect();
    assert_eq!(listed, [alice.id()]);
    assert_eq!(engine.sessions(None).await.unwrap().len(), 2);

    // By id or by name, another owner's session is unknown.
    for key in [bob.id(), "bob-main"] {
        match engine.session(key, Some("alice")).await {
            Err(EngineError::Supervisor(SupervisorError::UnknownSession { .. })) => {}
            other => panic!("alice must not reach bob's session, got {other:?}"),
        }
    }
    let found = engine.session("bob-main", Some("bob")).await.unwrap();
    assert_eq!(found.id(), bob.id());
    assert_eq!(found.owner(), Some("bob"));
    // Stating no owner reaches everything (the embedding program itself).
    assert_eq!(engine.session(bob.id(), None).await.unwrap().id(), bob.id());

    // Names are per owner: alice's "bob-main" is a session of her own, not bob's.
    let alices = engine
        .create_session(named("bob-main", Some("alice")))
        .await
        .unwrap();
    assert!(!alices.attached());
    assert_ne!(alices.id(), bob.id());
    assert_eq!(alices.owner(), Some("alice"));
    let again = engine
        .create_session(named("bob-main", Some("bob")))
        .await
        .unwrap();
    assert!(again.attached());
    assert_eq!(again.id(), bob.id());
}

#[tokio::test]
async fn a_session_whose_worker_dies_comes_back_under_the_same_id_and_says_so() {
    // No automatic checkpoint: the session is to come back with a fresh namespace.
    let engine = engine_with(EngineConfig {
        state: manual_checkpoints(),
        ..EngineConfig::default()
    })
    .await;
    let session = engine
        .create_session(named("survivor", None))
        .await
        .unwrap();
    run(&session, "x = 1").await;
    let pid = session.pid().unwrap();
    let crashed = run(
        &session,
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    )
    .await;
    assert_eq!(crashed.status, ExecutionStatus::Crashed);
    assert!(crashed.error.unwrap().message.contains("fresh namespace"));
    assert!(process_gone(pid).await);

    let fresh = run(&session, "'x' in globals()").await;
    assert_eq!(fresh.result.unwrap().repr, "False");
    let info = session.info().await.unwrap();
    assert_eq!(info.restarts, 1);
    assert_eq!(info.phase, SessionPhase::Idle);
    assert_ne!(info.pid, Some(pid));
    let found = engine.session("survivor", None).await.unwrap();
    assert_eq!(found.id(), session.id());
    assert_eq!(engine.stats().await.unwrap().crashes, 1);
}

#[tokio::test]
async fn shutdown_lets_a_running_execution_finish_within_the_grace_period() {
    let engine = engine().await;
    let session = engine.create_session(Default::default()).await.unwrap();
    let pid = session.pid().unwrap();
    let running = started(
        &session,
        "import time\nprint('started', flush=True)\ntime.sleep(0.5)\n'finished'",
    )
    .await;
    let queued = session.execute("'never runs'").await.unwrap();
    within(engine.shutdown(Duration::from_secs(20)))
        .await
        .unwrap();

    let result = within(running.result()).await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Ok);
    assert_eq!(result.result.unwrap().repr, "'finished'");
    let refused = within(queued.result()).await.unwrap();
    assert_eq!(refused.error.unwrap().type_name, "NotExecuted");
    assert!(process_gone(pid).await);

    match engine.create_session(Default::default()).await {
        Err(EngineError::Supervisor(SupervisorError::ShuttingDown)) => {}
        other => panic!("a stopped engine must refuse sessions, got {other:?}"),
    }
    match session.run("1").await {
        Err(EngineError::Session(SessionError::Closed { .. })) => {}
        other => panic!("a stopped engine must refuse executions, got {other:?}"),
    }
}

#[tokio::test]
async fn shutdown_ends_executions_that_outlast_the_grace_period() {
    let engine = engine().await;
    let session = engine.create_session(Default::default()).await.unwrap();
    let pid = session.pid().unwrap();
    let running = started(
        &session,
        ExecuteRequest::new("import time\nprint('started', flush=True)\ntime.sleep(600)")
            .timeout(Duration::from_secs(900)),
    )
    .await;
    within(engine.shutdown(Duration::from_millis(200)))
        .await
        .unwrap();
    let result = within(running.result()).await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Interrupted);
    assert_eq!(result.error.unwrap().type_name, "SessionClosed");
    assert!(process_gone(pid).await);
}

#[tokio::test]
async fn executions_are_refused_while_the_engine_drains() {
    let engine = engine().await;
    let busy = engine.create_session(Default::default()).await.unwrap();
    let other = engine.create_session(Default::default()).await.unwrap();
    let running = started(
        &busy,
        "import time\nprint('started', flush=True)\ntime.sleep(1)",
    )
    .await;
    let stopping = tokio::spawn({
        let engine = engine.clone();
        async move { engine.shutdown(Duration::from_secs(20)).await }
    });
    // Executions run until the drain begins, and are refused from then on.
    within(async {
        loop {
            match other.run("1").await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(EngineError::Session(SessionError::ShuttingDown { .. })) => return,
                other => panic!("a draining engine must refuse new executions, got {other:?}"),
            }
        }
    })
    .await;
    within(stopping).await.unwrap().unwrap();
    assert_eq!(
        within(running.result()).await.unwrap().status,
        ExecutionStatus::Ok
    );
}
