//! The live view of a run: on a terminal, a progress bar (`indicatif`) with throughput, the
//! p50 and p99 of the counter round trip (`x += 1`) and the counts of errors, wrong answers
//! and lost state; elsewhere (a pipe, CI) the same as a plain line every ten seconds.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::report::Recorder;

/// How often a plain line is printed when stderr is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// Runs the view until `stop` fires (or its sender goes); `total` is the run's length when it
/// is timed.
pub fn start(
    name: String,
    recorder: Arc<Recorder>,
    started: Instant,
    total: Option<Duration>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let terminal = std::io::stderr().is_terminal();
        let bar = terminal.then(|| {
            let bar = match total {
                Some(total) => ProgressBar::new(total.as_secs()),
                None => ProgressBar::new_spinner(),
            };
            let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len}s {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(name.clone());
            bar
        });
        let mut last_plain = Instant::now();
        loop {
            tokio::select! {
                _ = &mut stop => {
                    if let Some(bar) = &bar {
                        bar.finish_and_clear();
                    }
                    return;
                }
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            let live = recorder.live();
            let elapsed = started.elapsed();
            let message = format!(
                "{} ops, {:.1}/s, x+=1 p50 {:.1} ms p99 {:.1} ms, errors {}, wrong {}, lost {}",
                live.ops,
                live.ops as f64 / elapsed.as_secs_f64().max(0.001),
                live.p50_ms,
                live.p99_ms,
                live.errors,
                live.wrong,
                live.lost
            );
            match &bar {
                Some(bar) => {
                    bar.set_position(elapsed.as_secs());
                    bar.set_message(message);
                }
                None if last_plain.elapsed() >= PLAIN_EVERY => {
                    last_plain = Instant::now();
                    eprintln!("{name} {:>6.0} s: {message}", elapsed.as_secs_f64());
                }
                None => {}
            }
        }
    })
}
