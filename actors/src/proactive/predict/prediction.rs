//! What the predictor hands the scheduler: one guess of the next cell, where it came from,
//! how likely it is and what running it is worth.

use serde::{Deserialize, Serialize};

/// Where a prediction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Source {
    /// An inspection that fits an object of the namespace (by type, shape, columns).
    Namespace,
    /// A learned successor of the last cell's template, filled with the session's names.
    Template,
    /// What this session did to one object, applied to another.
    History,
    /// The bare name of an object just bound.
    Display,
    /// Code the caller announced with `session.hint`.
    Hint,
}

impl Source {
    /// Every source, for metric labels.
    pub const ALL: [Source; 5] = [
        Source::Namespace,
        Source::Template,
        Source::History,
        Source::Display,
        Source::Hint,
    ];

    /// The source's name as a metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Source::Namespace => "namespace",
            Source::Template => "template",
            Source::History => "history",
            Source::Display => "display",
            Source::Hint => "hint",
        }
    }
}

/// One guess of the next cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// The code to run.
    pub code: String,
    /// Its normal form, the cache key.
    pub normal: String,
    pub source: Source,
    /// The template it instantiates (the normal form for a hint): what outcomes and
    /// runtimes are recorded under in [`super::Learned`].
    pub template: String,
    /// The chance that it is the next cell.
    pub probability: f64,
    /// The expected runtime of a real run, in milliseconds.
    pub cost_ms: f64,
    /// Index in the same list of a prediction this one runs after, in the same child.
    pub after: Option<usize>,
}

impl Prediction {
    /// The time a hit saves on average, which ranks predictions: probability × cost, where
    /// a cost counts at least the fixed price of a real execution.
    pub fn expected_saving(&self) -> f64 {
        self.probability * self.cost_ms.max(MIN_COST_MS)
    }
}

/// The least a real execution costs (a round trip to the worker), in milliseconds.
pub const MIN_COST_MS: f64 = 5.0;
