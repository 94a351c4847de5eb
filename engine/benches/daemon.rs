//! Whole-system figures of the daemon for the README, all from one run on one machine:
//! the round trip of `x = 1` and the throughput of 64 concurrent clients on distinct
//! sessions, through the embedded API, the Unix socket (with [`pyvisor::client`]) and HTTP,
//! each round trip also against the floors of one hop, measured in the same run (see
//! `floor`): a bare Rust host driving a minimal Python `exec` loop over a pipe, for the
//! embedded engine, and a bare client of a minimal Python server of one Unix socket, for the
//! daemon, which puts a second hop (daemon to worker) behind the socket.
//! The daemon is the real `pyvisor serve` binary; the embedded engine uses the same
//! settings (the defaults, automatic checkpoints on).
//!
//! Run: `cargo bench -p pyvisor --bench daemon` (`PYVISOR_BENCH_QUICK=1` for a short run).

use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyvisor::client::Client;
use pyvisor::rpc::wire::{CreateParams, ExecuteParams};
use pyvisor::{Engine, EngineConfig, StateConfig};

mod common;
mod daemon_process;
mod floor;

use common::{quantile, sorted};
use daemon_process::{connect, start_daemon};

/// Concurrent clients of the throughput figures, each on a session of its own. Each runs
/// `x = 1` back to back for the window; the rate counts the executions that ended in it.
const CLIENTS: usize = 64;

struct Figures {
    p50: Duration,
    p99: Duration,
}

fn figures(samples: Vec<Duration>) -> Figures {
    let samples = sorted(samples);
    Figures {
        p50: quantile(&samples, 0.5),
        p99: quantile(&samples, 0.99),
    }
}

/// Prints a latency row, with its p50 as a multiple of each of `against` (name, figures).
fn print_latency(name: &str, figures: &Figures, against: &[(&str, &Figures)]) {
    let ratios: Vec<String> = against
        .iter()
        .map(|(base_name, base)| {
            let times = figures.p50.as_secs_f64() / base.p50.as_secs_f64();
            format!("{times:.2}× {base_name}")
        })
        .collect();
    let ratio = if ratios.is_empty() {
        String::new()
    } else {
        format!("  ({})", ratios.join(", "))
    };
    println!(
        "{name:<40} p50 {:>8.1} µs   p99 {:>8.1} µs{ratio}",
        figures.p50.as_secs_f64() * 1e6,
        figures.p99.as_secs_f64() * 1e6
    );
}

fn print_throughput(name: &str, per_second: f64) {
    println!("{name:<40} {per_second:>10.0} executions/s ({CLIENTS} clients)");
}

fn main() {
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let rounds = if quick { 300 } else { 5_000 };
    let window = Duration::from_secs(if quick { 2 } else { 10 });
    let home = tempfile::TempDir::new().expect("create a temp dir");
    // One thread for the callers and the client's reader and writer tasks, so that a round
    // trip pays for no hop between threads on this side.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the runtime");

    let python = pyvisor_actors::worker::resolve_interpreter("python3").expect("python3 runs");
    let floor = figures(floor::round_trips(&python, rounds, None));
    print_latency("floor: bare host + exec loop, one pipe", &floor, &[]);
    let embedded = runtime.block_on(embedded_figures(home.path(), rounds, window));
    print_latency(
        "embedded Session::run(\"x = 1\")",
        &embedded.0,
        &[("the floor", &floor)],
    );
    print_throughput("embedded, 64 sessions", embedded.1);

    let http_port = free_port();
    let http = ["--http".to_owned(), format!("127.0.0.1:{http_port}")];
    let daemon = start_daemon(home.path(), &http, &[]);
    let socket = home.path().join("pyvisor.sock");
    let unix = runtime.block_on(socket_figures(&socket, rounds, window, daemon.pid()));
    let socket_floor = figures(floor::socket_round_trips(&python, home.path(), rounds));
    print_latency(
        "floor: bare client + Python socket server",
        &socket_floor,
        &[],
    );
    let against = [
        ("the socket floor", &socket_floor),
        ("embedded", &embedded.0),
    ];
    print_latency("Unix socket, Rust client", &unix.0, &against);
    print_throughput("Unix socket, 64 connections", unix.1);

    let http = http_figures(http_port, rounds, window);
    print_latency("HTTP POST /execute, keep-alive", &http.0, &against);
    print_throughput("HTTP, 64 clients", http.1);
}

fn engine_config(home: &Path) -> EngineConfig {
    EngineConfig {
        state: StateConfig {
            dir: Some(home.join("embedded-state")),
            ..StateConfig::default()
        },
        cache_dir: Some(home.join("cache")),
        ..EngineConfig::default()
    }
}

