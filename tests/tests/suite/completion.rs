//! `Session::complete`: names and attributes from the namespace, as rlcompleter finds them,
//! without calling anything the user did not name as a plain dotted name, and without
//! waiting for running code.

use futures::StreamExt;
use pyvisor::{EngineError, ExecutionEvent, SessionError};
use pyvisor_tests::{run, session, within};

#[tokio::test]
async fn completes_names_and_attributes_from_the_namespace() {
    let (_engine, session) = session().await;
    run(&session, "import math\nsales_total = 3\nsales_count = 4").await;
    let names = session.complete("sales_", None).await.unwrap();
    assert_eq!(names.matches, ["sales_count", "sales_total"]);
    assert!(!names.busy);
    let attributes = session.complete("x = math.facto", None).await.unwrap();
    assert_eq!(attributes.matches, ["math.factorial("]);
    // Builtins and keywords too; the cursor may stand before the end.
    let builtins = session.complete("pri(1)", Some(3)).await.unwrap();
    assert_eq!(builtins.matches, ["print("]);
    let keywords = session.complete("whi", None).await.unwrap();
    assert_eq!(keywords.matches, ["while "]);
    // Private names only when asked for with an underscore.
    let public = session.complete("math.", None).await.unwrap();
    assert!(public.matches.iter().all(|m| !m.starts_with("math._")));
    let private = session.complete("math.__na", None).await.unwrap();
    assert_eq!(private.matches, ["math.__name__"]);
    // Non-ASCII code: the cursor counts characters.
    let text = "é = 1; sales_c";
    let counted = session
        .complete(text, Some(text.chars().count()))
        .await
        .unwrap();
    assert_eq!(counted.matches, ["sales_count"]);
}

#[tokio::test]
async fn completion_calls_nothing_and_runs_no_property_of_the_last_object() {
    let (_engine, session) = session().await;
    let setup = "calls = []\n\
        class Box:\n    \
            @property\n    \
            def heavy(self):\n        \
                calls.append('heavy')\n        \
                return 1\n    \
            def method(self):\n        \
                calls.append('method')\n\
        box = Box()\n\
        def make():\n    \
            calls.append('make')\n    \
            return box";
    run(&session, setup).await;
    let members = session.complete("box.", None).await.unwrap();
    assert_eq!(members.matches, ["box.heavy", "box.method("]);
    // Calls and subscripts before the dot are never evaluated.
    for code in [
        "make().",
        "[box][0].",
        "box.method().",
        "open('/tmp/x', 'w').wr",
    ] {
        let answer = session.complete(code, None).await.unwrap();
        assert!(answer.matches.is_empty(), "{code}: {:?}", answer.matches);
    }
    let calls = run(&session, "calls").await;
    assert_eq!(calls.result.unwrap().repr, "[]");
}

#[tokio::test]
async fn while_code_runs_the_answer_is_busy_at_once() {
    let (_engine, session) = session().await;
    run(&session, "import time\nready = 1").await;
    let mut running = session
        .execute("print('started', flush=True)\ntime.sleep(30)")
        .await
        .unwrap();
    match within(running.next()).await {
        Some(ExecutionEvent::Output { data, .. }) => assert!(data.contains("started")),
        other => panic!("expected the code's output first, got {other:?}"),
    }
    let answer = within(session.complete("rea", None)).await.unwrap();
    assert!(answer.busy);
    assert!(answer.matches.is_empty());
    session.interrupt().await.unwrap();
    while let Some(event) = within(running.next()).await {
        if let ExecutionEvent::Finished(_) = event {
            break;
        }
    }
    let after = session.complete("rea", None).await.unwrap();
    assert_eq!(after.matches, ["ready"]);
}

#[tokio::test]
async fn a_cursor_past_the_end_is_a_typed_error_and_the_session_goes_on() {
    let (_engine, session) = session().await;
    let err = session.complete("abc", Some(4)).await.unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Session(SessionError::CursorOutOfRange {
                cursor: 4,
                chars: 3
            })
        ),
        "{err:?}"
    );
    let result = run(&session, "1 + 1").await;
    assert_eq!(result.result.unwrap().repr, "2");
}
