//! Replaying recorded sessions through the predictor: before each cell after the first, the
//! model built from the cells before it predicts, and a cell counts as covered at K when its
//! normal form is among the top K guesses.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::learned::Learned;
use super::model::SessionModel;
use super::normal::{is_single_expression, normalise};
use super::offline::TraceCell;
use super::prediction::Source;
use super::table::Table;

/// Coverage of a set of sequences.
#[derive(Debug, Clone, Default)]
pub struct Coverage {
    /// All cells, first ones included.
    pub cells: usize,
    /// Cells that are a single expression.
    pub single: usize,
    /// K to the cells covered at K.
    pub covered: BTreeMap<usize, usize>,
    /// K to the covered cells by the source of the guess that matched.
    pub by_source: BTreeMap<usize, BTreeMap<&'static str, usize>>,
    /// Single expressions no guess matched: where (`SEQUENCE:INDEX`), the cell before and
    /// the cell.
    pub misses: Vec<(String, String, String)>,
    /// Calls of `predict`, their total time and the slowest one.
    pub predict_calls: usize,
    pub predict_time: Duration,
    pub predict_slowest: Duration,
}

impl Coverage {
    /// The share of all cells covered at `k`.
    pub fn share(&self, k: usize) -> f64 {
        self.covered.get(&k).copied().unwrap_or(0) as f64 / self.cells.max(1) as f64
    }
}

/// Replays `sequences`, offering the top `offer` guesses before each cell and recording
/// their outcomes and the cell's runtime in `learned`, as an engine would.
pub fn evaluate(
    sequences: &[Vec<TraceCell>],
    table: &Table,
    learned: &mut Learned,
    ks: &[usize],
    offer: usize,
) -> Coverage {
    let mut coverage = Coverage::default();
    let depth = ks.iter().copied().max().unwrap_or(0).max(offer);
    for cells in sequences {
        let mut model = SessionModel::new();
        for (i, cell) in cells.iter().enumerate() {
            coverage.cells += 1;
            coverage.single += usize::from(is_single_expression(&cell.code));
            let normal = normalise(&cell.code);
            if i > 0 {
                let started = Instant::now();
                let guesses = model.predict(table, learned, depth);
                let took = started.elapsed();
                coverage.predict_calls += 1;
                coverage.predict_time += took;
                coverage.predict_slowest = coverage.predict_slowest.max(took);
                let rank = guesses
                    .iter()
                    .position(|g| Some(&g.normal) == normal.as_ref());
                if rank.is_none() && is_single_expression(&cell.code) {
                    coverage.misses.push((
                        format!("{}:{i}", cell.sequence),
                        cells[i - 1].code.clone(),
                        cell.code.clone(),
                    ));
                }
                if let Some(rank) = rank {
                    for &k in ks.iter().filter(|&&k| rank < k) {
                        *coverage.covered.entry(k).or_default() += 1;
                        *coverage
                            .by_source
                            .entry(k)
                            .or_default()
                            .entry(guesses[rank].source.as_str())
                            .or_default() += 1;
                    }
                }
                for (j, guess) in guesses.iter().take(offer).enumerate() {
                    learned.record(guess.source, &guess.template, Some(j) == rank);
                }
                if let (Some(rank), true) = (rank, cell.duration_ms > 0.0) {
                    learned.record_runtime(&guesses[rank].template, cell.duration_ms);
                }
            }
            model.observe(&cell.code, &cell.facts, cell.ok());
        }
    }
    for k in ks {
        let sources = coverage.by_source.entry(*k).or_default();
        for source in Source::ALL {
            sources.entry(source.as_str()).or_default();
        }
    }
    coverage
}
