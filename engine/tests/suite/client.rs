//! `pyvisor::client` against a real `pyvisor serve`: every method, many calls in flight on one
//! connection, streamed events in order and routed to the right execution, input, error
//! codes kept, and pending calls failed with `Closed` when the connection is lost.

use crate::common;

use std::time::Duration;

use common::Daemon;
use futures::StreamExt;
use pyvisor::client::{Client, ClientError, ClientExecution, Event};
use pyvisor::rpc::code;
use pyvisor::rpc::wire::{CreateParams, ExecuteParams};
use pyvisor::{ExecutionResult, ExecutionStatus, OutputStream};
use serde_json::json;

async fn client(daemon: &Daemon) -> Client {
    Client::connect(&daemon.socket)
        .await
        .expect("connect to the daemon")
}

async fn new_session(client: &Client) -> String {
    client
        .create_session(CreateParams::default())
        .await
        .expect("create a session")
        .session_id
}

/// Every event of a streaming execution: its stdout, the other events, and the result.
async fn collect(mut execution: ClientExecution) -> (String, Vec<Event>, ExecutionResult) {
    let mut stdout = String::new();
    let mut others = Vec::new();
    while let Some(event) = execution.next().await {
        match event.expect("the execution runs") {
            Event::Output {
                stream: OutputStream::Stdout,
                data,
            } => stdout.push_str(&data),
            Event::Finished(result) => {
                assert!(
                    execution.next().await.is_none(),
                    "Finished is the last event"
                );
                return (stdout, others, *result);
            }
            other => others.push(other),
        }
    }
    panic!("the events ended without Finished");
}

/// Reads output events until they add up to `expected` (the worker may split a write).
async fn wait_for_output(execution: &mut ClientExecution, expected: &str) {
    let mut seen = String::new();
    while seen.len() < expected.len() {
        match execution.next().await {
            Some(Ok(Event::Output { data, .. })) => seen.push_str(&data),
            other => panic!("expected output, got {other:?}"),
        }
    }
    assert_eq!(seen, expected);
}

