//! Proactive memory through the public API, on real workers: a failure repeated across
//! sessions gets an insight with evidence and what worked, owners are kept apart, outcomes
//! survive a restart, the policy's threshold, budget and spacing hold, and feedback changes
//! what fires.

use pyvisor::{
    Engine, EngineConfig, ExecutionResult, ExecutionStatus, FeedbackTarget, MemoryConfig, Session,
    SessionOptions,
};
use pyvisor_tests::{engine_with, manual_checkpoints, run, state_dir};

const SETUP: &str = "import pandas as pd\ndf = pd.DataFrame({'a': [1.0, None, 3.0]})";
const FAILING: [&str; 4] = [
    "df = df.fillna(method='ffill')",
    "frame = df.fillna(method='ffill')",
    "filled = df.fillna(method='ffill')\nprint(filled)",
    "out = df.fillna(method='ffill')",
];
const FIX: &str = "df = df.ffill()";

fn config(memory: MemoryConfig) -> EngineConfig {
    EngineConfig {
        memory,
        state: manual_checkpoints(),
        ..EngineConfig::default()
    }
}

async fn owned(engine: &Engine, owner: &str) -> Session {
    engine
        .create_session(SessionOptions {
            owner: Some(owner.into()),
            ..SessionOptions::default()
        })
        .await
        .expect("session starts")
}