async fn embedded_figures(home: &Path, rounds: usize, window: Duration) -> (Figures, f64) {
    let engine = Engine::start(engine_config(home))
        .await
        .expect("start the engine");
    let session = engine
        .create_session(Default::default())
        .await
        .expect("create a session");
    for _ in 0..100 {
        session.run("x = 1").await.expect("warm up");
    }
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        session.run("x = 1").await.expect("run");
        samples.push(start.elapsed());
    }
    // Room under max_total (64) for the throughput sessions.
    session.close().await.expect("close");
    let mut sessions = Vec::new();
    for _ in 0..CLIENTS {
        sessions.push(
            engine
                .create_session(Default::default())
                .await
                .expect("create a session"),
        );
    }
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let workers: Vec<_> = sessions
        .into_iter()
        .map(|session| {
            let done = done.clone();
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    session.run("x = 1").await.expect("run");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker task");
    }
    let rate = done.load(Ordering::Relaxed) as f64 / window.as_secs_f64();
    (figures(samples), rate)
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// The socket figures; also prints the thread switches of the daemon (pid `daemon`) per
/// round trip.
async fn socket_figures(
    socket: &Path,
    rounds: usize,
    window: Duration,
    daemon: u32,
) -> (Figures, f64) {
    let client = connect(socket).await;
    let session = client
        .create_session(CreateParams::default())
        .await
        .expect("create a session")
        .session_id;
    let x_equals_1 = ExecuteParams::new(session, "x = 1");
    for _ in 0..100 {
        client.execute(x_equals_1.clone()).await.expect("warm up");
    }
    let mut samples = Vec::with_capacity(rounds);
    let before = floor::thread_switches(daemon);
    for _ in 0..rounds {
        let start = Instant::now();
        client.execute(x_equals_1.clone()).await.expect("execute");
        samples.push(start.elapsed());
    }
    println!(
        "{:<40} {:.2} in the daemon (worker not counted)",
        "  thread switches per socket round trip",
        (floor::thread_switches(daemon) - before) as f64 / rounds as f64
    );
    client
        .close(&x_equals_1.session_id, false)
        .await
        .expect("close");
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let client = Client::connect(socket).await.expect("connect");
        let session = client
            .create_session(CreateParams::default())
            .await
            .expect("create a session")
            .session_id;
        clients.push((client, ExecuteParams::new(session, "x = 1")));
    }
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let workers: Vec<_> = clients
        .into_iter()
        .map(|(client, params)| {
            let done = done.clone();
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    client.execute(params.clone()).await.expect("execute");
                    done.fetch_add(1, Ordering::Relaxed);
                }
                // Room under max_total for the HTTP figures.
                client
                    .close(&params.session_id, false)
                    .await
                    .expect("close");
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker task");
    }
    let rate = done.load(Ordering::Relaxed) as f64 / window.as_secs_f64();
    (figures(samples), rate)
}

/// HTTP figures through awc, which runs on an actix System of its own.
fn http_figures(port: u16, rounds: usize, window: Duration) -> (Figures, f64) {
    let base = format!("http://127.0.0.1:{port}/v1/sessions");
    actix_rt::System::new().block_on(async move {
        // A create may wait for a worker while the sessions of the socket figures close and
        // the pool refills (awc gives up after 5 s by default).
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish();
        let create = |client: awc::Client, base: String| async move {
            let mut response = client
                .post(&base)
                .send_json(&serde_json::json!({}))
                .await
                .expect("POST /v1/sessions");
            let created: serde_json::Value = response.json().await.expect("a JSON body");
            format!(
                "{base}/{}/execute",
                created["session_id"].as_str().expect("a session id")
            )
        };
        let execute = |client: awc::Client, url: String| async move {
            let mut response = client
                .post(&url)
                .send_json(&serde_json::json!({"code": "x = 1"}))
                .await
                .expect("POST execute");
            assert!(response.status().is_success(), "{}", response.status());
            response.body().await.expect("a body");
        };
        let url = create(client.clone(), base.clone()).await;
        for _ in 0..100 {
            execute(client.clone(), url.clone()).await;
        }
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            execute(client.clone(), url.clone()).await;
            samples.push(start.elapsed());
        }
        let session = url.trim_end_matches("/execute").to_owned();
        client
            .delete(&session)
            .send()
            .await
            .expect("DELETE the session");
        let mut urls = Vec::new();
        for _ in 0..CLIENTS {
            urls.push(create(client.clone(), base.clone()).await);
        }
        let done = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + window;
        let workers: Vec<_> = urls
            .into_iter()
            .map(|url| {
                let done = done.clone();
                let client = awc::Client::default();
                actix_rt::spawn(async move {
                    while Instant::now() < deadline {
                        execute(client.clone(), url.clone()).await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    let session = url.trim_end_matches("/execute");
                    client
                        .delete(session)
                        .send()
                        .await
                        .expect("DELETE the session");
                })
            })
            .collect();
        for worker in workers {
            worker.await.expect("worker task");
        }
        let rate = done.load(Ordering::Relaxed) as f64 / window.as_secs_f64();
        (figures(samples), rate)
    })
}
