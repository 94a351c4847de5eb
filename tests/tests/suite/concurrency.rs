//! Many sessions executing at once on a small machine all complete, each with its own state.

use futures::future::join_all;
use pyvisor::ExecutionStatus;
use pyvisor_tests::{engine, within};

#[tokio::test]
async fn thirty_two_sessions_execute_at_once() {
    let engine = engine().await;
    let sessions = join_all((0..32).map(|_| engine.create_session(Default::default()))).await;
    let sessions: Vec<_> = sessions
        .into_iter()
        .map(|s| s.expect("session starts"))
        .collect();
    let runs = sessions.iter().enumerate().map(|(i, session)| async move {
        let code = format!(
            "import time\nmine = {i}\ntime.sleep(0.2)\nprint(mine)\nsum(range({i} * 1000))"
        );
        let result = session.run(code).await.expect("execution completes");
        (i, result)
    });
    for (i, result) in within(join_all(runs)).await {
        assert_eq!(
            result.status,
            ExecutionStatus::Ok,
            "session {i}: {:?}",
            result.error
        );
        assert_eq!(result.stdout, format!("{i}\n"));
        let expected: u64 = (0..i as u64 * 1000).sum();
        assert_eq!(result.result.unwrap().repr, expected.to_string());
    }
    assert_eq!(engine.sessions(None).await.unwrap().len(), 32);
}