/// One session of `owner` that sets up, fails with `failing`, then fixes it.
async fn fail_then_fix(engine: &Engine, owner: &str, failing: &str) -> Vec<ExecutionResult> {
    let session = owned(engine, owner).await;
    let mut results = vec![run(&session, SETUP).await];
    results.push(run(&session, failing).await);
    assert_eq!(results[1].status, ExecutionStatus::Error, "{results:?}");
    results.push(run(&session, FIX).await);
    assert_eq!(results[2].status, ExecutionStatus::Ok, "{results:?}");
    results
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failure_repeated_across_sessions_gets_an_insight_with_what_worked() {
    let engine = engine_with(config(MemoryConfig::default())).await;
    let first = fail_then_fix(&engine, "alice", FAILING[0]).await;
    let second = fail_then_fix(&engine, "alice", FAILING[1]).await;
    assert!(
        first.iter().chain(&second).all(|r| r.insights.is_empty()),
        "no insight before the pattern failed twice: {second:?}"
    );
    let session = owned(&engine, "alice").await;
    run(&session, SETUP).await;
    let repeat = run(&session, FAILING[2]).await;
    assert_eq!(repeat.status, ExecutionStatus::Error);
    assert_eq!(repeat.insights.len(), 1, "{repeat:?}");
    let insight = &repeat.insights[0];
    assert_eq!(insight.kind, "failure_pattern");
    assert!(insight.id.starts_with("i-"), "{insight:?}");
    assert!(insight.confidence >= 0.8, "{insight:?}");
    assert_eq!(insight.evidence.len(), 2, "{insight:?}");
    assert!(insight.message.contains("TypeError"), "{insight:?}");
    let suggestion = insight.suggestion.as_deref().unwrap_or_default();
    assert!(suggestion.contains("df.ffill()"), "{insight:?}");

    // Before running, the same is known to a check, which spends no budget.
    let checked = engine.memory_check(Some("alice"), FAILING[3]);
    assert_eq!(checked.len(), 1, "{checked:?}");
    assert!(engine.memory_check(Some("alice"), FIX).is_empty());
    let stats = engine.memory_stats(Some("alice"));
    assert_eq!((stats.failures, stats.interruptions), (3, 1), "{stats:?}");
    assert_eq!(stats.failing_executions, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_owner_never_sees_another_owners_memories_or_insights() {
    let engine = engine_with(config(MemoryConfig::default())).await;
    fail_then_fix(&engine, "alice", FAILING[0]).await;
    fail_then_fix(&engine, "alice", FAILING[1]).await;
    let alice = owned(&engine, "alice").await;
    run(&alice, SETUP).await;
    let shown = run(&alice, FAILING[2]).await;
    assert_eq!(shown.insights.len(), 1, "{shown:?}");

    let bob = owned(&engine, "bob").await;
    run(&bob, SETUP).await;
    let same_code = run(&bob, FAILING[2]).await;
    assert!(same_code.insights.is_empty(), "{same_code:?}");
    assert!(engine.memory_check(Some("bob"), FAILING[3]).is_empty());
    let found = engine
        .memory_search(Some("bob"), FAILING[0], 100)
        .await
        .unwrap();
    assert!(!found.is_empty());
    assert!(found.iter().all(|o| o.owner == "bob"), "{found:?}");
    let everyone = engine.memory_search(None, FAILING[0], 100).await.unwrap();
    assert!(everyone.iter().any(|o| o.owner == "alice"), "{everyone:?}");
    assert_eq!(engine.memory_stats(Some("bob")).outcomes, 2);
    // Bob cannot mark Alice's insight, nor learn that it exists.
    let id: i64 = shown.insights[0].id[2..].parse().unwrap();
    let refused = engine
        .memory_feedback(Some("bob"), FeedbackTarget::Insight(id), -1, None)
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let evidence: i64 = shown.insights[0].evidence[0][2..].parse().unwrap();
    let refused = engine
        .memory_feedback(Some("bob"), FeedbackTarget::Outcome(evidence), -1, None)
        .await;
    assert!(refused.is_err(), "{refused:?}");
    // Sessions without an owner share their own memory, apart from both.
    assert!(engine.memory_check(None, FAILING[3]).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn outcomes_survive_an_engine_restart() {
    let dir = state_dir();
    let with_dir = || {
        let mut config = config(MemoryConfig::default());
        config.state.dir = Some(dir.clone());
        config
    };
    let engine = engine_with(with_dir()).await;
    fail_then_fix(&engine, "alice", FAILING[0]).await;
    fail_then_fix(&engine, "alice", FAILING[1]).await;
    let session = owned(&engine, "alice").await;
    run(&session, SETUP).await;
    let shown = run(&session, FAILING[2]).await;
    let shown_before: i64 = shown.insights[0].id[2..].parse().unwrap();
    let before = engine.memory_stats(Some("alice"));
    engine
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    drop(engine);

    let engine = engine_with(with_dir()).await;
    let after = engine.memory_stats(Some("alice"));
    assert_eq!(
        (after.outcomes, after.failures),
        (before.outcomes, before.failures)
    );
    assert_eq!(after.outcomes, 8, "{after:?}");
    assert!(after.warning.is_none(), "{after:?}");
    let checked = engine.memory_check(Some("alice"), FAILING[2]);
    assert_eq!(checked.len(), 1, "{checked:?}");
    assert!(checked[0]
        .suggestion
        .as_deref()
        .unwrap_or_default()
        .contains("ffill()"));
    // An insight shown before the restart still takes feedback, and ids do not repeat.
    engine
        .memory_feedback(
            Some("alice"),
            FeedbackTarget::Insight(shown_before),
            1,
            None,
        )
        .await
        .unwrap();
    let session = owned(&engine, "alice").await;
    run(&session, SETUP).await;
    let shown = run(&session, FAILING[3]).await;
    let shown_after: i64 = shown.insights[0].id[2..].parse().unwrap();
    assert!(
        shown_after > shown_before,
        "{shown_after} after {shown_before}"
    );
    let found = engine
        .memory_search(Some("alice"), FAILING[0], 1)
        .await
        .unwrap();
    assert_eq!(found[0].code.as_deref(), Some(FAILING[0]), "{found:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_threshold_decides_which_code_counts_as_the_same() {
    // The same failures; a strict threshold does not count a variant with other names.
    for (threshold, expected) in [(0.85, 1), (0.99, 0)] {
        let engine = engine_with(config(MemoryConfig {
            threshold,
            ..MemoryConfig::default()
        }))
        .await;
        fail_then_fix(&engine, "alice", FAILING[0]).await;
        fail_then_fix(&engine, "alice", FAILING[1]).await;
        let session = owned(&engine, "alice").await;
        run(&session, SETUP).await;
        let repeat = run(&session, FAILING[3]).await;
        assert_eq!(
            repeat.insights.len(),
            expected,
            "threshold {threshold}: {repeat:?}"
        );
    }
}

/// Runs the failing code over and over in one session after two earlier failures, and
/// returns the counts of the executions that carried an insight.
async fn insight_counts(memory: MemoryConfig, repeats: usize) -> Vec<u64> {
    let engine = engine_with(config(memory)).await;
    fail_then_fix(&engine, "alice", FAILING[0]).await;
    fail_then_fix(&engine, "alice", FAILING[1]).await;
    let session = owned(&engine, "alice").await;
    run(&session, SETUP).await;
    let mut counts = Vec::new();
    for _ in 0..repeats {
        let result = run(&session, FAILING[2]).await;
        if !result.insights.is_empty() {
            counts.push(result.execution_count);
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread")]
async fn spacing_and_budget_bound_the_insights_of_a_session() {
    let spaced = insight_counts(MemoryConfig::default(), 10).await;
    assert_eq!(spaced, [2, 5, 8, 11], "every third execution at most");
    let mut budget = MemoryConfig::default();
    budget.policy.budget = 2;
    budget.policy.spacing = 1;
    assert_eq!(insight_counts(budget, 6).await, [2, 3], "two at most");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_insight_on_a_sessions_first_execution() {
    let engine = engine_with(config(MemoryConfig::default())).await;
    fail_then_fix(&engine, "alice", FAILING[0]).await;
    fail_then_fix(&engine, "alice", FAILING[1]).await;
    let session = owned(&engine, "alice").await;
    // The very code that gets an insight later in the session gets none as its first.
    let first = run(&session, FAILING[2]).await;
    assert_eq!(first.status, ExecutionStatus::Error);
    assert!(first.insights.is_empty(), "{first:?}");
    run(&session, SETUP).await;
    let later = run(&session, FAILING[2]).await;
    assert_eq!(later.insights.len(), 1, "{later:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn feedback_changes_what_fires() {
    let engine = engine_with(config(MemoryConfig::default())).await;
    fail_then_fix(&engine, "alice", FAILING[0]).await;
    fail_then_fix(&engine, "alice", FAILING[1]).await;
    let session = owned(&engine, "alice").await;
    run(&session, SETUP).await;
    let shown = run(&session, FAILING[2]).await;
    let id: i64 = shown.insights[0].id[2..].parse().unwrap();
    let bad = engine
        .memory_feedback(Some("alice"), FeedbackTarget::Insight(id), 2, None)
        .await;
    assert!(bad.is_err(), "a score of 2 is refused: {bad:?}");
    engine
        .memory_feedback(
            Some("alice"),
            FeedbackTarget::Insight(id),
            -1,
            Some("not it".into()),
        )
        .await
        .unwrap();
    let once = engine.memory_check(Some("alice"), FAILING[3]);
    assert!(
        once.is_empty() || once[0].confidence < shown.insights[0].confidence,
        "{once:?}"
    );
    // Wrong a second time (by the outcome that carried it): the pattern stops firing.
    let stats = engine.memory_stats(Some("alice"));
    assert_eq!(stats.active_patterns, stats.patterns);
    let evidence: i64 = shown.insights[0].evidence[0][2..].parse().unwrap();
    engine
        .memory_feedback(Some("alice"), FeedbackTarget::Outcome(evidence), -1, None)
        .await
        .unwrap();
    assert!(engine.memory_check(Some("alice"), FAILING[3]).is_empty());
    let later = owned(&engine, "alice").await;
    run(&later, SETUP).await;
    assert!(run(&later, FAILING[3]).await.insights.is_empty());
    let stats = engine.memory_stats(Some("alice"));
    assert_eq!(stats.feedback.wrong, 2, "{stats:?}");
    assert!(stats.active_patterns < stats.patterns, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_keeps_the_newest_outcomes_in_memory_and_on_disk() {
    let dir = state_dir();
    let with_dir = || {
        let mut config = config(MemoryConfig {
            max_outcomes: 5,
            ..MemoryConfig::default()
        });
        config.state.dir = Some(dir.clone());
        config
    };
    let engine = engine_with(with_dir()).await;
    let session = owned(&engine, "alice").await;
    // Pruning comes in batches: past 256 over the bound, back down to it.
    for i in 0..262 {
        run(&session, &format!("v{i} = {i}")).await;
    }
    assert_eq!(engine.memory_stats(Some("alice")).outcomes, 5);
    run(&session, "last = 'kept'").await;
    engine
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    drop(engine);
    let on_disk: i64 = rusqlite::Connection::open(dir.join("memory.db"))
        .unwrap()
        .query_row("SELECT count(*) FROM outcomes", [], |row| row.get(0))
        .unwrap();
    assert_eq!(on_disk, 6, "pruned to 5 on disk too, then one more");
    let engine = engine_with(with_dir()).await;
    assert_eq!(
        engine.memory_stats(Some("alice")).outcomes,
        5,
        "the newest 5 come back"
    );
    let found = engine
        .memory_search(Some("alice"), "last = 'kept'", 1)
        .await
        .unwrap();
    assert_eq!(found[0].code.as_deref(), Some("last = 'kept'"), "{found:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn outcomes_older_than_max_age_are_forgotten_in_memory_and_on_disk() {
    let dir = state_dir();
    let with_dir = |max_age_days: Option<u64>| {
        let mut config = config(MemoryConfig {
            max_age: max_age_days.map(|days| std::time::Duration::from_secs(days * 86_400)),
            ..MemoryConfig::default()
        });
        config.state.dir = Some(dir.clone());
        config
    };
    let engine = engine_with(with_dir(None)).await;
    fail_then_fix(&engine, "alice", FAILING[0]).await;
    fail_then_fix(&engine, "alice", FAILING[1]).await;
    engine
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    drop(engine);
    // The first session's outcomes are made ten days old; the second's stay new.
    let db = dir.join("memory.db");
    let ten_days_ms = 10 * 86_400_000_i64;
    let aged = rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE outcomes SET at_ms = at_ms - ?1 WHERE id <= 3",
            [ten_days_ms],
        )
        .unwrap();
    assert_eq!(aged, 3);

    let engine = engine_with(with_dir(Some(1))).await;
    let stats = engine.memory_stats(Some("alice"));
    assert_eq!((stats.outcomes, stats.failures), (3, 1), "{stats:?}");
    assert!(
        engine.memory_check(Some("alice"), FAILING[2]).is_empty(),
        "one recent failure is not a pattern"
    );
    engine.memory_flush().await;
    let on_disk: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM outcomes", [], |row| row.get(0))
        .unwrap();
    assert_eq!(
        on_disk, 3,
        "the aged outcomes are deleted from the store too"
    );

    // Without the bound the recent failures alone are what is left: nothing comes back.
    engine
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    drop(engine);
    let engine = engine_with(with_dir(None)).await;
    assert_eq!(engine.memory_stats(Some("alice")).outcomes, 3);
}
