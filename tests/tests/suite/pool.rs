//! The pool of ready workers: warm acquires, waiting for room under `max_total`, FIFO
//! fairness among waiters, the exhausted error, and reaping of idle workers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyvisor::{EngineConfig, EngineError, PoolConfig, PoolError, SupervisorError};
use pyvisor_tests::{engine_with, process_gone, run, within};

fn pool_config(pool: PoolConfig) -> EngineConfig {
    EngineConfig {
        pool,
        ..EngineConfig::default()
    }
}

/// Waits until `check` holds for the engine's pool figures (the pool fills in the
/// background), failing the test after 30 s.
async fn pool_reaches(engine: &pyvisor::Engine, check: impl Fn(&pyvisor::PoolStats) -> bool) {
    within(async {
        loop {
            let stats = engine.stats().await.unwrap();
            if check(&stats.pool) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_warm_pool_hands_out_ready_workers() {
    let engine = engine_with(pool_config(PoolConfig {
        min_idle: 2,
        ..PoolConfig::default()
    }))
    .await;
    pool_reaches(&engine, |pool| pool.idle == 2).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    assert!(session.warm());
    assert_eq!(run(&session, "6 * 7").await.result.unwrap().repr, "42");
    let stats = engine.stats().await.unwrap();
    assert_eq!((stats.pool.hits, stats.pool.misses), (1, 0));
    assert_eq!(stats.pool.active, 1);
    assert_eq!(stats.sessions, 1);
    // The pool refills behind the acquire.
    pool_reaches(&engine, |pool| pool.idle == 2).await;
    assert!(engine.stats().await.unwrap().pool.spawn_ms_p50.is_some());
}

#[tokio::test]
async fn a_cold_pool_spawns_for_the_acquire() {
    let engine = engine_with(pool_config(PoolConfig {
        min_idle: 0,
        ..PoolConfig::default()
    }))
    .await;
    let session = engine.create_session(Default::default()).await.unwrap();
    assert!(!session.warm());
    let stats = engine.stats().await.unwrap();
    assert_eq!((stats.pool.hits, stats.pool.misses), (0, 1));
    assert_eq!(stats.pool.idle, 0, "min_idle 0 keeps nothing ready");
}

#[tokio::test]
async fn an_acquire_beyond_max_total_waits_for_a_release() {
    let engine = engine_with(pool_config(PoolConfig {
        min_idle: 0,
        max_total: 1,
        acquire_timeout: Duration::from_secs(30),
        ..PoolConfig::default()
    }))
    .await;
    let first = engine.create_session(Default::default()).await.unwrap();
    let waiting = tokio::spawn({
        let engine = engine.clone();
        async move { engine.create_session(Default::default()).await }
    });
    // The acquire reaches the pool and waits there: no room until the first session ends.
    pool_reaches(&engine, |pool| pool.waiting == 1).await;
    assert!(!waiting.is_finished());
    first.close().await.unwrap();
    let second = within(waiting).await.unwrap().unwrap();
    assert_eq!(run(&second, "1 + 1").await.result.unwrap().repr, "2");
}

#[tokio::test]
async fn an_acquire_that_finds_no_room_in_time_fails_with_pool_exhausted() {
    let engine = engine_with(pool_config(PoolConfig {
        min_idle: 0,
        max_total: 1,
        acquire_timeout: Duration::from_millis(200),
        ..PoolConfig::default()
    }))
    .await;
    let _held = engine.create_session(Default::default()).await.unwrap();
    let refused = within(engine.create_session(Default::default())).await;
    match refused {
        Err(EngineError::Supervisor(SupervisorError::Pool(PoolError::Exhausted {
            max_total,
            ..
        }))) => assert_eq!(max_total, 1),
        other => panic!("expected pool exhausted, got {other:?}"),
    }
    // The held session is unaffected.
    assert_eq!(run(&_held, "'still here'").await.status.as_str(), "ok");
}

#[tokio::test]
async fn waiters_get_room_in_the_order_they_asked() {
    let engine = engine_with(pool_config(PoolConfig {
        min_idle: 0,
        max_total: 1,
        acquire_timeout: Duration::from_secs(60),
        ..PoolConfig::default()
    }))
    .await;
    let first = engine.create_session(Default::default()).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (place, label) in ["a", "b", "c"].into_iter().enumerate() {
        let asking = engine.clone();
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let session = asking.create_session(Default::default()).await.unwrap();
            order.lock().unwrap().push(label);
            // Hold the room a moment, then pass it on.
            session.close().await.unwrap();
        }));
        // Each acquire is waiting in the pool before the next one is made.
        pool_reaches(&engine, |pool| pool.waiting == place + 1).await;
    }
    first.close().await.unwrap();
    for waiter in waiters {
        within(waiter).await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["a", "b", "c"]);
}

#[tokio::test]
async fn idle_workers_past_their_ttl_are_reaped_down_to_min_idle() {
    let engine = engine_with(pool_config(PoolConfig {
        min_idle: 3,
        idle_ttl: Duration::from_millis(300),
        ..PoolConfig::default()
    }))
    .await;
    pool_reaches(&engine, |pool| pool.idle == 3).await;
    engine
        .resize_pool(PoolConfig {
            min_idle: 1,
            idle_ttl: Duration::from_millis(300),
            ..PoolConfig::default()
        })
        .await
        .unwrap();
    pool_reaches(&engine, |pool| pool.idle == 1).await;
    // Reaping stops at min_idle: a resize reaps at once, and under a ttl of zero the last
    // worker is past it in that pass, yet kept.
    engine
        .resize_pool(PoolConfig {
            min_idle: 1,
            idle_ttl: Duration::ZERO,
            ..PoolConfig::default()
        })
        .await
        .unwrap();
    let pool = engine.stats().await.unwrap().pool;
    assert_eq!((pool.idle, pool.warming), (1, 0), "{pool:?}");
}

#[tokio::test]
async fn a_closed_sessions_worker_is_never_handed_out_again() {
    let engine = engine_with(pool_config(PoolConfig {
        min_idle: 1,
        ..PoolConfig::default()
    }))
    .await;
    let first = engine.create_session(Default::default()).await.unwrap();
    run(&first, "secret = 'mine'").await;
    let first_pid = first.pid().unwrap();
    first.close().await.unwrap();
    assert!(process_gone(first_pid).await);
    let second = engine.create_session(Default::default()).await.unwrap();
    assert_ne!(second.pid(), Some(first_pid));
    let peek = run(&second, "'secret' in globals()").await;
    assert_eq!(peek.result.unwrap().repr, "False");
}

#[tokio::test]
async fn sessions_with_their_own_limits_get_a_worker_of_their_own() {
    let engine = engine_with(pool_config(PoolConfig {
        min_idle: 1,
        ..PoolConfig::default()
    }))
    .await;
    pool_reaches(&engine, |pool| pool.idle == 1).await;
    let session = engine
        .create_session(pyvisor::SessionOptions {
            limits: Some(pyvisor::SessionLimits {
                open_files: Some(64),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        !session.warm(),
        "the pool's workers have the default limits"
    );
    let limit = run(
        &session,
        "import resource\nresource.getrlimit(resource.RLIMIT_NOFILE)[0]",
    )
    .await;
    assert_eq!(limit.result.unwrap().repr, "64");
    assert_eq!(engine.stats().await.unwrap().pool.idle, 1);
}
