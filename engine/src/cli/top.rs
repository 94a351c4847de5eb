//! `pyvisor top`: a live view of the daemon, redrawn every second with plain ANSI escapes:
//! its totals, the pool, the proactive cache's hit rate, and one row per session (owner,
//! state, RSS, CPU, executions per second) from `engine.stats` and `session.list`. `q` or
//! Ctrl-C quits; `--once` prints one frame (rates measured over one interval) and exits.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use clap::Args;
use nix::sys::termios::{self, LocalFlags, SetArg, Termios};
use pyvisor::client::{Client, ClientError};
use pyvisor::rpc::wire::{SessionInfo, Stats};
use tokio::sync::mpsc;

use super::table::{bytes, or_dash, render};
use super::target::{refused, Target};

/// How often the view is redrawn, and the interval `--once` measures rates over.
const REFRESH: Duration = Duration::from_secs(1);

/// Clear the screen and put the cursor top left.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Arguments of `pyvisor top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one frame and exit (no terminal needed); with `--format json`, the
    /// `engine.stats` and `session.list` answers as `{stats, sessions}`.
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    target: Target,
}

/// What the daemon said at one moment.
struct Sample {
    at: Instant,
    stats: Stats,
    sessions: Vec<SessionInfo>,
}

impl Sample {
    async fn take(client: &Client) -> Result<Sample, ClientError> {
        let (stats, sessions) = tokio::try_join!(client.stats(), client.list(None))?;
        Ok(Sample {
            at: Instant::now(),
            stats,
            sessions,
        })
    }
}

pub async fn run(args: TopArgs) -> u8 {
    let client = match args.target.connect().await {
        Ok(client) => client,
        Err(status) => return status,
    };
    let first = match Sample::take(&client).await {
        Ok(sample) => sample,
        Err(err) => return refused(err),
    };
    if args.once {
        tokio::time::sleep(REFRESH).await;
        return match Sample::take(&client).await {
            Ok(now) => {
                let json = serde_json::json!({"stats": now.stats, "sessions": now.sessions});
                args.target.print(&json, |_| frame(&now, Some(&first)))
            }
            Err(err) => refused(err),
        };
    }
    live(&client, first).await
}

/// Redraws until `q`, Ctrl-C, or the daemon goes away.
async fn live(client: &Client, first: Sample) -> u8 {
    let _raw = RawKeys::enable();
    let mut keys = keys();
    let mut previous: Option<Sample> = None;
    let mut now = first;
    let mut ticks = tokio::time::interval(REFRESH);
    ticks.tick().await;
    let status = loop {
        let shown = frame(&now, previous.as_ref());
        if write_screen(&format!("{CLEAR}{shown}\n(q or Ctrl-C quits)")).is_err() {
            break 0;
        }
        tokio::select! {
            _ = ticks.tick() => {}
            key = next_key(&mut keys) => match key {
                b'q' | b'Q' => break 0,
                _ => continue,
            },
            _ = tokio::signal::ctrl_c() => break 0,
        }
        match Sample::take(client).await {
            Ok(sample) => previous = Some(std::mem::replace(&mut now, sample)),
            Err(err) => break refused(err),
        }
    };
    let _ = write_screen("\n");
    status
}

/// One frame of the view: rates against `before` when there is an earlier sample.
fn frame(now: &Sample, before: Option<&Sample>) -> String {
    let stats = &now.stats;
    let pool = &stats.pool;
    let proactive = &stats.proactive;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pyvisor: {} session(s), {} execution(s), {} crash(es), {} restore(s)",
        stats.sessions, stats.executions, stats.crashes, stats.restores
    );
    let _ = writeln!(
        out,
        "pool: {} idle, {} active, {} warming (max {}); hit rate {:.0}% ({} hits, {} misses); \
         spawn p50 {}",
        pool.idle,
        pool.active,
        pool.warming,
        pool.max_total,
        pool.hit_rate * 100.0,
        pool.hits,
        pool.misses,
        or_dash(pool.spawn_ms_p50.map(|ms| format!("{ms:.0} ms")))
    );
    let _ = writeln!(
        out,
        "proactive cache: hit rate {:.0}% ({} hits, {} joins, {} misses), {} cached",
        proactive.hit_rate * 100.0,
        proactive.hits,
        proactive.joins,
        proactive.misses,
        bytes(proactive.cache_bytes)
    );
    out.push('\n');
    if now.sessions.is_empty() {
        out.push_str("no sessions\n");
        return out;
    }
    let earlier: HashMap<&str, &SessionInfo> = before
        .map(|sample| {
            sample
                .sessions
                .iter()
                .map(|session| (session.session_id.as_str(), session))
                .collect()
        })
        .unwrap_or_default();
    let elapsed = before.map(|sample| now.at.duration_since(sample.at).as_secs_f64());
    let rows: Vec<Vec<String>> = now
        .sessions
        .iter()
        .map(|session| {
            let then = earlier.get(session.session_id.as_str());
            let rate = |now: f64, then: f64| match elapsed {
                Some(secs) if secs > 0.0 => Some((now - then).max(0.0) / secs),
                _ => None,
            };
            let cpu = then.and_then(|then| rate(session.cpu_s?, then.cpu_s?));
            let execs = then
                .and_then(|then| rate(session.execution_count as f64, then.execution_count as f64));
            vec![
                session.session_id.clone(),
                or_dash(session.name.as_deref()),
                or_dash(session.owner.as_deref()),
                session.state.clone(),
                or_dash(session.rss_bytes.map(bytes)),
                or_dash(cpu.map(|share| format!("{:.0}%", share * 100.0))),
                or_dash(execs.map(|rate| format!("{rate:.1}"))),
                session.execution_count.to_string(),
            ]
        })
        .collect();
    out.push_str(&render(
        &[
            "ID", "NAME", "OWNER", "STATE", "RSS", "CPU", "EXEC/S", "EXECS",
        ],
        &rows,
    ));
    out
}

fn write_screen(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// The next key pressed; never returns once there are no more keys to read.
async fn next_key(keys: &mut Option<mpsc::UnboundedReceiver<u8>>) -> u8 {
    loop {
        match keys {
            Some(receiver) => match receiver.recv().await {
                Some(key) => return key,
                // End of input (`top < /dev/null`): only Ctrl-C stops the view now.
                None => *keys = None,
            },
            None => std::future::pending().await,
        }
    }
}

/// Single key presses from stdin, ending at end of input.
fn keys() -> Option<mpsc::UnboundedReceiver<u8>> {
    let (sender, receiver) = mpsc::unbounded_channel();
    // A blocking read of stdin has no async form; this thread ends with the process.
    std::thread::spawn(move || {
        let mut byte = [0u8];
        while let Ok(1) = io::stdin().lock().read(&mut byte) {
            if sender.send(byte[0]).is_err() {
                break;
            }
        }
    });
    Some(receiver)
}

/// The terminal with line buffering and echo off, so that `q` counts at once; put back when
/// dropped. Ctrl-C still sends SIGINT.
struct RawKeys(Option<Termios>);

impl RawKeys {
    fn enable() -> RawKeys {
        let stdin = io::stdin();
        if !stdin.is_terminal() {
            return RawKeys(None);
        }
        let Ok(saved) = termios::tcgetattr(stdin.as_fd()) else {
            return RawKeys(None);
        };
        let mut raw = saved.clone();
        raw.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO);
        match termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw) {
            Ok(()) => RawKeys(Some(saved)),
            Err(_) => RawKeys(None),
        }
    }
}

impl Drop for RawKeys {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}
