//! State at data scale: incremental checkpoints that share blobs, and a session that never
//! loses its state without saying so (over a limit, unpicklable names, checkpoints off, a
//! crash with nothing to come back from).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyvisor::{Engine, EngineConfig, ExecutionResult, ExecutionStatus, Session, StateConfig};
use pyvisor_tests::{engine_with, manual_checkpoints, run, within};
use tempfile::TempDir;

async fn engine_with_state(state: StateConfig) -> Engine {
    engine_with(EngineConfig {
        state,
        ..EngineConfig::default()
    })
    .await
}

/// A session of a new engine with `state`, kept in a temporary directory that is removed
/// with the returned guard (the blobs of these tests are megabytes).
async fn session_with(state: StateConfig) -> (TempDir, Engine, Session) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_state(StateConfig {
        dir: Some(dir.path().to_owned()),
        ..state
    })
    .await;
    let session = engine.create_session(Default::default()).await.unwrap();
    (dir, engine, session)
}

async fn ok(session: &Session, code: &str) -> ExecutionResult {
    let result = run(session, code).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{code}: {result:?}");
    result
}

async fn repr(session: &Session, code: &str) -> String {
    ok(session, code)
        .await
        .result
        .map(|r| r.repr)
        .unwrap_or_default()
}

/// Kills the session's worker between executions and waits until the session has seen it.
async fn kill_worker(session: &Session) {
    let info = session.info().await.unwrap();
    kill(Pid::from_raw(info.pid.unwrap() as i32), Signal::SIGKILL).unwrap();
    within(async {
        while session.info().await.unwrap().restarts == info.restarts {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The blob files of every session in the state directory `dir`.
fn blob_files(dir: &Path) -> Vec<PathBuf> {
    let sessions = dir.join("sessions");
    let mut files = Vec::new();
    for session in std::fs::read_dir(sessions).unwrap().flatten() {
        if let Ok(blobs) = std::fs::read_dir(session.path().join("blobs")) {
            files.extend(blobs.flatten().map(|entry| entry.path()));
        }
    }
    files.sort();
    files
}

#[tokio::test]
async fn a_state_over_the_checkpoint_limit_says_so_and_a_crash_then_reports_a_fresh_namespace() {
    let (_dir, _engine, session) = session_with(StateConfig {
        max_bytes: Some(10 * 1024 * 1024),
        ..manual_checkpoints()
    })
    .await;
    ok(&session, "big = bytearray(20 * 1024 * 1024)").await;
    let refused = within(session.checkpoint()).await.unwrap_err();
    assert!(refused.to_string().contains("over the limit"), "{refused}");

    let next = ok(&session, "len(big)").await;
    let warning = next.warnings.join("\n");
    assert!(warning.contains("state not saved"), "{next:?}");
    assert!(warning.contains("over the limit of 10.5 MB"), "{warning}");
    assert!(
        warning.contains("a crash now loses 2 execution(s)"),
        "{warning}"
    );
    let durability = session.info().await.unwrap().durability;
    assert!(!durability.saved);
    assert_eq!(durability.unsaved_executions, 2);
    assert!(durability.failure.is_some());

    kill_worker(&session).await;
    // The code after the crash is not run in an empty namespace as if nothing happened.
    let after = run(&session, "big").await;
    assert_eq!(after.status, ExecutionStatus::Crashed, "{after:?}");
    let recovered = after.recovered.expect("the result says what came back");
    assert_eq!(recovered.checkpoint_id, None);
    assert!(recovered.fresh_namespace);
    assert_eq!(recovered.lost_executions, 2);
    let error = after.error.unwrap();
    assert_eq!(error.type_name, "StateLost");
    assert!(error.message.contains("fresh namespace"), "{error:?}");
    // Once told, the caller goes on in the fresh namespace.
    let fresh = run(&session, "'big' in globals()").await;
    assert!(
        fresh.recovered.is_none() && fresh.warnings.is_empty(),
        "{fresh:?}"
    );
    assert_eq!(fresh.result.unwrap().repr, "False");
}

#[tokio::test]
async fn names_a_checkpoint_cannot_save_are_named_on_every_result() {
    let (_dir, _engine, session) = session_with(manual_checkpoints()).await;
    ok(
        &session,
        "import socket\nconn = socket.socket()\nkept = [1, 2]",
    )
    .await;
    within(session.checkpoint()).await.unwrap();
    for _ in 0..2 {
        let result = ok(&session, "kept").await;
        assert_eq!(result.warnings.len(), 1, "{result:?}");
        assert!(
            result.warnings[0].starts_with("state not saved for conn (TypeError"),
            "{:?}",
            result.warnings
        );
    }
    let durability = session.info().await.unwrap().durability;
    assert_eq!(durability.lost_names[0].name, "conn");
    assert!(!durability.saved);
    ok(&session, "conn.close()\ndel conn").await;
    within(session.checkpoint()).await.unwrap();
    assert!(ok(&session, "kept").await.warnings.is_empty());
    assert!(session.info().await.unwrap().durability.saved);
}

#[tokio::test]
async fn with_checkpoints_off_every_result_says_the_state_is_not_saved() {
    let engine = engine_with_state(StateConfig {
        enabled: false,
        ..StateConfig::default()
    })
    .await;
    let session = engine.create_session(Default::default()).await.unwrap();
    let first = ok(&session, "x = 1").await;
    assert!(
        first.warnings[0].contains("checkpoints are off"),
        "{first:?}"
    );
    assert!(ok(&session, "x").await.warnings[0].contains("checkpoints are off"));
    let crashed = run(&session, "import os\nos._exit(1)").await;
    assert_eq!(crashed.status, ExecutionStatus::Crashed);
    let recovered = crashed.recovered.unwrap();
    assert!(recovered.fresh_namespace && recovered.checkpoint_id.is_none());
}

#[tokio::test]
async fn an_unchanged_frame_is_not_written_again_and_checkpoints_share_its_blob() {
    let (dir, _engine, session) = session_with(manual_checkpoints()).await;
    ok(
        &session,
        "import numpy as np, pandas as pd\n\
         df = pd.DataFrame(np.random.default_rng(1).random((100_000, 4)), columns=list('abcd'))\n\
         k = 0",
    )
    .await;
    let full = within(session.checkpoint()).await.unwrap();
    assert!(full.bytes > 3_000_000, "{full:?}");
    ok(&session, "k = 1").await;
    let small = within(session.checkpoint()).await.unwrap();
    assert!(small.bytes < 100_000, "only k is written again: {small:?}");
    assert!(small.state_bytes > 3_000_000, "{small:?}");
    // Adding a column writes the frame again, once.
    ok(&session, "df['e'] = df['a'] * 2").await;
    let grown = within(session.checkpoint()).await.unwrap();
    assert!(grown.bytes > 3_000_000, "{grown:?}");

    let on_disk: u64 = blob_files(dir.path())
        .iter()
        .map(|path| std::fs::metadata(path).unwrap().len())
        .sum();
    assert!(
        on_disk < full.state_bytes + grown.state_bytes + 1_000_000,
        "three checkpoints hold two frames on disk: {on_disk}"
    );
    kill_worker(&session).await;
    let back = ok(
        &session,
        "(k, list(df.columns), round(float(df['e'].sum() / df['a'].sum()), 6))",
    )
    .await;
    assert_eq!(
        back.result.unwrap().repr,
        "(1, ['a', 'b', 'c', 'd', 'e'], 2.0)"
    );
    assert!(back.recovered.unwrap().checkpoint_id.is_some());
    // A mapped restore gives arrays that the code can write to.
    assert_eq!(
        repr(&session, "df.loc[0, 'a'] = 5.0\nfloat(df.loc[0, 'a'])").await,
        "5.0"
    );
}

#[tokio::test]
async fn a_mutation_through_an_alias_is_caught_by_the_next_checkpoint() {
    let (_dir, _engine, session) = session_with(manual_checkpoints()).await;
    ok(
        &session,
        "import numpy as np, pandas as pd\n\
         df = pd.DataFrame(np.ones((50_000, 3)), columns=['a', 'b', 'c'])\n\
         a = df",
    )
    .await;
    within(session.checkpoint()).await.unwrap();
    ok(&session, "a.drop(columns=['c'], inplace=True)").await;
    within(session.checkpoint()).await.unwrap();
    // Through globals(), which names neither: the frame's fingerprint changes.
    ok(
        &session,
        "globals()['df'].drop(columns=['b'], inplace=True)",
    )
    .await;
    within(session.checkpoint()).await.unwrap();
    kill_worker(&session).await;
    assert_eq!(
        repr(&session, "list(df.columns), a is df").await,
        "(['a'], True)"
    );
}

#[tokio::test]
async fn names_that_share_objects_share_them_after_a_restore() {
    let (_dir, _engine, session) = session_with(manual_checkpoints()).await;
    ok(
        &session,
        "items = [1, 2]\nsame = items\nholder = {'items': items}\n\
         class Box:\n    pass\nbox = Box()\nbox.content = holder",
    )
    .await;
    within(session.checkpoint()).await.unwrap();
    kill_worker(&session).await;
    let shared = repr(
        &session,
        "items.append(3)\n(same, holder['items'] is items, box.content is holder, isinstance(box, Box))",
    )
    .await;
    assert_eq!(shared, "([1, 2, 3], True, True, True)");
}

#[tokio::test]
async fn restoring_an_older_checkpoint_reloads_only_the_names_that_changed() {
    let (_dir, _engine, session) = session_with(manual_checkpoints()).await;
    ok(
        &session,
        "import numpy as np, pandas as pd\n\
         df = pd.DataFrame(np.zeros((50_000, 3)), columns=['a', 'b', 'c'])\n\
         other = np.arange(200_000)\n\
         other_address = other.__array_interface__['data'][0]",
    )
    .await;
    let before = within(session.checkpoint()).await.unwrap();
    ok(&session, "df = df.drop(columns=['b'])").await;
    within(session.checkpoint()).await.unwrap();
    let back = within(session.restore(Some(&before.checkpoint_id)))
        .await
        .unwrap();
    assert!(back.restored.contains(&"df".to_owned()), "{back:?}");
    assert!(back.kept.contains(&"other".to_owned()), "{back:?}");
    assert_eq!(
        repr(
            &session,
            "list(df.columns), other.__array_interface__['data'][0] == other_address"
        )
        .await,
        "(['a', 'b', 'c'], True)"
    );
}

#[tokio::test]
async fn blobs_of_pruned_checkpoints_are_removed_and_shared_ones_kept() {
    let (dir, _engine, session) = session_with(StateConfig {
        retention: 2,
        ..manual_checkpoints()
    })
    .await;
    ok(
        &session,
        "import os\nbig = bytearray(os.urandom(500_000))\nx = 0",
    )
    .await;
    within(session.checkpoint()).await.unwrap();
    let big_blob = |files: &[PathBuf]| {
        files
            .iter()
            .find(|path| std::fs::metadata(path).unwrap().len() > 400_000)
            .cloned()
    };
    let first = big_blob(&blob_files(dir.path())).expect("a blob holds big");
    for x in 1..=3 {
        ok(&session, &format!("x = {x}")).await;
        within(session.checkpoint()).await.unwrap();
    }
    let files = blob_files(dir.path());
    assert_eq!(
        big_blob(&files),
        Some(first),
        "big's blob is shared, never rewritten"
    );
    // Two checkpoints retained: big's blob and the two latest blobs of x.
    assert_eq!(files.len(), 3, "{files:?}");
    assert_eq!(session.checkpoints().await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_checkpoint_over_the_disk_cap_fails_clearly_and_the_result_warns() {
    let (_dir, _engine, session) = session_with(StateConfig {
        session_disk_bytes: 1024 * 1024,
        ..manual_checkpoints()
    })
    .await;
    ok(&session, "import os\nsmall = os.urandom(1000)").await;
    let kept = within(session.checkpoint()).await.unwrap();
    ok(&session, "big = bytearray(os.urandom(2 * 1024 * 1024))").await;
    let refused = within(session.checkpoint()).await.unwrap_err();
    assert!(refused.to_string().contains("over the cap"), "{refused}");
    let warned = ok(&session, "1").await;
    assert!(
        warned.warnings[0].contains("over its cap of 1.0 MB"),
        "{warned:?}"
    );
    // The earlier checkpoint is still there to come back from.
    kill_worker(&session).await;
    let back = run(&session, "len(small), 'big' in globals()").await;
    assert_eq!(back.result.unwrap().repr, "(1000, False)");
    assert_eq!(
        back.recovered.unwrap().checkpoint_id,
        Some(kept.checkpoint_id)
    );
}

#[tokio::test]
async fn a_table_that_compresses_is_stored_compressed_and_comes_back_after_a_crash() {
    let (dir, _engine, session) = session_with(manual_checkpoints()).await;
    ok(
        &session,
        "import numpy as np, pandas as pd\n\
         table = pd.DataFrame({'day': np.arange(400_000) % 7, 'store': np.arange(400_000) % 50,\n\
         \x20                  'label': pd.Categorical(['a', 'b', 'c', 'd'] * 100_000)})",
    )
    .await;
    let saved = within(session.checkpoint()).await.unwrap();
    // Compression runs after the checkpoint is durable, on a thread of the store.
    within(async {
        // Done once the raw blob is gone: the compressed one is renamed in first.
        while !blob_files(dir.path())
            .iter()
            .all(|p| p.extension().is_some_and(|e| e == "zst"))
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let on_disk: u64 = blob_files(dir.path())
        .iter()
        .map(|path| std::fs::metadata(path).unwrap().len())
        .sum();
    assert!(
        on_disk * 4 < saved.state_bytes,
        "{on_disk} of {}",
        saved.state_bytes
    );
    kill_worker(&session).await;
    let back = ok(
        &session,
        "len(table), int(table['store'].sum()), table['label'].dtype.name",
    )
    .await;
    assert_eq!(back.result.unwrap().repr, "(400000, 9800000, 'category')");
    // What was decompressed for the restore does not stay behind.
    within(async {
        while std::fs::read_dir(dir.path().join("sessions"))
            .unwrap()
            .flatten()
            .flat_map(|s| std::fs::read_dir(s.path()).unwrap().flatten())
            .any(|e| e.file_name().to_string_lossy().starts_with(".restore-"))
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn traceback_cells_are_numbered_by_the_execution_count_after_a_crash() {
    let (_dir, _engine, session) = session_with(manual_checkpoints()).await;
    ok(&session, "def f():\n    return 1 / 0").await;
    ok(&session, "x = 1").await;
    within(session.checkpoint()).await.unwrap();
    ok(&session, "y = 2").await;
    let crashed = run(&session, "import os\nos._exit(1)").await;
    assert_eq!(crashed.status, ExecutionStatus::Crashed, "{crashed:?}");
    assert_eq!(crashed.execution_count, 4);
    // The new worker restored the checkpoint; its cells go on from the session's count.
    let failed = run(&session, "x + 1\nf()").await;
    assert_eq!(failed.status, ExecutionStatus::Error, "{failed:?}");
    assert_eq!(failed.execution_count, 5);
    let traceback = failed.error.unwrap().traceback.concat();
    assert!(
        traceback.contains("File \"<cell-5>\", line 2"),
        "{traceback}"
    );
    assert!(!traceback.contains("<cell-1>\", line 2"), "{traceback}");
    // And after an explicit restore too.
    within(session.restore(None)).await.unwrap();
    let again = run(&session, "f()").await;
    assert_eq!(again.execution_count, 6);
    let traceback = again.error.unwrap().traceback.concat();
    assert!(
        traceback.contains("File \"<cell-6>\", line 1"),
        "{traceback}"
    );
}

/// Every file or directory under `dir` whose name mentions `needle`.
fn mentioning(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().contains(needle) {
            found.push(path.clone());
        }
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            found.extend(mentioning(&path, needle));
        }
    }
    found
}

#[tokio::test]
async fn a_session_closed_while_a_checkpoint_is_written_leaves_nothing_on_disk() {
    let (dir, engine, _) = session_with(StateConfig {
        auto: pyvisor::AutoCheckpoint {
            after_changes: 1,
            min_interval: Duration::ZERO,
            ..Default::default()
        },
        ..StateConfig::default()
    })
    .await;
    let mut closed = Vec::new();
    for round in 0..4 {
        let session = engine.create_session(Default::default()).await.unwrap();
        // Tens of megabytes: the automatic checkpoint is still being written at the close.
        ok(
            &session,
            &format!("blob = bytes(range(256)) * {}", 100_000 + round),
        )
        .await;
        if round % 2 == 1 {
            // An explicit checkpoint in flight as well.
            let racing = engine.session(session.id(), None).await.unwrap();
            drop(tokio::spawn(async move { racing.checkpoint().await }));
        }
        closed.push(session.id().to_owned());
        within(session.close()).await.unwrap();
    }
    // The removal runs after the close returns, and after any store in flight: poll until
    // nothing names the sessions, neither their checkpoints nor scratch files.
    within(async {
        while closed
            .iter()
            .any(|id| !mentioning(dir.path(), id).is_empty())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The engine still checkpoints its other sessions, where the search above would see them.
    let session = engine.create_session(Default::default()).await.unwrap();
    ok(&session, "kept = 1").await;
    within(session.checkpoint()).await.unwrap();
    assert!(!mentioning(dir.path(), session.id()).is_empty());
}
