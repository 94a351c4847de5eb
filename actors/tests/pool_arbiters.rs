//! Where the pool starts workers: a replacement for a session's dead worker is spawned on the
//! arbiter the session asks for (its own), never handed an idle worker served on another
//! thread, so that a session and its worker's pipes share one thread.

use std::thread::ThreadId;

use actix::prelude::*;
use pyvisor_actors::pool::{Acquire, GetPoolStats, PoolActor, PoolConfig, Slot};
use tokio::sync::oneshot;

#[allow(
    dead_code,
    reason = "the shared helpers serve several test files; this one needs a few"
)]
mod common;

use common::{spec, PATIENCE};

/// The thread that runs `arbiter`.
async fn thread_of(arbiter: &ArbiterHandle) -> ThreadId {
    let (tell, told) = oneshot::channel();
    assert!(arbiter.spawn_fn(move || {
        let _ = tell.send(std::thread::current().id());
    }));
    told.await.expect("the arbiter runs")
}

#[actix::test]
async fn a_replacement_is_spawned_on_the_arbiter_it_asks_for() {
    let arbiters: Vec<Arbiter> = (0..3).map(|_| Arbiter::new()).collect();
    let config = PoolConfig {
        min_idle: 1,
        ..PoolConfig::default()
    };
    let pool = PoolActor::new(
        config,
        spec(&[], None),
        arbiters.iter().map(Arbiter::handle).collect(),
    )
    .start();
    // An idle worker is ready, on whichever arbiter: the replacements must not take it.
    tokio::time::timeout(PATIENCE, async {
        while pool.send(GetPoolStats).await.unwrap().idle < 1 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the pool fills");
    let session = arbiters[2].handle();
    let session_thread = thread_of(&session).await;
    // More acquires than arbiters: spawning in turn would miss the session's at least once.
    for _ in 0..arbiters.len() + 1 {
        let lease = tokio::time::timeout(
            PATIENCE,
            pool.send(Acquire {
                spec: None,
                slot: Slot::Held,
                arbiter: Some(session.clone()),
            }),
        )
        .await
        .expect("a replacement comes")
        .unwrap()
        .expect("a worker starts");
        assert!(!lease.warm, "an idle worker was handed out");
        assert_eq!(thread_of(&lease.arbiter).await, session_thread);
    }
    assert_eq!(pool.send(GetPoolStats).await.unwrap().idle, 1);
    for arbiter in arbiters {
        arbiter.stop();
    }
}