fn rpc_code(err: ClientError) -> i64 {
    match err {
        ClientError::Rpc(err) => err.code,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_works() {
    let daemon = Daemon::start().await;
    let client = client(&daemon).await;

    let health = client.health().await.unwrap();
    assert_eq!(health.status, "ok");

    let params = CreateParams {
        name: Some("every-method".into()),
        owner: Some("alice".into()),
        ..CreateParams::default()
    };
    let created = client.create_session(params.clone()).await.unwrap();
    assert!(!created.attached);
    assert!(created.pid.is_some());
    let again = client.create_session(params).await.unwrap();
    assert!(again.attached, "the same name attaches");
    assert_eq!(again.session_id, created.session_id);
    let session = created.session_id;

    let result = client
        .execute(ExecuteParams::new(&session, "x = 20\nx * 2 + 2"))
        .await
        .unwrap();
    assert_eq!(result.status, ExecutionStatus::Ok);
    assert_eq!(result.result.unwrap().repr, "42");

    let info = client.info(&session).await.unwrap();
    assert_eq!(info.session_id, session);
    assert_eq!(info.name.as_deref(), Some("every-method"));
    assert_eq!(info.execution_count, 1);
    assert!(info.variables.iter().any(|v| v.name == "x"));
    // Names are per owner: alice's name is not in the namespace of an admin who names nobody.
    assert!(client.info("every-method").await.is_err());

    let listed = client.list(Some("alice")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].session_id, session);
    assert!(client.list(Some("bob")).await.unwrap().is_empty());

    let taken = client.checkpoint(&session).await.unwrap();
    assert!(taken.saved.contains(&"x".to_owned()));
    client
        .execute(ExecuteParams::new(&session, "x = 'changed'"))
        .await
        .unwrap();
    // Newest first; the session may have taken checkpoints of its own since.
    let checkpoints = client.checkpoints(&session).await.unwrap();
    assert!(checkpoints
        .iter()
        .any(|c| c.checkpoint_id == taken.checkpoint_id));
    assert!(checkpoints
        .windows(2)
        .all(|w| w[0].created_at >= w[1].created_at));
    let restored = client
        .restore(&session, Some(&taken.checkpoint_id))
        .await
        .unwrap();
    assert_eq!(restored.checkpoint_id, taken.checkpoint_id);
    let x = client
        .execute(ExecuteParams::new(&session, "x"))
        .await
        .unwrap();
    assert_eq!(x.result.unwrap().repr, "20");
    client.restore(&session, None).await.unwrap();

    assert!(!client.interrupt(&session).await.unwrap(), "nothing runs");

    let stats = client.stats().await.unwrap();
    assert!(stats.sessions >= 1);
    assert!(stats.executions >= 3);

    let raw = client.call("engine.health", json!(null)).await.unwrap();
    assert_eq!(raw["status"], "ok");
    // A notification gets no response, and the connection goes on.
    client.notify("engine.health", json!(null)).await.unwrap();
    assert_eq!(client.health().await.unwrap().status, "ok");

    client.close(&session, false).await.unwrap();
    let err = client.info(&session).await.unwrap_err();
    assert_eq!(rpc_code(err), code::UNKNOWN_SESSION);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_are_in_flight_on_one_connection() {
    let daemon = Daemon::start().await;
    let client = client(&daemon).await;
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(new_session(&client).await);
    }
    let mut calls = Vec::new();
    for i in 0..20 {
        let client = client.clone();
        let session = sessions[i % 4].clone();
        // Each one sleeps a little, so they overlap; half stream, half do not.
        let code = format!("import time\ntime.sleep(0.05)\nprint('call', {i})\n{i} * {i}");
        calls.push(tokio::spawn(async move {
            let params = ExecuteParams::new(session, code);
            if i % 2 == 0 {
                let execution = client.execute_streaming(params).await.unwrap();
                let (stdout, _, result) = collect(execution).await;
                assert_eq!(stdout, format!("call {i}\n"), "call {i} got its own output");
                (i, result)
            } else {
                (i, client.execute(params).await.unwrap())
            }
        }));
    }
    for call in calls {
        let (i, result) = call.await.unwrap();
        assert_eq!(result.status, ExecutionStatus::Ok);
        assert_eq!(result.stdout, format!("call {i}\n"));
        assert_eq!(result.result.unwrap().repr, (i * i).to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_output_arrives_in_order_before_finished() {
    let daemon = Daemon::start().await;
    let client = client(&daemon).await;
    let session = new_session(&client).await;
    let code = "import sys, time\n\
                for i in range(30):\n\
                \x20   print(i, flush=True)\n\
                \x20   if i % 10 == 0:\n\
                \x20       print('e', i, file=sys.stderr, flush=True)\n\
                \x20       time.sleep(0.02)\n\
                'done'";
    let execution = client
        .execute_streaming(ExecuteParams::new(&session, code))
        .await
        .unwrap();
    assert_eq!(execution.session_id(), session);
    let (stdout, others, result) = collect(execution).await;
    let expected: String = (0..30).map(|i| format!("{i}\n")).collect();
    assert_eq!(stdout, expected);
    assert_eq!(result.stdout, expected);
    let stderr: String = others
        .iter()
        .map(|event| match event {
            Event::Output {
                stream: OutputStream::Stderr,
                data,
            } => data.clone(),
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    assert_eq!(stderr, "e 0\ne 10\ne 20\n");
    assert_eq!(result.result.unwrap().repr, "'done'");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_streaming_executions_of_one_session_keep_their_order_and_output() {
    let daemon = Daemon::start().await;
    let client = client(&daemon).await;
    let session = new_session(&client).await;
    let mut executions = Vec::new();
    for i in 0..4 {
        // The first one runs long enough for the others to queue behind it.
        let code = format!(
            "import time\ntime.sleep({})\nprint('run', {i})",
            0.2 / (i + 1) as f64
        );
        let execution = client
            .execute_streaming(ExecuteParams::new(&session, code))
            .await
            .unwrap();
        executions.push(execution);
    }
    // A plain execute started now still runs after them.
    let plain = client.execute(ExecuteParams::new(&session, "'last'"));
    let mut counts = Vec::new();
    for (i, execution) in executions.into_iter().enumerate() {
        let (stdout, _, result) = collect(execution).await;
        assert_eq!(stdout, format!("run {i}\n"));
        counts.push(result.execution_count);
    }
    let plain = plain.await.unwrap();
    counts.push(plain.execution_count);
    assert!(
        counts.windows(2).all(|w| w[0] < w[1]),
        "in order: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_by_name_routes_the_events() {
    let daemon = Daemon::start().await;
    let creator = client(&daemon).await;
    let params = CreateParams {
        name: Some("by-name".into()),
        ..CreateParams::default()
    };
    let session = creator.create_session(params).await.unwrap().session_id;
    // A second connection has never seen the name.
    let client = client(&daemon).await;
    let execution = client
        .execute_streaming(ExecuteParams::new("by-name", "print('hello')"))
        .await
        .unwrap();
    assert_eq!(execution.session_id(), session);
    let (stdout, _, result) = collect(execution).await;
    assert_eq!(stdout, "hello\n");
    assert_eq!(result.status, ExecutionStatus::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_is_answered_through_execute_streaming() {
    let daemon = Daemon::start().await;
    let client = client(&daemon).await;
    let session = new_session(&client).await;
    let code = "a = input('first? ')\nprint('got', a)\ninput('second? ')";
    let mut execution = client
        .execute_streaming(ExecuteParams::new(&session, code))
        .await
        .unwrap();
    let mut prompts = Vec::new();
    let mut stdout = String::new();
    let result = loop {
        match execution.next().await.unwrap().unwrap() {
            Event::InputRequest {
                execution_id,
                prompt,
                password,
            } => {
                assert!(!password);
                assert_eq!(execution.execution_id(), Some(execution_id.as_str()));
                // The first is answered, the second gets end of input.
                let value = prompts.is_empty().then(|| "yes".to_owned());
                prompts.push(prompt);
                client
                    .send_input(&session, &execution_id, value)
                    .await
                    .unwrap();
            }
            Event::Output { data, .. } => stdout.push_str(&data),
            Event::Finished(result) => break result,
            Event::Display { .. } => {}
        }
    };
    assert_eq!(prompts, ["first? ", "second? "]);
    assert_eq!(stdout, "got yes\n");
    assert_eq!(result.status, ExecutionStatus::Error);
    assert_eq!(result.error.unwrap().type_name, "EOFError");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_stops_a_streaming_execution() {
    let daemon = Daemon::start().await;
    let client = client(&daemon).await;
    let session = new_session(&client).await;
    let code = "import time\nprint('sleeping', flush=True)\ntime.sleep(30)";
    let mut execution = client
        .execute_streaming(ExecuteParams::new(&session, code))
        .await
        .unwrap();
    wait_for_output(&mut execution, "sleeping\n").await;
    assert!(client.interrupt(&session).await.unwrap());
    let result = execution.result().await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Interrupted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_keep_their_codes() {
    let daemon = Daemon::start().await;
    let client = client(&daemon).await;
    let err = client
        .execute(ExecuteParams::new("s-nope", "1"))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(err), code::UNKNOWN_SESSION);
    let err = client
        .execute_streaming(ExecuteParams::new("s-nope", "1"))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(err), code::UNKNOWN_SESSION);
    let err = client.close("s-nope", false).await.unwrap_err();
    assert_eq!(rpc_code(err), code::UNKNOWN_SESSION);
    let err = client.call("no.such.method", json!({})).await.unwrap_err();
    assert_eq!(rpc_code(err), code::METHOD_NOT_FOUND);
    let err = client
        .call("session.execute", json!({"session_id": 7}))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(err), code::INVALID_PARAMS);

    // queue: false while this connection's streaming execution runs: busy.
    let session = new_session(&client).await;
    let running = client
        .execute_streaming(ExecuteParams::new(&session, "import time\ntime.sleep(0.5)"))
        .await
        .unwrap();
    let params = ExecuteParams {
        queue: Some(false),
        ..ExecuteParams::new(&session, "1")
    };
    let err = client.execute(params).await.unwrap_err();
    assert_eq!(rpc_code(err), code::SESSION_BUSY);
    assert_eq!(running.result().await.unwrap().status, ExecutionStatus::Ok);
    // A request over the server's line limit is refused before it is sent, since the
    // server's answer to it could not name the call.
    let huge = format!("x = '{}'", "y".repeat(17 * 1024 * 1024));
    let err = client
        .execute(ExecuteParams::new(&session, huge))
        .await
        .unwrap_err();
    assert_eq!(rpc_code(err), code::LIMIT_EXCEEDED);
    // The connection is still fine after all of these.
    assert_eq!(client.health().await.unwrap().status, "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_connection_fails_pending_calls_with_closed() {
    let mut daemon = Daemon::start().await;
    let client = client(&daemon).await;
    let session = new_session(&client).await;
    let long = "import time\ntime.sleep(30)";
    let mut streaming = client
        .execute_streaming(ExecuteParams::new(
            &session,
            "print('started', flush=True)\n".to_owned() + long,
        ))
        .await
        .unwrap();
    let plain_session = new_session(&client).await;
    let plain = tokio::spawn({
        let client = client.clone();
        let session = plain_session.clone();
        async move { client.execute(ExecuteParams::new(session, long)).await }
    });
    // Both are running once the streaming one has printed and the plain one's session is busy.
    wait_for_output(&mut streaming, "started\n").await;
    tokio::time::timeout(Duration::from_secs(30), async {
        while client.info(&plain_session).await.unwrap().state != "busy" {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the plain execution starts");
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();

    let end = streaming.next().await;
    assert!(matches!(end, Some(Err(ClientError::Closed))), "{end:?}");
    assert!(streaming.next().await.is_none());
    let plain = tokio::time::timeout(Duration::from_secs(10), plain)
        .await
        .expect("the pending call fails at once")
        .unwrap();
    assert!(matches!(plain, Err(ClientError::Closed)), "{plain:?}");
    // Later calls fail at once too.
    assert!(matches!(client.health().await, Err(ClientError::Closed)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_no_socket_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    match Client::connect(&path).await {
        Err(ClientError::Connect { path: named, .. }) => assert_eq!(named, path),
        other => panic!("expected a connect error, got {other:?}"),
    }
}
