//! The ranker: one logistic model that turns what the candidate generators say about a guess
//! (the pooled share of its sources) and what the session says about it (is it a repeat, is
//! its object the one in focus, did this session already run that template on that object)
//! into the chance that it is the next cell.
//!
//! The sources each estimate a probability on their own terms (backed-off table shares, the
//! history's rates by kind and age); summed, they overrate stale repeats and objects the
//! session has moved away from. The weights are fitted on the corpus by `train.rs`, on
//! guesses made for repositories left out of the table they came from, so they learn how the
//! sources do on sessions they have not seen. [`SessionModel::features`] computes the
//! features from the session's history and data.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::model::SessionModel;
use super::prediction::Source;
use super::template::{abstract_tokens, Scope};
use super::tokens::{tokenize, Kind};

/// What each feature of a guess is: the first is the log-odds of its sources' share, an
/// offset with the fixed weight 1 (the ranker learns corrections to the sources, not their
/// scale); the second is 1 (the bias); the others are 0 or 1 unless said.
pub const FEATURE_NAMES: [&str; FEATURES] = [
    "log-odds of the sources' share",
    "bias",
    "from the table",
    "from the history",
    "from the unconditional table (namespace)",
    "from the display source",
    "a continuation of the last cell's chain",
    "an earlier cell again, nothing it reads changed",
    "an earlier cell again, what it reads changed",
    "its object's recency, 1/(1 + rank)",
    "its object is the one the last cell used",
    "its object was bound by the last cell",
    "the session ran its template before",
    "the session ran its template on its object before",
    "the log of its number of tokens",
];
/// How many features a guess has.
pub const FEATURES: usize = 15;
/// How strongly the fit pulls the weights towards 0 (an L2 penalty; not on the bias).
const L2: f64 = 1.0;
/// Newton steps of the fit, at most.
const STEPS: usize = 25;

/// The features of one guess (see [`FEATURE_NAMES`]).
pub type Features = [f64; FEATURES];

/// A logistic model over [`Features`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ranker {
    /// One weight per feature; the first is always 1.
    pub weights: Vec<f64>,
}

/// The weights the fit chooses: all but the offset's.
const FITTED: usize = FEATURES - 1;

impl Ranker {
    /// The chance that a guess with features `x` is the next cell.
    pub fn probability(&self, x: &Features) -> f64 {
        let z: f64 = self.weights.iter().zip(x).map(|(w, x)| w * x).sum();
        sigmoid(z)
    }

