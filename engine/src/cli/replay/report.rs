//! What `pyvisor replay` measured, and how it prints it.

use std::collections::BTreeMap;
use std::time::Duration;

use pyvisor::ExecutionResult;
use pyvisor::ProactiveStats;
use serde::Serialize;

use super::super::drive::print_json_report;

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// The figures of one replay.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Cells run, first cells of each sequence included.
    pub cells: usize,
    /// Cells after the first of each sequence: those speculation could answer.
    pub predictable_cells: usize,
    /// Cells answered from speculation.
    pub served: usize,
    /// served / predictable_cells.
    pub served_share: f64,
    #[serde(skip)]
    hit_latencies: Vec<Duration>,
    #[serde(skip)]
    miss_latencies: Vec<Duration>,
    #[serde(skip)]
    twin_miss_latencies: Vec<Duration>,
    pub hit_ms: Percentiles,
    pub miss_ms: Percentiles,
    /// With `--verify`: the twin's latency on the cells that were misses, run right after
    /// them in the same engine: what the misses would have cost without proactive computation.
    pub twin_miss_ms: Percentiles,
    /// CPU time speculative children used during the replay.
    pub speculation_cpu_ms: f64,
    /// That CPU time as a share of one core over the replay's wall time.
    pub speculation_core_share: f64,
    /// The most bytes the engine's cache held at the end of any cell.
    pub peak_cache_bytes: u64,
    /// Answers served, by the prediction source that proposed them.
    pub served_by_source: BTreeMap<String, u64>,
    pub wall_s: f64,
    /// Answers that differ from a real run's (with `--verify`); there must be none.
    pub differences: Vec<Difference>,
}

/// Median and 99th percentile of some latencies, in milliseconds.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
}

