//! A host process for the SIGKILL test: starts an engine whose pool keeps ready workers,
//! runs code that leaves a grandchild behind, prints the pids to stdout, and waits to be
//! killed.
//!
//! Usage: `engine_host CACHE_DIR` (the worker package is installed there, so the test can
//! find every process of this engine by its command line).

use std::time::Duration;

use pyvisor::{EngineConfig, PoolConfig};

#[tokio::main]
async fn main() {
    let cache_dir = std::env::args_os()
        .nth(1)
        .expect("usage: engine_host CACHE_DIR");
    let engine = pyvisor::Engine::start(EngineConfig {
        cache_dir: Some(cache_dir.into()),
        pool: PoolConfig {
            min_idle: 2,
            ..PoolConfig::default()
        },
        ..EngineConfig::default()
    })
    .await
    .expect("engine starts");
    let session = engine
        .create_session(Default::default())
        .await
        .expect("session");
    let started = session
        .run("import subprocess\nchild = subprocess.Popen(['sleep', '60'])\nchild.pid")
        .await
        .expect("code runs");
    let grandchild = started.result.expect("a pid").repr;
    while engine.stats().await.expect("stats").pool.idle < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("{} {grandchild}", session.pid().expect("worker pid"));
    // Busy in user code when the kill comes.
    session
        .run("import time\ntime.sleep(600)")
        .await
        .expect("code runs");
}
