//! Proactive computation, for the README: what a hit costs (embedded and over the Unix
//! socket of the real daemon), and what proactive computation costs a request it does not
//! serve (a miss), against a session without it in the same engine, in the same run.
//!
//! - hit: a DataFrame inspection hinted, computed ahead, then asked for again and again (the
//!   answer holds while nothing it read changes), beside the same code run for real;
//! - miss: `x = 1` and a pandas reduction run back to back, and the same with a pause of
//!   100 ms before each request (time for the predictor to speculate), alternating between a
//!   proactive session and one without, so that drift hits both alike.
//!
//! Both engines speculate whatever the machine's load (`yield_to_load = false`), so that the
//! bench does not wait on a busy machine for the hint it measures.
//!
//! Run: `cargo bench -p pyvisor --bench proactive` (`PYVISOR_BENCH_QUICK=1` for a short run,
//! `BENCH_LOG=pyvisor_actors=debug` to see what is planned and speculated, on stderr).

use std::path::Path;
use std::time::{Duration, Instant};

use pyvisor::rpc::wire::{CreateParams, ExecuteParams};
use pyvisor::{
    Engine, EngineConfig, ExecuteRequest, ProactiveConfig, Session, SessionOptions, StateConfig,
};

use pyvisor_actors::proactive::predict::normalise;

mod common;
mod daemon_process;

use common::{quantile, sorted};
use daemon_process::{connect, start_daemon};

const SETUP: &str = "import pandas as pd, numpy as np\n\
                     rng = np.random.default_rng(0)\n\
                     df = pd.DataFrame({'a': rng.normal(size=200_000), \
                     'b': rng.integers(0, 50, size=200_000)})";
/// The inspection computed ahead: tens of milliseconds when run for real.
const ASKED: &str = "df.groupby('b')['a'].describe()";
const REDUCTION: &str = "total = float(df['a'].sum())";