impl Percentiles {
    fn of(latencies: &mut [Duration]) -> Percentiles {
        latencies.sort();
        let at = |q: f64| {
            let index = ((latencies.len() as f64 - 1.0) * q).round() as usize;
            latencies
                .get(index)
                .map_or(0.0, |latency| latency.as_secs_f64() * 1000.0)
        };
        Percentiles {
            count: latencies.len(),
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

/// A cell whose answer in the proactive session differs from the twin's real run.
#[derive(Debug, Serialize)]
pub struct Difference {
    pub sequence: String,
    pub cell: usize,
    pub from_cache: bool,
    /// The fields that differ.
    pub fields: Vec<&'static str>,
}

impl Difference {
    /// How `answer` differs from `real`, if it does.
    pub fn between(
        sequence: &str,
        cell: usize,
        answer: &ExecutionResult,
        real: &ExecutionResult,
    ) -> Option<Difference> {
        let same = |a: &str, b: &str| without_addresses(a) == without_addresses(b);
        let same_result = match (&answer.result, &real.result) {
            (Some(a), Some(b)) => {
                a.type_name == b.type_name
                    && same(&a.repr, &b.repr)
                    && same(
                        a.html.as_deref().unwrap_or_default(),
                        b.html.as_deref().unwrap_or_default(),
                    )
            }
            (a, b) => a == b,
        };
        let checks: [(&'static str, bool); 7] = [
            ("status", answer.status == real.status),
            (
                "execution_count",
                answer.execution_count == real.execution_count,
            ),
            ("stdout", same(&answer.stdout, &real.stdout)),
            ("stderr", same(&answer.stderr, &real.stderr)),
            ("result", same_result),
            ("display", answer.display == real.display),
            ("error", answer.error == real.error),
        ];
        let fields: Vec<&'static str> = checks
            .into_iter()
            .filter(|(_, same)| !same)
            .map(|(field, _)| field)
            .collect();
        (!fields.is_empty()).then(|| Difference {
            sequence: sequence.to_owned(),
            cell,
            from_cache: answer.from_cache,
            fields,
        })
    }
}

impl Report {
    /// A cell was answered after `latency` (from speculation when `served`).
    pub fn cell(&mut self, first: bool, served: bool, latency: Duration) {
        self.cells += 1;
        if !first {
            self.predictable_cells += 1;
        }
        if served {
            self.served += 1;
            self.hit_latencies.push(latency);
        } else {
            self.miss_latencies.push(latency);
        }
    }

    /// The twin ran a cell that was a miss in `latency`.
    pub fn twin_miss(&mut self, latency: Duration) {
        self.twin_miss_latencies.push(latency);
    }

    /// The cache held `bytes` after a cell.
    pub fn sample_cache(&mut self, bytes: u64) {
        self.peak_cache_bytes = self.peak_cache_bytes.max(bytes);
    }

    /// Closes the figures with the engine's totals before and after the replay.
    pub fn finish(&mut self, before: &ProactiveStats, after: &ProactiveStats, wall: Duration) {
        self.served_share = ratio(self.served, self.predictable_cells);
        self.hit_ms = Percentiles::of(&mut self.hit_latencies);
        self.miss_ms = Percentiles::of(&mut self.miss_latencies);
        self.twin_miss_ms = Percentiles::of(&mut self.twin_miss_latencies);
        self.speculation_cpu_ms = after.cpu_ms - before.cpu_ms;
        self.wall_s = wall.as_secs_f64();
        self.speculation_core_share = match self.wall_s {
            wall if wall > 0.0 => self.speculation_cpu_ms / 1000.0 / wall,
            _ => 0.0,
        };
        self.served_by_source = after
            .served_by_source
            .iter()
            .map(|(source, count)| {
                let earlier = before.served_by_source.get(source).copied().unwrap_or(0);
                (source.clone(), count - earlier)
            })
            .filter(|(_, count)| *count > 0)
            .collect();
    }

    pub fn print(&self, format: Format) {
        if format == Format::Json {
            print_json_report(self);
            return;
        }
        println!(
            "cells answered from speculation: {} of {} after the first of each sequence ({:.1}%)",
            self.served,
            self.predictable_cells,
            self.served_share * 100.0
        );
        let latency = |p: &Percentiles| format!("p50 {:.2} ms, p99 {:.2} ms", p.p50, p.p99);
        println!(
            "hit latency:  {} ({} hits)",
            latency(&self.hit_ms),
            self.hit_ms.count
        );
        println!(
            "miss latency: {} ({} misses)",
            latency(&self.miss_ms),
            self.miss_ms.count
        );
        if self.twin_miss_ms.count > 0 {
            println!(
                "the same cells in the twin, without proactive computation: {} ({:.3}× at p50)",
                latency(&self.twin_miss_ms),
                self.miss_ms.p50 / self.twin_miss_ms.p50
            );
        }
        println!(
            "speculation CPU: {:.0} ms over {:.0} s ({:.1}% of one core)",
            self.speculation_cpu_ms,
            self.wall_s,
            self.speculation_core_share * 100.0
        );
        println!("peak cache: {:.1} MB", self.peak_cache_bytes as f64 / 1e6);
        let sources: Vec<String> = self
            .served_by_source
            .iter()
            .map(|(source, count)| format!("{source} {count}"))
            .collect();
        println!("hits by source: {}", sources.join(", "));
        if !self.differences.is_empty() {
            println!(
                "answers that differ from a real run: {}",
                self.differences.len()
            );
            for difference in &self.differences {
                println!(
                    "  {} cell {} (from cache: {}): {}",
                    difference.sequence,
                    difference.cell,
                    difference.from_cache,
                    difference.fields.join(", ")
                );
            }
        }
    }
}

/// `text` with every hexadecimal address (`0x7f3a...`) written as `0x…`: the default repr of
/// an object names where it lives, which differs between any two processes.
fn without_addresses(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("0x") {
        out.push_str(&rest[..at + 2]);
        let digits = rest[at + 2..]
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(rest.len() - at - 2);
        if digits > 0 {
            out.push('…');
        }
        rest = &rest[at + 2 + digits..];
    }
    out.push_str(rest);
    out
}

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::without_addresses;

    #[test]
    fn addresses_are_written_alike_and_nothing_else_changes() {
        assert_eq!(
            without_addresses("<itertools.cycle object at 0x7f3a2b1c>"),
            without_addresses("<itertools.cycle object at 0x55e0aa>")
        );
        assert_ne!(without_addresses("0x10 + 1"), without_addresses("0x10 + 2"));
        assert_eq!(without_addresses("no address, 0x"), "no address, 0x");
        assert_eq!(without_addresses("é 0xff é"), "é 0x… é");
    }
}
