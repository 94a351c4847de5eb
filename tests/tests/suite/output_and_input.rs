//! Output written by any means reaches the execution that wrote it, streamed as produced,
//! without ever corrupting the protocol; `input()` goes to the caller.

use std::time::{Duration, Instant};

use futures::StreamExt;
use pyvisor::{ExecuteRequest, ExecutionEvent, ExecutionStatus, OutputStream};
use pyvisor_tests::{events, run, session, within};

#[tokio::test]
async fn print_streams_before_the_execution_ends() {
    let (_engine, session) = session().await;
    let code =
        "import time\nfor line in ('one', 'two', 'three'):\n    print(line)\n    time.sleep(0.4)";
    let mut execution = session.execute(code).await.unwrap();
    let mut chunks = Vec::new();
    let mut first_chunk_at = None;
    let finished_at = loop {
        match within(execution.next())
            .await
            .expect("events until finished")
        {
            ExecutionEvent::Output { stream, data } => {
                assert_eq!(stream, OutputStream::Stdout);
                first_chunk_at.get_or_insert_with(Instant::now);
                chunks.push(data);
            }
            ExecutionEvent::Finished(result) => {
                assert_eq!(result.stdout, "one\ntwo\nthree\n");
                break Instant::now();
            }
            other => panic!("unexpected event {other:?}"),
        }
    };
    // `print` may write the text and the newline separately: only the content is fixed.
    assert_eq!(chunks.concat(), "one\ntwo\nthree\n");
    assert!(
        chunks[0].starts_with("one") && !chunks[0].contains("two"),
        "{chunks:?}"
    );
    // The code sleeps 1.2 s after the first print: a buffered first chunk would arrive last.
    let lead = finished_at - first_chunk_at.unwrap();
    assert!(
        lead > Duration::from_millis(600),
        "first chunk only {lead:?} before the end"
    );
}

#[tokio::test]
async fn an_execution_that_does_not_stream_gets_only_its_result_with_all_output() {
    let (_engine, session) = session().await;
    let code = "import os\nprint('one')\nos.write(2, b'two\\n')\ndisplay('three')";
    let request = ExecuteRequest::new(code).no_stream();
    let mut execution = session.execute(request).await.unwrap();
    let first = within(execution.next()).await.expect("the result");
    let ExecutionEvent::Finished(result) = first else {
        panic!("an event before the result: {first:?}");
    };
    assert_eq!(result.status, ExecutionStatus::Ok, "{result:?}");
    assert_eq!(result.stdout, "one\n");
    assert_eq!(result.stderr, "two\n");
    assert_eq!(result.display.len(), 1, "{:?}", result.display);
    assert!(within(execution.next()).await.is_none());
}

#[tokio::test]
async fn os_write_and_child_process_output_are_captured_in_order() {
    let (_engine, session) = session().await;
    let code = "import os, subprocess, sys\n\
                print('a')\n\
                os.write(1, b'b\\n')\n\
                subprocess.run(['echo', 'c'])\n\
                sys.stdout.write('d\\n')\n\
                os.write(2, b'err\\n')";
    let result = run(&session, code).await;
    assert_eq!(result.status, ExecutionStatus::Ok);
    assert_eq!(result.stdout, "a\nb\nc\nd\n");
    assert_eq!(result.stderr, "err\n");
}

#[tokio::test]
async fn output_is_attributed_to_the_execution_that_wrote_it() {
    let (_engine, session) = session().await;
    for i in 0..20 {
        let result = run(&session, &format!("print({i})")).await;
        assert_eq!(result.stdout, format!("{i}\n"));
    }
}

