//! Memory and CPU of the engine under test, sampled from `/proc` once a second: the RSS of
//! the engine's process and of all its descendants (the zygote and the workers), and the CPU
//! time of them all (their own and that of the children they reaped). A cluster the harness
//! runs has one engine process per node, each sampled so. At the end: the peaks (the largest
//! engine process; the workers of all of them together), the CPU used during the run, and the
//! slope of the engines' RSS after each process's warm-up (a least-squares fit within each
//! process, pooled, in MB per minute), which a leak makes positive.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How often the sampler looks.
pub const PERIOD: Duration = Duration::from_secs(1);

/// The resource figures of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Resources {
    pub engine_pid: Option<u32>,
    /// The most engine processes sampled at once: the nodes of a cluster, else 1.
    pub engine_processes: usize,
    /// The engine runs inside the harness's own process (its RSS includes the harness).
    pub engine_is_harness: bool,
    pub engine_peak_rss_mb: Option<f64>,
    pub workers_peak_rss_mb: Option<f64>,
    /// CPU seconds of the engine and its descendants during the run.
    pub cpu_s: Option<f64>,
    pub rss_slope_mb_per_min: Option<f64>,
    pub samples: usize,
}

/// One look at one engine process.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// The engine's process then (a restarted daemon or node is a new one).
    pid: u32,
    at: Duration,
    engine_mb: f64,
    workers_mb: f64,
    cpu_s: f64,
}

/// Samples taken so far.
pub struct Sampler {
    /// The engine's processes: one, or a cluster's nodes.
    pids: Vec<u32>,
    started: Instant,
    samples: Vec<Sample>,
    ticks_per_s: f64,
}

impl Sampler {
    pub fn new(pids: Vec<u32>, started: Instant) -> Self {
        // SAFETY: sysconf reads a configuration value and touches no memory of ours.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Self {
            pids,
            started,
            samples: Vec::new(),
            ticks_per_s: if ticks > 0 { ticks as f64 } else { 100.0 },
        }
    }

    /// Follows the engine to new processes (a restarted daemon or node).
    pub fn set_pids(&mut self, pids: Vec<u32>) {
        if !pids.is_empty() {
            self.pids = pids;
        }
    }

    /// Takes one sample of each engine process (none of one that is unknown or gone).
    pub fn sample(&mut self) {
        if self.pids.is_empty() {
            return;
        }
        let processes = processes();
        let at = self.started.elapsed();
        let looked: Vec<Sample> = (self.pids.iter())
            .filter_map(|&pid| self.sample_of(pid, at, &processes))
            .collect();
        self.samples.extend(looked);
    }

    /// One engine process and its descendants, as `processes` found them.
    fn sample_of(
        &self,
        pid: u32,
        at: Duration,
        processes: &HashMap<u32, Process>,
    ) -> Option<Sample> {
        let engine = processes.get(&pid)?;
        let mut workers_kb = 0;
        let mut ticks = engine.ticks;
        let mut frontier = vec![pid];
        while let Some(parent) = frontier.pop() {
            for (child, process) in processes {
                if process.ppid == parent {
                    workers_kb += process.rss_kb;
                    ticks += process.ticks;
                    frontier.push(*child);
                }
            }
        }
        Some(Sample {
            pid,
            at,
            engine_mb: engine.rss_kb as f64 / 1024.0,
            workers_mb: workers_kb as f64 / 1024.0,
            cpu_s: ticks as f64 / self.ticks_per_s,
        })
    }

    /// The figures. The slope leaves out each process's first `warmup` (a restarted daemon
    /// warms up again) and is fitted within each process, pooled: a leak raises every
    /// process's RSS at the same rate, while the drop at a restart says nothing. The CPU adds
    /// up each process's share.
    pub fn resources(&self, warmup: Duration, engine_is_harness: bool) -> Resources {
        // The samples of one look share its time.
        let looks: Vec<&[Sample]> = self.samples.chunk_by(|a, b| a.at == b.at).collect();
        let workers_peak = (looks.iter())
            .map(|look| look.iter().map(|s| s.workers_mb).sum::<f64>())
            .reduce(f64::max);
        let mut processes: Vec<Vec<Sample>> = Vec::new();
        for sample in &self.samples {
            match processes.iter_mut().find(|run| run[0].pid == sample.pid) {
                Some(run) => run.push(*sample),
                None => processes.push(vec![*sample]),
            }
        }
        let cpu_s = (self.samples.len() > 1).then(|| {
            (processes.iter())
                .map(|run| run[run.len() - 1].cpu_s - run[0].cpu_s)
                .sum()
        });
        let settled: Vec<Vec<(f64, f64)>> = (processes.iter())
            .map(|run| {
                // Each process warms up from its first sample (a restarted daemon's first
                // is taken once it answers).
                let born = run[0].at;
                (run.iter())
                    .filter(|s| s.at >= born + warmup)
                    .map(|s| (s.at.as_secs_f64() / 60.0, s.engine_mb))
                    .collect()
            })
            .collect();
        Resources {
            engine_pid: self.pids.first().copied(),
            engine_processes: looks.iter().map(|look| look.len()).max().unwrap_or(0),
            engine_is_harness,
            engine_peak_rss_mb: self.samples.iter().map(|s| s.engine_mb).reduce(f64::max),
            workers_peak_rss_mb: workers_peak,
            cpu_s,
            rss_slope_mb_per_min: slope(&settled),
            samples: self.samples.len(),
        }
    }
}

