//! `[memory]`: remembering execution outcomes and warning before a known failure repeats
//! (see [`MemoryConfig`]).

use std::time::Duration;

use pyvisor_actors::memory::PolicyConfig;
use serde::{Deserialize, Serialize};

use crate::config::{MemoryConfig, RemoteEmbedderConfig};

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
    /// An OpenAI-compatible embeddings endpoint instead of the local embedder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedder: Option<EmbedderSettings>,
}

/// `[memory.embedder]` as read from TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedderSettings {
    /// The API's base URL; requests go to `{base_url}/embeddings`.
    pub base_url: String,
    pub model: String,
    /// The engine's environment variable holding the API key (never the key itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Vector length to ask for (models that can shorten theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// Longest wait for one request, in milliseconds.
    #[serde(default = "default_embedder_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_embedder_timeout_ms() -> u64 {
    2_000
}

impl EmbedderSettings {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        super::http_url("memory.embedder.base_url", &self.base_url)?;
        if self.model.trim().is_empty() {
            return Err(("memory.embedder.model", "must not be empty".into()));
        }
        if self.api_key_env.as_deref().is_some_and(str::is_empty) {
            return Err((
                "memory.embedder.api_key_env",
                "must name an environment variable".into(),
            ));
        }
        if self.dimensions == Some(0) {
            return Err(("memory.embedder.dimensions", "must be at least 1".into()));
        }
        if !(1..=60_000).contains(&self.timeout_ms) {
            return Err((
                "memory.embedder.timeout_ms",
                format!("must be from 1 to 60000, got {}", self.timeout_ms),
            ));
        }
        Ok(())
    }
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
            embedder: None,
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
        match &self.embedder {
            Some(embedder) => embedder.validate(),
            None => Ok(()),
        }
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
            embedder: self.embedder.as_ref().map(|e| RemoteEmbedderConfig {
                base_url: e.base_url.clone(),
                model: e.model.clone(),
                api_key_env: e.api_key_env.clone(),
                dimensions: e.dimensions,
                timeout: Duration::from_millis(e.timeout_ms),
            }),
            shared: None,
        }
    }
}
