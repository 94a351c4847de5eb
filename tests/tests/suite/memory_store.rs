//! A memory store that is corrupted, locked by another process, read-only or on a full disk
//! never fails an execution: memory goes on from what it holds in memory, with one warning
//! that says why (in `memory.stats` and the log). The read-only and full cases mount real
//! file systems (we run as root, as CI does).

use std::path::{Path, PathBuf};
use std::process::Command;

use pyvisor::{Engine, EngineConfig, ExecutionStatus, SessionOptions};
use pyvisor_tests::{engine_with, manual_checkpoints, run, state_dir};

const SETUP: &str = "import pandas as pd\ndf = pd.DataFrame({'a': [1.0, None, 3.0]})";
const FAILING: &str = "df = df.fillna(method='ffill')";

fn config(dir: &Path) -> EngineConfig {
    let mut config = EngineConfig {
        state: manual_checkpoints(),
        ..EngineConfig::default()
    };
    config.state.dir = Some(dir.to_owned());
    config
}

/// Runs the failing code in three sessions of one owner: every execution must succeed or
/// fail as Python says, and the third failure must still get its insight from memory.
async fn executions_go_on(engine: &Engine) {
    let mut last = None;
    for _ in 0..3 {
        let session = engine
            .create_session(SessionOptions {
                owner: Some("alice".into()),
                ..SessionOptions::default()
            })
            .await
            .expect("session starts");
        assert_eq!(run(&session, SETUP).await.status, ExecutionStatus::Ok);
        let failed = run(&session, FAILING).await;
        assert_eq!(failed.status, ExecutionStatus::Error, "{failed:?}");
        last = Some(failed);
    }
    assert_eq!(
        last.unwrap().insights.len(),
        1,
        "memory still works from memory"
    );
}

/// The one warning, once the store has failed; waits for the store's thread to get there.
async fn warning(engine: &Engine) -> String {
    engine.memory_flush().await;
    let stats = engine.memory_stats(None);
    stats
        .warning
        .clone()
        .unwrap_or_else(|| panic!("no warning: {stats:?}"))
}

/// A state dir whose memory store was made by an engine, with a few outcomes in it.
async fn state_with_store() -> PathBuf {
    let dir = state_dir();
    let engine = engine_with(config(&dir)).await;
    let session = engine
        .create_session(SessionOptions::default())
        .await
        .unwrap();
    run(&session, "x = 1").await;
    engine
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    drop(engine);
    assert!(dir.join("memory.db").exists());
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupted_store_never_fails_an_execution() {
    let dir = state_dir();
    std::fs::write(dir.join("memory.db"), vec![0x5a; 64 * 1024]).unwrap();
    let engine = engine_with(config(&dir)).await;
    executions_go_on(&engine).await;
    let warning = warning(&engine).await;
    assert!(warning.contains("corrupted"), "{warning}");
    assert!(engine.memory_stats(None).store.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_locked_by_another_process_never_fails_an_execution() {
    let dir = state_with_store().await;
    let holder = rusqlite::Connection::open(dir.join("memory.db")).unwrap();
    holder
        .execute_batch("PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE;")
        .unwrap();
    let engine = engine_with(config(&dir)).await;
    executions_go_on(&engine).await;
    let warning = warning(&engine).await;
    assert!(warning.contains("locked"), "{warning}");
    drop(holder);
}

/// A mount that is undone when dropped.
struct Mounted(PathBuf);

impl Mounted {
    fn new(args: &[&str], target: &Path) -> Mounted {
        let status = Command::new("mount")
            .args(args)
            .arg(target)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount {args:?} {}", target.display());
        Mounted(target.to_owned())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_store_never_fails_an_execution() {
    let dir = state_with_store().await;
    let file = dir.join("memory.db");
    let file_arg = file.to_str().unwrap();
    let _bound = Mounted::new(&["--bind", file_arg], &file);
    let status = Command::new("mount")
        .args(["-o", "remount,ro,bind", file_arg])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(std::fs::OpenOptions::new().write(true).open(&file).is_err());
    let engine = engine_with(config(&dir)).await;
    executions_go_on(&engine).await;
    let warning = warning(&engine).await;
    assert!(warning.contains("read-only"), "{warning}");
    // What was stored before is still read.
    assert!(engine.memory_stats(None).outcomes >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_on_a_full_disk_never_fails_an_execution() {
    let dir = state_with_store().await;
    // The store moves to a small file system of its own, which is then filled up.
    let disk = tempfile::tempdir().unwrap();
    let _tmpfs = Mounted::new(&["-t", "tmpfs", "-o", "size=1m", "tmpfs"], disk.path());
    std::fs::copy(dir.join("memory.db"), disk.path().join("memory.db")).unwrap();
    std::fs::remove_file(dir.join("memory.db")).unwrap();
    std::os::unix::fs::symlink(disk.path().join("memory.db"), dir.join("memory.db")).unwrap();
    let filler = disk.path().join("filler");
    let chunk = vec![1u8; 64 * 1024];
    let mut file = std::fs::File::create(&filler).unwrap();
    while std::io::Write::write_all(&mut file, &chunk).is_ok() {}
    drop(file);
    let engine = engine_with(config(&dir)).await;
    executions_go_on(&engine).await;
    let warning = warning(&engine).await;
    assert!(warning.contains("disk full"), "{warning}");
}
