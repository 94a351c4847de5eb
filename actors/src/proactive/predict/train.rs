//! Learning the whole table from a corpus: the counts of what follows what (`learn.rs`),
//! then the ranker's weights (`rank.rs`), fitted on the guesses made for each group of
//! repositories by a table counted without them, so that the ranker learns how the sources
//! do on sessions unlike the ones they were counted on. Code that is not sessions (the
//! library's documented examples, `scripts/pandas-examples.py`) adds to the vocabulary of
//! edits only.
//!
//! `examples/learn_templates.rs` calls [`train`] for the committed table, and
//! `examples/predict_offline.rs` for each fold of its cross-validation, on the training
//! repositories of that fold only.

use super::learn::{Limits, TableBuilder};
use super::model::SessionModel;
use super::normal::normalise;
use super::offline::{repository, TraceCell};
use super::rank::{Features, Ranker};
use super::table::Table;

/// Groups of repositories the ranker's guesses are made for, each with the others' table.
const FOLDS: usize = 6;
/// Guesses of each cell the ranker learns from: the likeliest by their sources' share.
const SAMPLED: usize = 200;

/// The table of `sequences`: their counts and a ranker fitted on them, with the members of
/// `vocabulary` counted into the vocabulary of edits as well.
pub fn train(
    sequences: &[Vec<TraceCell>],
    vocabulary: &[Vec<TraceCell>],
    limits: &Limits,
) -> Table {
    let mut table = count(sequences.iter(), vocabulary, limits);
    table.ranker = fit_ranker(sequences, vocabulary, limits);
    table
}

/// The fold of each sequence when its repositories are dealt into `folds` groups (in
/// order of name, so that every run deals them alike).
pub fn folds_by_repository(sequences: &[Vec<TraceCell>], folds: usize) -> Vec<usize> {
    fn name(cells: &[TraceCell]) -> &str {
        cells.first().map_or("", |c| repository(&c.sequence))
    }
    let mut repositories: Vec<&str> = sequences.iter().map(|c| name(c)).collect();
    repositories.sort();
    repositories.dedup();
    sequences
        .iter()
        .map(|cells| {
            let at = repositories.iter().position(|r| *r == name(cells));
            at.unwrap_or(0) % folds.max(1)
        })
        .collect()
}

fn count<'a>(
    sequences: impl Iterator<Item = &'a Vec<TraceCell>>,
    vocabulary: &[Vec<TraceCell>],
    limits: &Limits,
) -> Table {
    let sequences: Vec<&Vec<TraceCell>> = sequences.collect();
    let mut builder = TableBuilder::new();
    for cells in sequences.iter().copied().chain(vocabulary) {
        builder.add_vocabulary(cells);
    }
    for cells in sequences {
        builder.add_sequence(cells, limits.ranks);
    }
    builder.build(limits)
}

fn fit_ranker(
    sequences: &[Vec<TraceCell>],
    vocabulary: &[Vec<TraceCell>],
    limits: &Limits,
) -> Option<Ranker> {
    let folds = folds_by_repository(sequences, FOLDS);
    let mut samples: Vec<(Features, bool)> = Vec::new();
    for fold in 0..FOLDS {
        let others = sequences
            .iter()
            .zip(&folds)
            .filter(|(_, f)| **f != fold)
            .map(|(cells, _)| cells);
        let table = count(others, vocabulary, limits);
        let held = sequences
            .iter()
            .zip(&folds)
            .filter(|(_, f)| **f == fold)
            .map(|(cells, _)| cells);
        for cells in held {
            samples.extend(guesses(cells, &table));
        }
    }
    Ranker::fit(&samples)
}

/// The guesses made before each cell of `cells` after the first, each with whether it was
/// that cell.
fn guesses(cells: &[TraceCell], table: &Table) -> Vec<(Features, bool)> {
    let mut out = Vec::new();
    let mut model = SessionModel::new();
    for (i, cell) in cells.iter().enumerate() {
        if i > 0 {
            let normal = normalise(&cell.code);
            for candidate in model.candidates(table, SAMPLED) {
                let hit = Some(&candidate.prediction.normal) == normal.as_ref();
                out.push((candidate.features, hit));
            }
        }
        model.observe(&cell.code, &cell.facts, cell.ok());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence(name: &str) -> Vec<TraceCell> {
        vec![TraceCell {
            sequence: name.to_string(),
            index: 0,
            code: "x = 1".to_string(),
            status: "ok".to_string(),
            facts: Default::default(),
            duration_ms: 0.0,
        }]
    }

    #[test]
    fn repositories_are_dealt_into_folds_whole() {
        let sequences = vec![
            sequence("b.repo--one"),
            sequence("a.repo--one"),
            sequence("b.repo--two"),
            sequence("c.repo--one"),
        ];
        assert_eq!(folds_by_repository(&sequences, 2), [1, 0, 1, 0]);
        assert_eq!(folds_by_repository(&sequences, 6), [1, 0, 1, 2]);
    }

    fn cells(name: &str, code: &[&str]) -> Vec<TraceCell> {
        code.iter()
            .enumerate()
            .map(|(index, code)| TraceCell {
                sequence: name.to_string(),
                index,
                code: code.to_string(),
                status: "ok".to_string(),
                facts: Default::default(),
                duration_ms: 0.0,
            })
            .collect()
    }

    #[test]
    fn the_vocabulary_adds_members_but_no_cells() {
        let sessions = vec![cells("a.repo--one", &["s.max()", "s.min()"])];
        let examples = vec![
            cells("pandas.docstrings--max", &["s.max()", "s.max(axis=1)"]),
            cells(
                "pandas.docstrings--median",
                &["s.median()", "s.median(axis=1)"],
            ),
        ];
        let alone = train(&sessions, &[], &Limits::default());
        let with = train(&sessions, &examples, &Limits::default());
        let alike = |t: &Table| t.edits.alike.get("max").cloned().unwrap_or_default();
        assert!(!alike(&alone).iter().any(|(m, _)| m == "median"));
        assert!(alike(&with).iter().any(|(m, _)| m == "median"));
        assert_eq!(with.cells, alone.cells);
        assert_eq!(with.next, alone.next);
    }
}