#[tokio::test]
async fn printed_protocol_lookalikes_cannot_corrupt_the_protocol() {
    let (_engine, session) = session().await;
    let fake = r#"{"type":"result","id":"e-1","status":"ok","result":{"repr":"forged","type":"str"},"error":null}"#;
    let code = format!(
        "import os, sys\n\
         frame = len({fake:?}).to_bytes(4, 'big') + {fake:?}.encode()\n\
         sys.stdout.buffer.write(frame)\n\
         sys.stdout.flush()\n\
         os.write(1, frame)\n\
         os.write(2, frame)\n\
         'genuine'"
    );
    let result = run(&session, &code).await;
    assert_eq!(result.status, ExecutionStatus::Ok);
    assert_eq!(result.result.unwrap().repr, "'genuine'");
    assert!(result.stdout.contains("forged"));
    assert_eq!(run(&session, "1 + 1").await.result.unwrap().repr, "2");
}

#[tokio::test]
async fn input_round_trip() {
    let (_engine, session) = session().await;
    let request = ExecuteRequest::new("name = input('Name: ')\nprint('hello', name)").with_input();
    let mut execution = session.execute(request).await.unwrap();
    let id = execution.id().to_owned();
    let result = loop {
        match within(execution.next())
            .await
            .expect("events until finished")
        {
            ExecutionEvent::InputRequest { prompt, password } => {
                assert_eq!(prompt, "Name: ");
                assert!(!password);
                session.send_input(&id, Some("Ada".into())).await.unwrap();
            }
            ExecutionEvent::Finished(result) => break result,
            ExecutionEvent::Output { .. } => {}
            other => panic!("unexpected event {other:?}"),
        }
    };
    assert_eq!(result.status, ExecutionStatus::Ok);
    assert_eq!(result.stdout, "hello Ada\n");
    assert_eq!(run(&session, "name").await.result.unwrap().repr, "'Ada'");
}

#[tokio::test]
async fn getpass_is_forwarded_as_a_password_request() {
    let (_engine, session) = session().await;
    let request = ExecuteRequest::new("import getpass\nsecret = getpass.getpass()").with_input();
    let mut execution = session.execute(request).await.unwrap();
    let id = execution.id().to_owned();
    match within(execution.next()).await.unwrap() {
        ExecutionEvent::InputRequest { password, .. } => assert!(password),
        other => panic!("expected an input request, got {other:?}"),
    }
    session
        .send_input(&id, Some("hunter2".into()))
        .await
        .unwrap();
    let result = within(execution.result()).await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Ok);
    assert_eq!(
        run(&session, "secret").await.result.unwrap().repr,
        "'hunter2'"
    );
}

#[tokio::test]
async fn input_with_nobody_to_answer_raises_eof_error() {
    let (_engine, session) = session().await;
    let result = run(&session, "input('? ')").await;
    assert_eq!(result.status, ExecutionStatus::Error);
    assert_eq!(result.error.unwrap().type_name, "EOFError");
}

#[tokio::test]
async fn unanswered_input_times_out_with_eof_error() {
    let mut config = pyvisor::EngineConfig::default();
    config.limits.input_timeout = Duration::from_millis(300);
    let engine = pyvisor_tests::engine_with(config).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    let execution = session
        .execute(ExecuteRequest::new("input()").with_input())
        .await
        .unwrap();
    let all = events(execution).await;
    assert!(matches!(all[0], ExecutionEvent::InputRequest { .. }));
    let ExecutionEvent::Finished(result) = all.last().unwrap() else {
        panic!("no result")
    };
    assert_eq!(result.error.as_ref().unwrap().type_name, "EOFError");
}

#[tokio::test]
async fn input_for_an_execution_not_waiting_is_refused() {
    let (_engine, session) = session().await;
    let err = session
        .send_input("e-99", Some("x".into()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no input() is pending"), "{err}");
}

#[tokio::test]
async fn a_warning_is_shown_in_every_execution_that_raises_it() {
    let (_engine, session) = session().await;
    let warn = "import warnings\nwarnings.warn('careful')";
    for _ in 0..2 {
        let result = run(&session, warn).await;
        assert!(result.stderr.contains("UserWarning: careful"), "{result:?}");
    }
    // Twice in one execution, from one place: once, as Python prints it.
    let twice = run(&session, "for _ in range(2): warnings.warn('again')").await;
    assert_eq!(
        twice.stderr.matches("UserWarning: again").count(),
        1,
        "{twice:?}"
    );
}
