//! `session.fork` and the files API, for the README, in one run: a session holding a large
//! namespace (`PYVISOR_BENCH_FORK_MB`, 400 by default, of random bytes) is forked one clone at a
//! time (p50, p99) and checkpointed then restored (the name rebound first, so the restore loads
//! it again) in the same run; then 16 clones at once, with the memory they share (the PSS of
//! each against its RSS); then a 100 MB file up and down over HTTP (streamed) against a plain
//! copy of the same file on the same disk.
//!
//! With `PYVISOR_BENCH_FORK_CONFINED=1` (as root) the workers run as the daemon's do by
//! default, each with its own uid, Landlock and seccomp, so that a fork is a clone that copies
//! its source's work directory and isolates itself; the file transfers are then left out.
//!
//! Run: `cargo bench -p pyvisor --bench fork`.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use pyvisor::rpc::Dispatcher;
use pyvisor::server::http::{HttpAccess, HttpOptions, HttpServer};
use pyvisor::{
    Engine, EngineConfig, ExecutionStatus, PoolConfig, SandboxConfig, Session, SessionLimits,
    SessionOptions, StateConfig,
};

mod common;

use common::{quantile, sorted};

const FORK_ROUNDS: usize = 30;
const CHECKPOINT_ROUNDS: usize = 5;
const FILE_BYTES: usize = 100_000_000;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summary(samples: &[Duration]) -> String {
    let sorted = sorted(samples.to_vec());
    format!(
        "p50 {:.1} ms, p99 {:.1} ms (n = {})",
        ms(quantile(&sorted, 0.5)),
        ms(quantile(&sorted, 0.99)),
        samples.len()
    )
}

async fn ok(session: &Session, code: &str) -> String {
    let result = session.run(code).await.expect("the session runs code");
    assert_eq!(result.status, ExecutionStatus::Ok, "{code}: {result:?}");
    result.result.map(|r| r.repr).unwrap_or_default()
}

/// A `kB` field of `/proc/<pid>/smaps_rollup`, in bytes.
fn rollup(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn forks(session: &Session, megabytes: u64) {
    let mut one = Vec::new();
    for _ in 0..FORK_ROUNDS {
        let began = Instant::now();
        let forked = session.fork(1, vec![]).await.expect("a fork");
        one.push(began.elapsed());
        for clone in forked.sessions {
            clone.close().await.expect("the clone closes");
        }
    }
    let mut saved = Vec::new();
    for _ in 0..CHECKPOINT_ROUNDS {
        // The checkpoint must write the namespace again, and the restore load it again.
        ok(session, "blob = bytes(bytearray(blob))\n0").await;
        let began = Instant::now();
        session.checkpoint().await.expect("a checkpoint");
        let checkpointed = began.elapsed();
        ok(session, "blob = b''\n0").await;
        let began = Instant::now();
        session.restore(None).await.expect("a restore");
        saved.push(checkpointed + began.elapsed());
    }
    let fork_p50 = ms(quantile(&sorted(one.clone()), 0.5));
    let saved_p50 = ms(quantile(&sorted(saved.clone()), 0.5));
    println!("namespace: {megabytes} MB of random bytes");
    println!("fork, one clone:           {}", summary(&one));
    println!("checkpoint + restore:      {}", summary(&saved));
    println!(
        "fork is {:.0}x faster than checkpoint + restore (p50)",
        saved_p50 / fork_p50
    );
    let began = Instant::now();
    let forked = session.fork(16, vec![]).await.expect("16 clones");
    let sixteen = began.elapsed();
    let (mut pss, mut rss) = (0, 0);
    for clone in &forked.sessions {
        let pid = clone.pid().expect("a clone's pid");
        pss += rollup(pid, "Pss:");
        rss += rollup(pid, "Rss:");
    }
    println!(
        "16 clones at once: {:.1} ms; their PSS {:.0} MB in all against an RSS of {:.0} MB",
        ms(sixteen),
        pss as f64 / 1e6,
        rss as f64 / 1e6
    );
    for clone in forked.sessions {
        clone.close().await.expect("the clone closes");
    }
}

async fn transfers(engine: &Engine, work: &std::path::Path) {
    let dispatcher = Dispatcher::new(engine.clone(), SessionLimits::default());
    let options = HttpOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        token: None,
        access: HttpAccess::default(),
        max_request_bytes: 1 << 20,
        max_connections: 8,
        metrics: None,
        ready: Arc::default(),
    };
    let http = HttpServer::start(dispatcher, options).expect("the server binds");
    let session = engine
        .create_session(SessionOptions {
            cwd: Some(work.to_owned()),
            ..SessionOptions::default()
        })
        .await
        .expect("a session");
    let data: Vec<u8> = (0..FILE_BYTES).map(|i| (i * 31 % 251) as u8).collect();
    let source = work.join("source.bin");
    std::fs::write(&source, &data).expect("write the source file");
    let began = Instant::now();
    std::fs::copy(&source, work.join("copied.bin")).expect("cp");
    let copied = began.elapsed();
    let url = format!(
        "http://{}/v1/sessions/{}/files/up.bin",
        http.local_addr(),
        session.id()
    );
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(600))
        .finish();
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = data
        .chunks(1 << 20)
        .map(|chunk| Ok(bytes::Bytes::copy_from_slice(chunk)))
        .collect();
    let began = Instant::now();
    let response = client
        .put(&url)
        .content_type("application/octet-stream")
        .send_stream(futures::stream::iter(chunks))
        .await
        .expect("the upload");
    assert_eq!(response.status(), 200);
    let up = began.elapsed();
    let began = Instant::now();
    let mut response = client.get(&url).send().await.expect("the download");
    let mut down_bytes = 0;
    while let Some(chunk) = response.next().await {
        down_bytes += chunk.expect("a chunk").len();
    }
    let down = began.elapsed();
    assert_eq!(down_bytes, FILE_BYTES);
    let rate = |d: Duration| FILE_BYTES as f64 / 1e6 / d.as_secs_f64();
    println!(
        "100 MB: cp {:.0} ms ({:.0} MB/s); HTTP up {:.0} ms ({:.0} MB/s), down {:.0} ms ({:.0} MB/s)",
        ms(copied),
        rate(copied),
        ms(up),
        rate(up),
        ms(down),
        rate(down)
    );
    http.stop(Duration::from_secs(5)).await;
}

