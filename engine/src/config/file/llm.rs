//! `[llm]`: the OpenAI-compatible chat completions endpoint of the bridge and the task loops
//! (see [`LlmConfig`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ClientLlmConfig, LlmConfig, Price, RlmConfig};

/// `[llm]` as read from TOML. An empty `base_url` leaves the engine without an LLM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmSettings {
    /// The API's base URL; requests go to `{base_url}/chat/completions`. Empty: no LLM.
    pub base_url: String,
    /// The model of calls that name none.
    pub model: String,
    /// The engine's environment variable holding the API key (never the key itself); empty
    /// for none.
    pub api_key_env: String,
    /// Longest wait for one attempt of one call, in seconds.
    pub timeout_s: f64,
    /// Attempts after the first on 429, 5xx or an unreachable endpoint.
    pub max_retries: u32,
    /// Whether sessions that do not say get `llm_query` and its kin.
    pub sessions: bool,
    /// Bridge calls arriving within this many milliseconds of the first go out together.
    pub batch_window_ms: u64,
    /// Requests in flight at once, for the whole engine.
    pub max_concurrency: usize,
    /// Requests in flight at once for one session.
    pub session_concurrency: usize,
    /// Most prompts one session may have waiting or in flight.
    pub max_pending: usize,
    /// Longest wait for a client's answer to a call of a session whose client answers
    /// them (`llm: "client"`), in seconds.
    pub client_timeout_s: f64,
    /// `[llm.prices."<model>"] input_per_mtok, output_per_mtok`: dollars per million tokens.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
    /// `[llm.models.<name>] model`: other models that calls may name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelSettings>,
    /// `[llm.rlm]`: the RLM task loop's defaults.
    pub rlm: RlmConfig,
}

/// Checks `[llm.rlm]`'s ranges.
fn validate_rlm(rlm: &RlmConfig) -> Result<(), (&'static str, String)> {
    if !(1..=1000).contains(&rlm.max_iterations) {
        return Err(("llm.rlm.max_iterations", "must be from 1 to 1000".into()));
    }
    if rlm.max_depth > 8 {
        return Err(("llm.rlm.max_depth", "must be at most 8".into()));
    }
    if !(rlm.sub_share > 0.0 && rlm.sub_share <= 1.0) {
        return Err(("llm.rlm.sub_share", "must be above 0 and at most 1".into()));
    }
    if !(rlm.downgrade_below_cost.is_finite() && rlm.downgrade_below_cost >= 0.0) {
        let why = "must be finite and not negative";
        return Err(("llm.rlm.downgrade_below_cost", why.into()));
    }
    if rlm.output_chars < 100 {
        return Err(("llm.rlm.output_chars", "must be at least 100".into()));
    }
    Ok(())
}

/// Checks a wait of `[llm]`: from a millisecond to an hour.
fn wait_seconds(key: &'static str, seconds: f64) -> Result<(), (&'static str, String)> {
    if (0.001..=3600.0).contains(&seconds) {
        return Ok(());
    }
    let why = format!("must be from 0.001 to 3600 seconds, got {seconds}");
    Err((key, why))
}

/// `[llm.models.<name>]` as read from TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// The model id sent to the endpoint.
    pub model: String,
}

impl Default for LlmSettings {
    fn default() -> Self {
        let defaults = LlmConfig::new("", "");
        Self {
            base_url: String::new(),
            model: String::new(),
            api_key_env: String::new(),
            timeout_s: defaults.timeout.as_secs_f64(),
            max_retries: defaults.max_retries,
            sessions: defaults.sessions,
            batch_window_ms: defaults.batch_window.as_millis() as u64,
            max_concurrency: defaults.max_concurrency,
            session_concurrency: defaults.session_concurrency,
            max_pending: defaults.max_pending,
            client_timeout_s: ClientLlmConfig::default().timeout.as_secs_f64(),
            prices: BTreeMap::new(),
            models: BTreeMap::new(),
            rlm: RlmConfig::default(),
        }
    }
}

impl LlmSettings {
    /// Checks the ranges that types do not.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        wait_seconds("llm.client_timeout_s", self.client_timeout_s)?;
        if self.batch_window_ms > 10_000 {
            return Err((
                "llm.batch_window_ms",
                format!("must be at most 10000, got {}", self.batch_window_ms),
            ));
        }
        if self.base_url.is_empty() {
            return Ok(());
        }
        super::http_url("llm.base_url", &self.base_url)?;
        if self.model.trim().is_empty() {
            return Err(("llm.model", "must be set when llm.base_url is".into()));
        }
        wait_seconds("llm.timeout_s", self.timeout_s)?;
        if self.max_retries > 10 {
            return Err((
                "llm.max_retries",
                format!("must be at most 10, got {}", self.max_retries),
            ));
        }
        for (key, value) in [
            ("llm.max_concurrency", self.max_concurrency),
            ("llm.session_concurrency", self.session_concurrency),
            ("llm.max_pending", self.max_pending),
        ] {
            if value == 0 {
                return Err((key, "must be at least 1".into()));
            }
        }
        let bad_price = |price: &Price| {
            [price.input_per_mtok, price.output_per_mtok]
                .iter()
                .any(|dollars| !dollars.is_finite() || *dollars < 0.0)
        };
        if let Some(model) = self.prices.iter().find(|(_, price)| bad_price(price)) {
            return Err((
                "llm.prices",
                format!("{:?}: prices must be finite and not negative", model.0),
            ));
        }
        if let Some((name, _)) = self.models.iter().find(|(_, m)| m.model.trim().is_empty()) {
            return Err(("llm.models", format!("{name:?}: model must not be empty")));
        }
        validate_rlm(&self.rlm)
    }

    /// The client-answered bridge's settings, which need no `base_url`.
    pub fn client_config(&self) -> ClientLlmConfig {
        ClientLlmConfig {
            timeout: Duration::from_secs_f64(self.client_timeout_s),
            batch_window: Duration::from_millis(self.batch_window_ms),
        }
    }

    /// The engine's LLM configuration; `None` without a `base_url`.
    pub fn config(&self) -> Option<LlmConfig> {
        if self.base_url.is_empty() {
            return None;
        }
        Some(LlmConfig {
            base_url: self.base_url.clone(),
            model: self.model.clone(),
            api_key_env: Some(self.api_key_env.clone()).filter(|name| !name.is_empty()),
            timeout: Duration::from_secs_f64(self.timeout_s),
            max_retries: self.max_retries,
            sessions: self.sessions,
            batch_window: Duration::from_millis(self.batch_window_ms),
            max_concurrency: self.max_concurrency,
            session_concurrency: self.session_concurrency,
            max_pending: self.max_pending,
            prices: self.prices.clone(),
            models: (self.models.iter())
                .map(|(name, model)| (name.clone(), model.model.clone()))
                .collect(),
            rlm: self.rlm,
        })
    }
}
