//! How long a worker takes from request to `hello`: a plain spawn of a fresh interpreter,
//! the same with pandas preloaded, and a fork from a zygote that has pandas imported.
//!
//! Run: `cargo bench -p pyvisor-actors --bench spawn` (set `PYVISOR_BENCH_QUICK=1` for a short
//! run). The pandas rows are skipped, with a note, when pandas is not installed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyvisor_actors::worker::{
    install_worker_package, resolve_interpreter, Janitor, Worker, WorkerEvent, WorkerOrigin,
    WorkerSpec, Zygote,
};
use pyvisor_actors::ProcessLimits;

/// p50 and p99 of `samples`, in milliseconds.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    (at(0.50), at(0.99))
}

fn report(name: &str, samples: Vec<Duration>) -> f64 {
    let count = samples.len();
    let (p50, p99) = percentiles(samples);
    println!("{name:<44} p50 {p50:>8.2} ms   p99 {p99:>8.2} ms   ({count} runs)");
    p50
}

/// Starts `runs` workers one after another; each is timed to its hello, then ended and
/// awaited before the next starts, `pause` later.
async fn measure(
    spec: &WorkerSpec,
    runs: usize,
    origin: WorkerOrigin,
    pause: Duration,
) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        tokio::time::sleep(pause).await;
        let started = Instant::now();
        let mut worker = Worker::start(spec).await.expect("the worker starts");
        samples.push(started.elapsed());
        assert_eq!(
            worker.origin, origin,
            "every measured worker is made the same way"
        );
        worker.kill();
        while let Some(event) = worker.events.recv().await {
            if let WorkerEvent::Exited(_) = event {
                break;
            }
        }
    }
    samples
}

struct Bench {
    python: PathBuf,
    script: PathBuf,
    janitor: Arc<Janitor>,
}

impl Bench {
    fn spec(&self, preload: &[&str], zygote: Option<Arc<Zygote>>) -> WorkerSpec {
        WorkerSpec {
            python: self.python.clone(),
            script: self.script.clone(),
            cwd: None,
            env: Vec::new(),
            handshake_timeout: Duration::from_secs(60),
            max_frame: pyvisor_protocol::DEFAULT_MAX_FRAME_BYTES,
            limits: ProcessLimits::default(),
            cgroups: None,
            janitor: Some(self.janitor.clone()),
            preload: preload.iter().map(|m| m.to_string()).collect(),
            zygote,
            sandbox: None,
            network: true,
        }
    }

    fn zygote(&self, preload: &[&str]) -> Arc<Zygote> {
        let preload: Vec<String> = preload.iter().map(|m| m.to_string()).collect();
        let zygote = Zygote::start(
            &self.python,
            &self.script,
            &preload,
            Some(self.janitor.clone()),
            Duration::from_secs(60),
        );
        Arc::new(zygote.expect("the zygote starts"))
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("spawn: bench");
        return;
    }
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let (fresh_runs, fork_runs) = if quick { (5, 30) } else { (30, 300) };
    let python = resolve_interpreter("python3").expect("python3 runs");
    let cache = std::env::temp_dir().join(format!("pyvisor-bench-spawn-{}", std::process::id()));
    let package = install_worker_package(&cache).expect("the worker package installs");
    // Compiled as the engine runs it, so no spawn pays for compiling the package.
    let bench = Bench {
        script: package,
        janitor: Arc::new(Janitor::start(&python).expect("the janitor starts")),
        python,
    };
    let pandas = std::process::Command::new(&bench.python)
        .args(["-I", "-c", "import pandas"])
        .status()
        .is_ok_and(|status| status.success());
    // Zygotes are started here, outside the runtime: the start blocks until they are ready.
    let zygotes = (bench.zygote(&[]), pandas.then(|| bench.zygote(&["pandas"])));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let back_to_back = Duration::ZERO;
        // Long enough for the zygote to have forked its next spare child.
        let idle = Duration::from_millis(20);
        let plain = bench.spec(&[], None);
        report(
            "plain spawn to hello (no preload)",
            measure(&plain, fresh_runs, WorkerOrigin::Spawned, back_to_back).await,
        );
        let forked = bench.spec(&[], Some(zygotes.0.clone()));
        report(
            "zygote fork to hello (no preload)",
            measure(&forked, fork_runs, WorkerOrigin::Forked, back_to_back).await,
        );
        let Some(pandas_zygote) = zygotes.1.clone() else {
            println!("pandas is not installed: the pandas rows are skipped");
            return;
        };
        let fresh = report(
            "plain spawn to hello (--preload pandas)",
            measure(
                &bench.spec(&["pandas"], None),
                fresh_runs,
                WorkerOrigin::Spawned,
                back_to_back,
            )
            .await,
        );
        let pandas = bench.spec(&["pandas"], Some(pandas_zygote));
        let forked = report(
            "zygote fork to hello (pandas, back to back)",
            measure(&pandas, fork_runs, WorkerOrigin::Forked, back_to_back).await,
        );
        report(
            "zygote fork to hello (pandas, 20 ms apart)",
            measure(&pandas, fork_runs, WorkerOrigin::Forked, idle).await,
        );
        println!(
            "{:<44} {:.0}x (p50 plain spawn / p50 zygote fork, back to back)",
            "pandas worker speed-up",
            fresh / forked
        );
    });
    drop(zygotes);
    let _ = std::fs::remove_dir_all(cache);
}