fn main() {
    let megabytes: u64 = std::env::var("PYVISOR_BENCH_FORK_MB")
        .ok()
        .and_then(|mb| mb.parse().ok())
        .unwrap_or(400);
    let confined = std::env::var_os("PYVISOR_BENCH_FORK_CONFINED").is_some();
    actix_rt::System::new().block_on(async {
        println!(
            "load average before: {}",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        let state_dir = tempfile::tempdir().expect("a state dir");
        let work = tempfile::tempdir().expect("a work dir");
        let (python, sandbox) = if confined {
            // The workers' uids enter the state dir to reach their checkpoint directories.
            let open = std::fs::Permissions::from_mode(0o711);
            std::fs::set_permissions(state_dir.path(), open).expect("chmod the state dir");
            let sandbox = SandboxConfig {
                uid_range: Some(62_900..=62_939),
                landlock: true,
                seccomp: true,
                ..SandboxConfig::default()
            };
            // An interpreter every uid can run.
            (Some("/usr/bin/python3".to_owned()), sandbox)
        } else {
            (None, SandboxConfig::default())
        };
        let engine = Engine::start(EngineConfig {
            python: python.unwrap_or_else(|| EngineConfig::default().python),
            sandbox,
            pool: PoolConfig {
                min_idle: 1,
                ..PoolConfig::default()
            },
            limits: SessionLimits {
                memory_mb: Some(8192),
                ..SessionLimits::default()
            },
            state: StateConfig {
                dir: Some(state_dir.path().to_owned()),
                max_bytes: Some(4 << 30),
                ..StateConfig::default()
            },
            ..EngineConfig::default()
        })
        .await
        .expect("the engine starts");
        let session = engine
            .create_session(SessionOptions::default())
            .await
            .expect("a session");
        ok(
            &session,
            &format!("import os\nblob = os.urandom({megabytes} << 20)\n0"),
        )
        .await;
        forks(&session, megabytes).await;
        if !confined {
            transfers(&engine, work.path()).await;
        }
    });
}