/// The least-squares slope shared by `segments`, each with an intercept of its own (a fit
/// within segments, pooled); segments of fewer than 3 points are left out. `None` when none
/// is left or there is no spread in x.
pub fn slope(segments: &[Vec<(f64, f64)>]) -> Option<f64> {
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for points in segments.iter().filter(|points| points.len() >= 3) {
        let n = points.len() as f64;
        let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
        sxx += points.iter().map(|p| (p.0 - mean_x).powi(2)).sum::<f64>();
        sxy += (points.iter())
            .map(|p| (p.0 - mean_x) * (p.1 - mean_y))
            .sum::<f64>();
    }
    (sxx > 0.0).then(|| sxy / sxx)
}

/// What `/proc/PID/stat` says of one process.
struct Process {
    ppid: u32,
    rss_kb: u64,
    /// utime + stime + cutime + cstime.
    ticks: u64,
}

/// Every process of the system.
fn processes() -> HashMap<u32, Process> {
    let mut found = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    // RSS in pages, as stat reports it.
    // SAFETY: sysconf reads a configuration value and touches no memory of ours.
    let page_kb = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64 / 1024;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command name, which is in parentheses and may hold spaces:
        // state ppid ... utime(14) stime(15) cutime(16) cstime(17) ... rss(24).
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        let (Some(ppid), Some(rss)) = (field(4), field(24)) else {
            continue;
        };
        let ticks = (14..=17).filter_map(field).sum();
        found.insert(
            pid,
            Process {
                ppid: ppid as u32,
                rss_kb: rss * page_kb,
                ticks,
            },
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_of_a_line_is_its_gradient_and_flat_is_zero() {
        let line: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 + 2.0 * i as f64)).collect();
        assert!((slope(std::slice::from_ref(&line)).unwrap() - 2.0).abs() < 1e-9);
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 5.0)).collect();
        assert_eq!(slope(&[flat]), Some(0.0));
        assert_eq!(slope(&[line[..2].to_vec()]), None);
    }

    #[test]
    fn a_restart_that_drops_the_memory_does_not_hide_a_leak() {
        // Two processes leaking 2 MB a minute, the second starting lower: one fit over both
        // would see the drop; the pooled fit sees the leak.
        let first: Vec<(f64, f64)> = (0..10)
            .map(|i| (i as f64, 100.0 + 2.0 * i as f64))
            .collect();
        let second: Vec<(f64, f64)> = (10..20)
            .map(|i| (i as f64, 2.0 * i as f64 - 10.0))
            .collect();
        assert!((slope(&[first, second]).unwrap() - 2.0).abs() < 1e-9);
    }

    #[test]
    fn each_process_warms_up_from_its_first_sample() {
        let sample = |pid, s, mb| Sample {
            pid,
            at: Duration::from_secs(s),
            engine_mb: mb,
            workers_mb: 0.0,
            cpu_s: 0.0,
        };
        let mut sampler = Sampler::new(vec![1], Instant::now());
        // Process 1 climbs 50 MB in its 5 s of warm-up, then leaks 1 MB a minute; process 2
        // (after a restart at 60 s) does the same from a lower start.
        for (pid, born) in [(1, 0), (2, 60)] {
            for s in 0..60_u64 {
                let warm = (s.min(5) * 10) as f64;
                let leak = s.saturating_sub(5) as f64 / 60.0;
                sampler
                    .samples
                    .push(sample(pid, born + s, 20.0 + warm + leak));
            }
        }
        let slope = sampler
            .resources(Duration::from_secs(5), false)
            .rss_slope_mb_per_min;
        assert!((slope.unwrap() - 1.0).abs() < 1e-6, "{slope:?}");
    }

    #[test]
    fn the_nodes_of_a_cluster_count_apart_and_their_workers_together() {
        let mut sampler = Sampler::new(vec![1, 2], Instant::now());
        // Two nodes sampled at each look; node 2 is killed after 2 s and comes back as 3.
        for (at, pid, engine_mb, workers_mb, cpu_s) in [
            (0, 1, 100.0, 10.0, 1.0),
            (0, 2, 80.0, 30.0, 2.0),
            (1, 1, 110.0, 20.0, 2.0),
            (1, 2, 90.0, 40.0, 4.0),
            (2, 1, 120.0, 20.0, 3.0),
            (3, 1, 120.0, 20.0, 4.0),
            (3, 3, 50.0, 5.0, 0.5),
            (4, 1, 120.0, 20.0, 5.0),
            (4, 3, 60.0, 5.0, 1.5),
        ] {
            sampler.samples.push(Sample {
                pid,
                at: Duration::from_secs(at),
                engine_mb,
                workers_mb,
                cpu_s,
            });
        }
        let resources = sampler.resources(Duration::ZERO, false);
        assert_eq!(resources.engine_processes, 2);
        assert_eq!(
            resources.engine_peak_rss_mb,
            Some(120.0),
            "the largest node"
        );
        assert_eq!(
            resources.workers_peak_rss_mb,
            Some(60.0),
            "both nodes' at 1 s"
        );
        // Each process's own CPU during the run: 4 + 2 + 1.
        assert_eq!(resources.cpu_s, Some(7.0));
    }

    #[test]
    fn this_process_is_found_with_its_memory() {
        let mut sampler = Sampler::new(vec![std::process::id()], Instant::now());
        sampler.sample();
        sampler.sample();
        let resources = sampler.resources(Duration::ZERO, true);
        assert_eq!(resources.samples, 2);
        assert_eq!(resources.engine_processes, 1);
        assert!(resources.engine_peak_rss_mb.unwrap() > 1.0);
        assert!(resources.cpu_s.unwrap() >= 0.0);
    }
}
