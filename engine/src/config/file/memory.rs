//! `[memory]`: remembering execution outcomes and warning before a known failure repeats
//! (see [`MemoryConfig`]).

use std::time::Duration;

use pyvisor_actors::memory::PolicyConfig;
use serde::{Deserialize, Serialize};

use crate::config::MemoryConfig;

/// `[memory]` as read from TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySettings {
    /// Remember outcomes and attach insights to results.
    pub enabled: bool,
    /// Most outcomes kept; the oldest go first.
    pub max_outcomes: u64,
    /// Outcomes older than this many days are dropped; 0 keeps them until `max_outcomes`
    /// pushes them out.
    pub max_age_days: f64,
    /// Least similarity (0 to 1) between code and an earlier failure's code.
    pub threshold: f64,
    /// Least confidence (0 to 1) of an insight shown on a result.
    pub confidence: f64,
    /// Most insights one session gets.
    pub budget: u32,
    /// Least earlier failures of a pattern before it is told.
    pub min_failures: u32,
    /// Least executions between two insights of one session.
    pub spacing: u32,
}

impl Default for MemorySettings {
    fn default() -> Self {
        let defaults = MemoryConfig::default();
        Self {
            enabled: defaults.enabled,
            max_outcomes: defaults.max_outcomes,
            max_age_days: 0.0,
            threshold: defaults.threshold,
            confidence: defaults.policy.confidence,
            budget: defaults.policy.budget,
            min_failures: defaults.policy.min_failures,
            spacing: defaults.policy.spacing,
        }
    }
}

impl MemorySettings {
    /// Checks the ranges that types do not.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        let share = |key: &'static str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err((key, format!("must be from 0 to 1, got {value}")))
            }
        };
        share("memory.threshold", self.threshold)?;
        share("memory.confidence", self.confidence)?;
        if self.max_outcomes == 0 {
            return Err(("memory.max_outcomes", "must be at least 1".into()));
        }
        if !(0.0..=36_500.0).contains(&self.max_age_days) {
            return Err((
                "memory.max_age_days",
                format!(
                    "must be from 0 (no limit) to 36500, got {}",
                    self.max_age_days
                ),
            ));
        }
        Ok(())
    }

    /// The engine's memory configuration.
    pub fn config(&self) -> MemoryConfig {
        MemoryConfig {
            enabled: self.enabled,
            max_outcomes: self.max_outcomes,
            max_age: (self.max_age_days > 0.0)
                .then(|| Duration::from_secs_f64(self.max_age_days * 86_400.0)),
            threshold: self.threshold,
            policy: PolicyConfig {
                confidence: self.confidence,
                min_failures: self.min_failures,
                budget: self.budget,
                spacing: self.spacing,
            },
        }
    }
}
