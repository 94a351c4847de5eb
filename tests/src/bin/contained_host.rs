//! A host process for the containment tests: starts an engine, runs code that leaves a
//! `setsid` grandchild outside the worker's process group, prints the worker's and the
//! grandchild's pids to stdout, and waits to be killed.
//!
//! Usage: `contained_host` (the engine gets a fresh state directory of its own).

use pyvisor::EngineConfig;

#[tokio::main]
async fn main() {
    let engine = pyvisor_tests::engine_with(EngineConfig::default()).await;
    let session = engine
        .create_session(Default::default())
        .await
        .expect("session");
    let started = session
        .run(pyvisor_tests::SETSID_GRANDCHILD)
        .await
        .expect("code runs");
    let grandchild = started.result.expect("a pid").repr;
    println!("{} {grandchild}", session.pid().expect("worker pid"));
    // Busy in user code when the kill comes.
    session
        .run("import time\ntime.sleep(600)")
        .await
        .expect("code runs");
}
