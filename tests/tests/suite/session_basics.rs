//! A session keeps its namespace, returns the repr of a final expression, reports errors with
//! the user's traceback, and keeps running after `sys.exit()`.

use pyvisor::ExecutionStatus;
use pyvisor_tests::{run, session};

#[tokio::test]
async fn state_persists_across_executions() {
    let (_engine, session) = session().await;
    assert_eq!(run(&session, "x = 41").await.status, ExecutionStatus::Ok);
    run(&session, "def bump(v):\n    return v + 1").await;
    let result = run(&session, "bump(x)").await;
    assert_eq!(result.result.expect("a value").repr, "42");
}

#[tokio::test]
async fn final_expression_repr_and_type_come_back() {
    let (_engine, session) = session().await;
    let result = run(&session, "items = ['a', 2]\nitems").await;
    let value = result.result.expect("a value");
    assert_eq!(value.repr, "['a', 2]");
    assert_eq!(value.type_name, "list");
    assert!(run(&session, "None").await.result.is_none());
    assert!(run(&session, "y = 3").await.result.is_none());
}

#[tokio::test]
async fn main_namespace_is_main() {
    let (_engine, session) = session().await;
    let result = run(&session, "__name__").await;
    assert_eq!(result.result.unwrap().repr, "'__main__'");
}

#[tokio::test]
async fn exception_reports_type_message_and_user_traceback() {
    let (_engine, session) = session().await;
    let result = run(&session, "d = {}\nd['missing']").await;
    assert_eq!(result.status, ExecutionStatus::Error);
    let error = result.error.expect("an error");
    assert_eq!(error.type_name, "KeyError");
    assert_eq!(error.message, "'missing'");
    let traceback = error.traceback.concat();
    assert!(traceback.contains("d['missing']"), "{traceback}");
    assert!(
        !traceback.contains("worker"),
        "worker internals leak: {traceback}"
    );
}

#[tokio::test]
async fn syntax_error_is_an_error_result() {
    let (_engine, session) = session().await;
    let result = run(&session, "def broken(:\n    pass").await;
    assert_eq!(result.status, ExecutionStatus::Error);
    assert_eq!(result.error.unwrap().type_name, "SyntaxError");
}

#[tokio::test]
async fn sys_exit_ends_the_execution_not_the_session() {
    let (_engine, session) = session().await;
    run(&session, "kept = 'yes'").await;
    let result = run(&session, "import sys\nsys.exit(3)").await;
    assert_eq!(result.status, ExecutionStatus::Error);
    let error = result.error.unwrap();
    assert_eq!(error.type_name, "SystemExit");
    assert_eq!(error.message, "3");
    assert_eq!(run(&session, "kept").await.result.unwrap().repr, "'yes'");
}

#[tokio::test]
async fn execution_counts_and_ids_increase() {
    let (_engine, session) = session().await;
    let first = run(&session, "1").await;
    let second = run(&session, "2").await;
    assert_eq!(second.execution_count, first.execution_count + 1);
    assert_eq!(second.execution_id, format!("e-{}", second.execution_count));
}

#[tokio::test]
async fn stdin_reads_end_of_file() {
    let (_engine, session) = session().await;
    let result = run(&session, "import sys\nsys.stdin.read()").await;
    assert_eq!(result.result.unwrap().repr, "''");
}

#[tokio::test]
async fn worker_sees_no_file_descriptors_beyond_0_to_5() {
    let (_engine, session) = session().await;
    // The directory scan opens an fd of its own; it is closed again when listdir returns.
    let code = "import os\n\
                def is_open(fd):\n\
                \x20   try:\n\
                \x20       os.fstat(fd)\n\
                \x20       return True\n\
                \x20   except OSError:\n\
                \x20       return False\n\
                sorted(fd for fd in map(int, os.listdir('/proc/self/fd')) if is_open(fd))";
    let result = run(&session, code).await;
    let fds = result.result.unwrap().repr;
    assert!(
        fds == "[0, 1, 2, 3, 4, 5]",
        "fds visible to the worker: {fds}"
    );
}

#[tokio::test]
async fn display_sends_the_richest_representation() {
    let (_engine, session) = session().await;
    let code = "class Table:\n    def _repr_html_(self):\n        return '<b>hi</b>'\n\
                display(Table())\ndisplay(7)";
    let result = run(&session, code).await;
    let mimes: Vec<_> = result
        .display
        .iter()
        .map(|d| (d.mime.as_str(), d.data.as_str()))
        .collect();
    assert_eq!(mimes, [("text/html", "<b>hi</b>"), ("text/plain", "7")]);
}

#[tokio::test]
async fn long_repr_is_capped() {
    let mut config = pyvisor::EngineConfig::default();
    config.limits.result_repr_bytes = 100;
    let engine = pyvisor_tests::engine_with(config).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    let repr = run(&session, "'x' * 10_000").await.result.unwrap().repr;
    assert!(repr.len() < 120, "repr of {} bytes", repr.len());
    assert!(repr.starts_with("'xxxx"));
}
