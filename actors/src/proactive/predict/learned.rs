//! What the predictor learns while it runs: which guesses were then sent (hits) and which
//! were not, per source and per template, and how long each template takes.
//!
//! The caller records outcomes; predictions blend the table's prior with them, so a template
//! that keeps missing in this engine sinks, and one that keeps hitting rises.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::prediction::Source;
use super::table::Rate;

/// How many outcomes the table's prior for one template is worth.
const PRIOR_WEIGHT: f64 = 4.0;
/// How many outcomes a source needs before its record moves its guesses.
const SOURCE_PRIOR_TRIALS: f64 = 20.0;

/// Online statistics of outcomes and runtimes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Learned {
    sources: BTreeMap<String, Rate>,
    templates: BTreeMap<String, Rate>,
    runtimes: BTreeMap<String, Runtime>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
struct Runtime {
    runs: u64,
    mean_ms: f64,
}

impl Learned {
    /// Nothing learned yet.
    pub fn new() -> Learned {
        Learned::default()
    }

    /// One guess of `source` for `template` was offered; `hit` says whether it was then sent.
    pub fn record(&mut self, source: Source, template: &str, hit: bool) {
        for rate in [
            self.sources.entry(source.as_str().to_string()).or_default(),
            self.templates.entry(template.to_string()).or_default(),
        ] {
            rate.trials += 1;
            rate.hits += u64::from(hit);
        }
    }

    /// A run of `template` took `ms` milliseconds.
    pub fn record_runtime(&mut self, template: &str, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        let r = self.runtimes.entry(template.to_string()).or_default();
        r.runs += 1;
        r.mean_ms += (ms - r.mean_ms) / r.runs as f64;
    }

    /// The mean runtime of `template`, when it ran.
    pub fn runtime(&self, template: &str) -> Option<f64> {
        self.runtimes.get(template).map(|r| r.mean_ms)
    }

    /// The probability of a guess whose model estimate is `prior`: a Beta posterior on the
    /// template's outcomes with the prior as its mean, times how much better or worse than
    /// the average the source has done.
    pub fn probability(&self, source: Source, template: &str, prior: f64) -> f64 {
        let prior = prior.clamp(0.0, 1.0);
        let posterior = match self.templates.get(template) {
            Some(r) => (prior * PRIOR_WEIGHT + r.hits as f64) / (PRIOR_WEIGHT + r.trials as f64),
            None => prior,
        };
        (posterior * self.source_factor(source)).clamp(0.0, 1.0)
    }

    /// The source's smoothed hit rate over that of all sources, within 0.2 to 5.
    fn source_factor(&self, source: Source) -> f64 {
        let Some(own) = self.sources.get(source.as_str()) else {
            return 1.0;
        };
        let all = self.sources.values().fold(Rate::default(), |a, r| Rate {
            hits: a.hits + r.hits,
            trials: a.trials + r.trials,
        });
        let average = all.smoothed(SOURCE_PRIOR_TRIALS);
        let own_rate = (own.hits as f64 + average * SOURCE_PRIOR_TRIALS)
            / (own.trials as f64 + SOURCE_PRIOR_TRIALS);
        (own_rate / average).clamp(0.2, 5.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_lower_and_hits_raise_a_template() {
        let mut learned = Learned::new();
        let before = learned.probability(Source::Template, "$0.head()", 0.3);
        assert_eq!(before, 0.3);
        for _ in 0..10 {
            learned.record(Source::Template, "$0.head()", false);
            learned.record(Source::Template, "$0.shape", true);
        }
        assert!(learned.probability(Source::Template, "$0.head()", 0.3) < 0.15);
        assert!(learned.probability(Source::Template, "$0.shape", 0.3) > 0.6);
    }

    #[test]
    fn a_source_that_hits_more_than_others_is_trusted_more() {
        let mut learned = Learned::new();
        for i in 0..50 {
            learned.record(Source::Display, &format!("d{i}"), i % 2 == 0);
            learned.record(Source::Namespace, &format!("n{i}"), i % 25 == 0);
        }
        let display = learned.probability(Source::Display, "new", 0.1);
        let namespace = learned.probability(Source::Namespace, "new", 0.1);
        assert!(display > 0.1 && namespace < 0.1, "{display} {namespace}");
    }

    #[test]
    fn runtimes_are_averaged_and_round_trip_through_serde() {
        let mut learned = Learned::new();
        learned.record_runtime("$0.describe()", 10.0);
        learned.record_runtime("$0.describe()", 20.0);
        learned.record_runtime("$0.describe()", f64::NAN);
        assert_eq!(learned.runtime("$0.describe()"), Some(15.0));
        let json = serde_json::to_string(&learned).expect("serialises");
        let back: Learned = serde_json::from_str(&json).expect("deserialises");
        assert_eq!(back, learned);
    }
}