fn report(name: &str, samples: Vec<Duration>, base: Option<Duration>) -> Duration {
    let samples = sorted(samples);
    let (p50, p99) = (quantile(&samples, 0.5), quantile(&samples, 0.99));
    let ratio = base
        .map(|base| format!("  ({:.3}× without)", p50.as_secs_f64() / base.as_secs_f64()))
        .unwrap_or_default();
    println!(
        "{name:<52} p50 {:>9.1} µs   p99 {:>9.1} µs{ratio}",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
    p50
}

fn main() {
    if std::env::var_os("BENCH_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("BENCH_LOG"))
            .with_writer(std::io::stderr)
            .init();
    }
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let rounds = if quick { 100 } else { 1_000 };
    let home = tempfile::TempDir::new().expect("create a temp dir");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the runtime");
    runtime.block_on(embedded(home.path(), rounds));
    let _daemon = start_daemon(
        home.path(),
        &[],
        &[("PYVISOR_PROACTIVE__YIELD_TO_LOAD", "false")],
    );
    runtime.block_on(socket(&home.path().join("pyvisor.sock"), rounds));
}

async fn embedded(home: &Path, rounds: usize) {
    let engine = Engine::start(EngineConfig {
        state: StateConfig {
            dir: Some(home.join("embedded-state")),
            ..StateConfig::default()
        },
        cache_dir: Some(home.join("cache")),
        // A busy machine would otherwise put off the speculation the bench waits for.
        proactive: ProactiveConfig {
            yield_to_load: false,
            ..ProactiveConfig::default()
        },
        ..EngineConfig::default()
    })
    .await
    .expect("start the engine");
    let proactive = session(&engine, true).await;
    let plain = session(&engine, false).await;

    let real = timed(
        &proactive,
        ExecuteRequest::new(ASKED).no_cache(),
        rounds / 10,
    )
    .await;
    let real = report("embedded: real run of the inspection", real, None);
    computed_ahead(&proactive).await;
    let hits = timed(&proactive, ExecuteRequest::new(ASKED), rounds).await;
    let hit = report("embedded: hit", hits, None);
    println!(
        "{:<52} {:.0}× faster than the real run",
        "",
        real.as_secs_f64() / hit.as_secs_f64()
    );

    for (name, code, pause) in [
        ("x = 1, back to back", "x = 1", Duration::ZERO),
        ("x = 1, 100 ms apart", "x = 1", Duration::from_millis(100)),
        ("reduction, back to back", REDUCTION, Duration::ZERO),
        (
            "reduction, 100 ms apart",
            REDUCTION,
            Duration::from_millis(100),
        ),
    ] {
        let (with, without) = alternate(&proactive, &plain, code, pause, rounds / 4).await;
        let base = report(&format!("embedded miss, without: {name}"), without, None);
        report(
            &format!("embedded miss, proactive: {name}"),
            with,
            Some(base),
        );
    }
}

async fn session(engine: &Engine, proactive: bool) -> Session {
    let session = engine
        .create_session(SessionOptions {
            proactive: Some(proactive),
            ..SessionOptions::default()
        })
        .await
        .expect("create a session");
    session.run(SETUP).await.expect("set up");
    session
}

async fn computed_ahead(session: &Session) {
    session.hint(vec![ASKED.to_owned()]).await.expect("hint");
    let deadline = Instant::now() + Duration::from_secs(60);
    let asked = normalise(ASKED).expect("the inspection tokenizes");
    while !session.info().await.expect("info").ahead.contains(&asked) {
        if Instant::now() > deadline {
            let info = session.info().await.expect("info");
            panic!(
                "the hint was never computed: ahead {:?}, speculating {:?}, {:?}",
                info.ahead, info.speculating, info.proactive
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn timed(session: &Session, request: ExecuteRequest, rounds: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let result = session.run(request.clone()).await.expect("run");
        samples.push(start.elapsed());
        assert_eq!(result.from_cache, request.cache, "{result:?}");
    }
    samples
}

/// Runs `code` after `pause` in one session then the other, `rounds` times.
async fn alternate(
    proactive: &Session,
    plain: &Session,
    code: &str,
    pause: Duration,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (session, samples) in [(proactive, &mut with), (plain, &mut without)] {
            tokio::time::sleep(pause).await;
            let start = Instant::now();
            let result = session.run(code).await.expect("run");
            samples.push(start.elapsed());
            assert!(!result.from_cache, "{code} is not meant to be served");
        }
    }
    (with, without)
}

async fn socket(path: &Path, rounds: usize) {
    let client = connect(path).await;
    let session = client
        .create_session(CreateParams::default())
        .await
        .expect("create a session")
        .session_id;
    client
        .execute(ExecuteParams::new(&session, SETUP))
        .await
        .expect("set up");
    let real = ExecuteParams {
        cache: Some(false),
        ..ExecuteParams::new(&session, ASKED)
    };
    let mut samples = Vec::new();
    for _ in 0..rounds / 10 {
        let start = Instant::now();
        client.execute(real.clone()).await.expect("execute");
        samples.push(start.elapsed());
    }
    let real = report("Unix socket: real run of the inspection", samples, None);
    client
        .call(
            "session.hint",
            serde_json::json!({"session_id": session, "code": [ASKED]}),
        )
        .await
        .expect("hint");
    let deadline = Instant::now() + Duration::from_secs(60);
    let computed = normalise(ASKED).expect("the inspection tokenizes");
    loop {
        let info = client.info(&session).await.expect("info");
        let proactive = info.proactive.expect("a proactive session");
        if proactive.ahead.contains(&computed) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hint was never computed: ahead {:?}, speculating {:?}",
            proactive.ahead,
            proactive.speculating
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = ExecuteParams::new(&session, ASKED);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let result = client.execute(asked.clone()).await.expect("execute");
        samples.push(start.elapsed());
        assert!(
            result.from_cache,
            "a request computed ahead was run for real"
        );
    }
    let hit = report("Unix socket: hit", samples, None);
    println!(
        "{:<52} {:.0}× faster than the real run",
        "",
        real.as_secs_f64() / hit.as_secs_f64()
    );
}