    /// Fits the weights to `samples` (features, whether the guess was the next cell) by
    /// Newton's method on the penalised log-likelihood; `None` without samples of both kinds.
    pub fn fit(samples: &[(Features, bool)]) -> Option<Ranker> {
        let positives = samples.iter().filter(|(_, y)| *y).count();
        if positives == 0 || positives == samples.len() {
            return None;
        }
        let mut w = [0.0; FITTED];
        for _ in 0..STEPS {
            let mut gradient = [0.0; FITTED];
            let mut hessian = [[0.0; FITTED]; FITTED];
            for (x, y) in samples {
                let fitted = &x[1..];
                let z = x[0] + dot(&w, fitted);
                let p = sigmoid(z);
                let residual = f64::from(u8::from(*y)) - p;
                let weight = (p * (1.0 - p)).max(1e-9);
                for (i, row) in hessian.iter_mut().enumerate() {
                    gradient[i] += residual * fitted[i];
                    for (h, f) in row.iter_mut().zip(fitted) {
                        *h += weight * fitted[i] * f;
                    }
                }
            }
            for i in 0..FITTED {
                // The bias is not pulled towards 0.
                let l2 = if i == 0 { 1e-6 } else { L2 };
                gradient[i] -= l2 * w[i];
                hessian[i][i] += l2;
            }
            let step = solve(hessian, gradient)?;
            let mut largest: f64 = 0.0;
            for i in 0..FITTED {
                w[i] += step[i];
                largest = largest.max(step[i].abs());
            }
            if largest < 1e-6 {
                break;
            }
        }
        let weights = std::iter::once(1.0)
            .chain(w.iter().map(|v| (v * 1e4).round() / 1e4))
            .collect::<Vec<f64>>();
        weights
            .iter()
            .all(|v| v.is_finite())
            .then_some(Ranker { weights })
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Solves `a x = b` by Gaussian elimination with partial pivoting; `None` when singular.
fn solve(mut a: [[f64; FITTED]; FITTED], mut b: [f64; FITTED]) -> Option<[f64; FITTED]> {
    for col in 0..FITTED {
        let pivot = (col..FITTED).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..FITTED {
            let factor = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (x, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= factor * p;
            }
            b[row] -= factor * b[col];
        }
    }
    let mut x = [0.0; FITTED];
    for row in (0..FITTED).rev() {
        let tail: f64 = (row + 1..FITTED).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - tail) / a[row][row];
    }
    Some(x)
}

/// What the session's history says about guesses, gathered once per call of `predict`.
pub(super) struct Recall {
    /// Normal forms of earlier cells whose names nothing changed since, and of the others.
    unchanged: HashSet<String>,
    changed: HashSet<String>,
    /// Templates the session ran, and each with the object it ran on.
    templates: HashSet<String>,
    on_object: HashSet<(String, String)>,
    /// The first data object the last cell named, and the objects it bound.
    focus: Option<String>,
    bound: Vec<String>,
    scope: Scope,
}

impl SessionModel {
    /// The session's history as the ranker reads it.
    pub(super) fn recall(&self) -> Recall {
        let mut recall = Recall {
            unchanged: HashSet::new(),
            changed: HashSet::new(),
            templates: HashSet::new(),
            on_object: HashSet::new(),
            focus: None,
            bound: Vec::new(),
            scope: self.scope(),
        };
        for past in &self.history {
            if let Some(normal) = &past.normal {
                if self.changed_since(past) {
                    recall.changed.insert(normal.clone());
                } else {
                    recall.unchanged.insert(normal.clone());
                }
            }
            recall.templates.insert(past.template.key.clone());
            if let Some(first) = past.template.vars.first() {
                recall
                    .on_object
                    .insert((past.template.key.clone(), first.clone()));
            }
        }
        if let Some(last) = self.history.back() {
            recall.focus = last
                .template
                .vars
                .iter()
                .find(|v| self.objects.contains_key(*v))
                .cloned();
            recall.bound = last.bound.clone();
        }
        recall
    }

