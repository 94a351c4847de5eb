//! `[proactive]`: computing ahead of sessions' requests (see [`ProactiveConfig`]).

use serde::{Deserialize, Serialize};

use crate::config::ProactiveConfig;

/// `[proactive]` as read from TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProactiveSettings {
    /// Whether sessions are proactive unless `session.create` says otherwise.
    pub enabled: bool,
    /// Share of one core that speculation may use, for the whole engine (0 to 1).
    pub cpu_budget: f64,
    /// Bytes of speculative answers held at most, for the whole engine.
    pub cache_bytes: u64,
    /// Start no speculation while foreground work waits for a CPU.
    pub yield_to_load: bool,
}

impl Default for ProactiveSettings {
    fn default() -> Self {
        let defaults = ProactiveConfig::default();
        Self {
            enabled: defaults.enabled,
            cpu_budget: defaults.cpu_budget,
            cache_bytes: defaults.cache_bytes,
            yield_to_load: defaults.yield_to_load,
        }
    }
}

impl ProactiveSettings {
    /// Checks the ranges that types do not.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.cpu_budget) {
            return Err((
                "proactive.cpu_budget",
                format!(
                    "must be a share of one core from 0 to 1, got {}",
                    self.cpu_budget
                ),
            ));
        }
        Ok(())
    }

    /// The engine's proactive configuration.
    pub fn config(&self) -> ProactiveConfig {
        ProactiveConfig {
            enabled: self.enabled,
            cpu_budget: self.cpu_budget,
            cache_bytes: self.cache_bytes,
            yield_to_load: self.yield_to_load,
        }
    }
}