    /// The features of the guess `code` (in normal form), whose sources gave it `by_source`.
    pub(super) fn features(
        &self,
        code: &str,
        template: &str,
        by_source: &[f64; 5],
        recall: &Recall,
    ) -> Features {
        let chained = template.starts_with('-');
        let prior = by_source.iter().sum::<f64>().clamp(1e-6, 1.0 - 1e-6);
        let from = |s: Source| f64::from(u8::from(by_source[s as usize] > 0.0));
        let sources = [
            Source::Template,
            Source::History,
            Source::Namespace,
            Source::Display,
        ]
        .map(from);
        let tokens = tokenize(code).unwrap_or_default();
        let abstracted = abstract_tokens(&tokens, &recall.scope);
        let object = tokens
            .iter()
            .enumerate()
            .find(|(i, t)| {
                t.kind == Kind::Name
                    && (*i == 0 || !tokens[i - 1].is_op("."))
                    && self.objects.contains_key(&t.text)
            })
            .map(|(_, t)| t.text.clone());
        let recency = object
            .as_ref()
            .and_then(|o| self.recency.iter().position(|r| r == o))
            .map_or(0.0, |rank| 1.0 / (1.0 + rank as f64));
        let on_object = object.as_ref().is_some_and(|o| {
            recall
                .on_object
                .contains(&(abstracted.key.clone(), o.clone()))
        });
        let flag = |b: bool| f64::from(u8::from(b));
        [
            (prior / (1.0 - prior)).ln(),
            1.0,
            sources[0],
            sources[1],
            sources[2],
            sources[3],
            flag(chained),
            flag(recall.unchanged.contains(code)),
            flag(recall.changed.contains(code)),
            recency,
            flag(object.is_some() && object == recall.focus),
            flag(object.as_ref().is_some_and(|o| recall.bound.contains(o))),
            flag(recall.templates.contains(&abstracted.key)),
            flag(on_object),
            (tokens.len() as f64).ln(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guess whose sources say `share`, with a `signal` and some `noise` besides.
    fn sample(share: f64, signal: f64, noise: f64, y: bool) -> (Features, bool) {
        let mut x = [0.0; FEATURES];
        x[0] = (share / (1.0 - share)).ln();
        x[1] = 1.0;
        x[2] = signal;
        x[3] = noise;
        (x, y)
    }

    #[test]
    fn the_fit_corrects_the_sources_by_a_signal_and_not_by_noise() {
        let mut samples = Vec::new();
        for i in 0..600 {
            let noise = f64::from(i % 7) / 7.0;
            // The sources say 0.2 for every guess; with the signal the guess is right half
            // the time, without it one time in twenty.
            samples.push(sample(0.2, 1.0, noise, i % 2 == 0));
            samples.push(sample(0.2, 0.0, noise, i % 20 == 0));
        }
        let ranker = Ranker::fit(&samples).expect("both kinds of sample");
        assert_eq!(ranker.weights[0], 1.0);
        assert!(ranker.weights[2] > 2.0, "{:?}", ranker.weights);
        assert!(ranker.weights[3].abs() < 0.5, "{:?}", ranker.weights);
        let with = ranker.probability(&sample(0.2, 1.0, 0.5, true).0);
        let without = ranker.probability(&sample(0.2, 0.0, 0.5, true).0);
        assert!((with - 0.5).abs() < 0.05, "{with}");
        assert!((without - 0.05).abs() < 0.02, "{without}");
        // The sources' share still orders guesses the features cannot tell apart.
        let likelier = ranker.probability(&sample(0.4, 1.0, 0.5, true).0);
        assert!(likelier > with, "{likelier} {with}");
    }

    #[test]
    fn features_say_what_the_session_did_with_a_guess_and_its_object() {
        use pyvisor_protocol::messages::CellFacts;

        use super::super::scenarios::{column, frame};

        let mut model = SessionModel::new();
        let mut run = |code: &str, binds: &[&str], objects: &[&str]| {
            let facts = CellFacts {
                binds: binds.iter().map(|s| s.to_string()).collect(),
                objects: objects
                    .iter()
                    .map(|o| frame(o, vec![column("a", "int64", 5)]))
                    .collect(),
                ..CellFacts::default()
            };
            model.observe(code, &facts, true);
        };
        run("old = load()", &["old"], &["old"]);
        run("old.head()", &[], &["old"]);
        run("df = load()", &["df"], &["df"]);
        let recall = model.recall();
        let table = [0.0, 0.2, 0.0, 0.0, 0.0];
        let history = [0.0, 0.0, 0.05, 0.0, 0.0];
        let of = |code: &str, by_source: &[f64; 5]| {
            model.features(code, "$0.head()", by_source, &recall)
        };
        let again = of("old.head()", &history);
        let fresh = of("df.head()", &table);
        // The source's share is the offset, then the bias.
        assert!((fresh[0] - (0.2f64 / 0.8).ln()).abs() < 1e-9, "{fresh:?}");
        assert_eq!(fresh[1], 1.0);
        assert_eq!((fresh[2], fresh[3]), (1.0, 0.0), "{fresh:?}");
        assert_eq!((again[2], again[3]), (0.0, 1.0), "{again:?}");
        // `old.head()` ran and nothing changed `old` since; `df` was just bound.
        assert_eq!((again[7], again[8]), (1.0, 0.0), "{again:?}");
        assert_eq!((fresh[7], fresh[11]), (0.0, 1.0), "{fresh:?}");
        assert!(
            fresh[9] > again[9],
            "df is more recent: {fresh:?} {again:?}"
        );
        // The session ran `$0.head()`, on `old` and not on `df`.
        assert_eq!((fresh[12], fresh[13]), (1.0, 0.0), "{fresh:?}");
        assert_eq!((again[12], again[13]), (1.0, 1.0), "{again:?}");
    }

    #[test]
    fn no_fit_without_both_outcomes() {
        assert_eq!(Ranker::fit(&[sample(0.5, 1.0, 0.0, true)]), None);
        assert_eq!(Ranker::fit(&[]), None);
    }
}
