//! The daemon's configuration file (docs/config.md): the TOML sections `[server]`, `[engine]`,
//! `[pool]`, `[limits]`, `[state]`, `[cluster]` and the others of docs/config.md, where the file is looked for, and the
//! `PYVISOR_<SECTION>__<KEY>` environment overrides applied on top of it.
//!
//! Loading reads the first file of the search order into a `toml::Table`, writes the
//! environment overrides into that table (each parsed as the type of the key's default), and
//! deserializes the result once, so a value from a file and one from the environment pass the
//! same checks. Every error names the key and where its value came from. The resolved helpers
//! ([`Settings::engine_config`], [`Settings::socket_path`], …) turn the plain values into
//! what the engine and the server use.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use pyvisor_actors::checkpoint::{
    DEFAULT_RETENTION, DEFAULT_SESSION_DISK_BYTES, DEFAULT_TOTAL_DISK_BYTES,
};
use pyvisor_actors::pool::PoolConfig;
use pyvisor_actors::session::{AutoCheckpoint, DurabilityMode};
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

use super::EngineConfig;
use crate::errors::ConfigError;

mod cluster;
mod limits;
mod llm;
mod memory;
mod overrides;
mod proactive;
mod sandbox;
mod search;
mod server;
pub use cluster::ClusterSettings;
pub use limits::{LimitCeilings, LimitSettings};
pub use llm::{LlmSettings, ModelSettings};
pub use memory::MemorySettings;
pub use proactive::ProactiveSettings;
pub use sandbox::SandboxSettings;
pub use server::{ServerSettings, TokenSettings};

use overrides::apply_overrides;
use search::{find_file, parse_file};

/// The variable that names a config file, second in the search order.
const CONFIG_VAR: &str = "PYVISOR_CONFIG";

/// Keys checked against each other: an error names the first, and is blamed on the second's
/// origin when only the second was set.
const RELATED_KEYS: &[(&str, &str)] = &[("pool.max_idle", "pool.min_idle")];

/// The longest duration a setting may ask for (ten years): longer ones would overflow
/// deadlines computed from it.
const MAX_SECONDS: f64 = 315_360_000.0;

/// The whole daemon configuration, as read from TOML.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub server: ServerSettings,
    pub engine: EngineSettings,
    pub pool: PoolSettings,
    pub limits: LimitSettings,
    pub state: StateSettings,
    pub proactive: ProactiveSettings,
    pub sandbox: SandboxSettings,
    pub memory: MemorySettings,
    pub llm: LlmSettings,
    pub cluster: ClusterSettings,
}

/// `[engine]`: how workers are started (see [`EngineConfig`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSettings {
    /// Python interpreter of the workers: a name on `PATH` or a path.
    pub python: String,
    /// Modules every worker imports before it counts as ready.
    pub preload: Vec<String>,
    /// Fork workers from a zygote that has `preload` imported.
    pub zygote: bool,
    /// Threads that host session actors; 0 for min(cores, 4).
    pub arbiters: usize,
    /// Contain each worker in a cgroup leaf when the host allows it.
    pub use_cgroups: bool,
    /// Where the worker package is installed; empty for `$XDG_CACHE_HOME/pyvisor`.
    pub cache_dir: PathBuf,
    /// How long a new worker may take to become ready, in seconds.
    pub handshake_timeout_s: f64,
}

impl Default for EngineSettings {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Self {
            python: engine.python,
            preload: engine.preload,
            zygote: engine.zygote,
            arbiters: 0,
            use_cgroups: engine.use_cgroups,
            cache_dir: PathBuf::new(),
            handshake_timeout_s: engine.handshake_timeout.as_secs_f64(),
        }
    }
}

/// `[pool]`: the ready workers (see [`PoolConfig`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSettings {
    /// Ready workers kept waiting for a session.
    pub min_idle: usize,
    /// Most ready workers kept.
    pub max_idle: usize,
    /// Most worker processes at once: idle, starting and in use.
    pub max_total: usize,
    /// Idle workers older than this many seconds are ended, down to `min_idle`.
    pub idle_ttl_s: f64,
    /// How long a create waits for room under `max_total`, in seconds.
    pub acquire_timeout_s: f64,
}

impl Default for PoolSettings {
    fn default() -> Self {
        let pool = PoolConfig::default();
        Self {
            min_idle: pool.min_idle,
            max_idle: pool.max_idle,
            max_total: pool.max_total,
            idle_ttl_s: pool.idle_ttl.as_secs_f64(),
            acquire_timeout_s: pool.acquire_timeout.as_secs_f64(),
        }
    }
}

/// `[state]`: checkpoints (see [`crate::StateConfig`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateSettings {
    /// Keep checkpoints at all.
    pub enabled: bool,
    /// The state directory; empty for `$XDG_STATE_HOME/pyvisor`, else
    /// `~/.local/state/pyvisor`.
    pub dir: PathBuf,
    /// Checkpoints kept per session.
    pub retention: usize,
    /// Largest state one checkpoint of a session may hold, in bytes; 0 for the session's
    /// memory limit.
    pub max_bytes: u64,
    /// What one session's checkpoints may take on disk, in MiB.
    pub session_disk_mb: u64,
    /// What the checkpoints of all sessions may take on disk, in MiB.
    pub total_disk_mb: u64,
    /// Checkpoint after this many executions that may have changed the namespace; 0 for no
    /// automatic checkpoints.
    pub auto_after_changes: u32,
    /// At most one automatic checkpoint per this many seconds.
    pub auto_min_interval_s: f64,
    /// When a result that changed the namespace is sent: at once, checkpointed by the
    /// automatic policy afterwards (`debounced`), or after its checkpoint (`reply`).
    pub durability: DurabilityMode,
}

impl Default for StateSettings {
    fn default() -> Self {
        let auto = AutoCheckpoint::default();
        Self {
            enabled: true,
            dir: PathBuf::new(),
            retention: DEFAULT_RETENTION.get(),
            max_bytes: 0,
            session_disk_mb: DEFAULT_SESSION_DISK_BYTES >> 20,
            total_disk_mb: DEFAULT_TOTAL_DISK_BYTES >> 20,
            auto_after_changes: auto.after_changes,
            auto_min_interval_s: auto.min_interval.as_secs_f64(),
            durability: DurabilityMode::Debounced,
        }
    }
}

/// Settings as loaded, with where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub settings: Settings,
    /// The file read; `None` when no file was found and the built-in defaults apply.
    pub source: Option<PathBuf>,
    /// The `PYVISOR_<SECTION>__<KEY>` variables applied on top, in name order.
    pub overrides: Vec<String>,
}

/// Where a setting's value came from, as named in errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A config file.
    File(PathBuf),
    /// An environment variable.
    Env(String),
    /// The built-in default.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(path) => write!(f, "{}", path.display()),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::Default => f.write_str("built-in default"),
        }
    }
}

/// What loading reads from the process, so that tests can give their own.
#[derive(Debug, Clone)]
pub struct LoadContext {
    /// Environment variables: `PYVISOR_CONFIG`, `XDG_CONFIG_HOME`, `HOME` and the overrides.
    pub vars: BTreeMap<String, OsString>,
    /// The directory `./pyvisor.toml` is looked for in, and relative paths start from.
    pub cwd: PathBuf,
    /// The system-wide file, last in the search order.
    pub system_file: PathBuf,
}

impl LoadContext {
    /// The process's environment and working directory, and `/etc/pyvisor/config.toml`.
    pub fn from_process() -> Self {
        Self {
            // A variable whose name is not UTF-8 cannot be one of ours.
            vars: std::env::vars_os()
                .filter_map(|(name, value)| Some((name.into_string().ok()?, value)))
                .collect(),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            system_file: PathBuf::from("/etc/pyvisor/config.toml"),
        }
    }
}

impl Settings {
    /// Loads the settings: `explicit` (`--config`) or the first file of the search order,
    /// then the environment overrides, all validated.
    pub fn load(explicit: Option<&Path>) -> Result<Loaded, ConfigError> {
        Self::load_with(explicit, &LoadContext::from_process())
    }

    /// [`Settings::load`] against a given environment, working directory and system file.
    pub fn load_with(explicit: Option<&Path>, ctx: &LoadContext) -> Result<Loaded, ConfigError> {
        let schema = default_table();
        let mut origins = BTreeMap::new();
        let (mut table, source) = match find_file(explicit, ctx)? {
            Some((path, text)) => {
                let table = parse_file(&path, &text)?;
                let origin = Origin::File(path.clone());
                check_keys(&table, &schema, &origin)?;
                for (section, keys) in &table {
                    for key in keys.as_table().into_iter().flat_map(Table::keys) {
                        origins.insert(format!("{section}.{key}"), origin.clone());
                    }
                }
                (table, Some(path))
            }
            None => (Table::new(), None),
        };
        let overrides = apply_overrides(&mut table, &schema, ctx, &mut origins)?;
        let settings = deserialize(table, &origins)?;
        settings.validate().map_err(|(key, message)| {
            // A rule between two keys is blamed on the one the user set, if only one was.
            let related = RELATED_KEYS
                .iter()
                .find(|(first, _)| *first == key)
                .map(|(_, second)| *second);
            // A key of a nested table was set with its table.
            let set_with = |key: &str| {
                std::iter::successors(Some(key), |key| key.rsplit_once('.').map(|(up, _)| up))
                    .find_map(|key| origins.get(key))
            };
            let origin = [Some(key), related]
                .into_iter()
                .flatten()
                .find_map(set_with)
                .cloned()
                .unwrap_or(Origin::Default);
            ConfigError::Invalid {
                origin,
                key: key.to_owned(),
                message,
            }
        })?;
        Ok(Loaded {
            settings,
            source,
            overrides,
        })
    }

    /// Checks the ranges that types do not: the key at fault and what is wrong with it.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let Self {
            server,
            engine,
            pool,
            limits,
            state,
            proactive,
            sandbox,
            memory,
            llm,
            cluster,
        } = self;
        if !server.http.is_empty() && super::resolve::http_addr(&server.http).is_none() {
            return Err((
                "server.http",
                format!(
                    "expected an address such as 127.0.0.1:8787 or a port, got `{}`",
                    server.http
                ),
            ));
        }
        server.validate()?;
        if engine.python.is_empty() {
            return Err(("engine.python", "must not be empty".into()));
        }
        if engine.preload.iter().any(|module| module.trim().is_empty()) {
            return Err(("engine.preload", "must not hold empty module names".into()));
        }
        seconds(
            "engine.handshake_timeout_s",
            engine.handshake_timeout_s,
            false,
        )?;
        if pool.max_idle < pool.min_idle {
            return Err((
                "pool.max_idle",
                format!(
                    "must be at least pool.min_idle ({}), got {}",
                    pool.min_idle, pool.max_idle
                ),
            ));
        }
        at_least("pool.max_total", pool.max_total, 1)?;
        seconds("pool.idle_ttl_s", pool.idle_ttl_s, false)?;
        seconds("pool.acquire_timeout_s", pool.acquire_timeout_s, false)?;
        limits.validate()?;
        at_least("state.retention", state.retention, 1)?;
        at_least("state.session_disk_mb", state.session_disk_mb as usize, 1)?;
        at_least("state.total_disk_mb", state.total_disk_mb as usize, 1)?;
        seconds("state.auto_min_interval_s", state.auto_min_interval_s, true)?;
        proactive.validate()?;
        sandbox.validate()?;
        memory.validate()?;
        llm.validate()?;
        cluster.validate()?;
        Ok(())
    }
}

/// Checks a number of seconds: finite, not above [`MAX_SECONDS`], positive or (with
/// `zero_ok`) zero.
fn seconds(key: &'static str, value: f64, zero_ok: bool) -> Result<(), (&'static str, String)> {
    let low_ok = if zero_ok { value >= 0.0 } else { value > 0.0 };
    if low_ok && value <= MAX_SECONDS {
        return Ok(());
    }
    let low = if zero_ok { "0 or more" } else { "more than 0" };
    Err((
        key,
        format!("must be {low} seconds and at most {MAX_SECONDS}, got {value}"),
    ))
}

/// Checks that `value` is an `http://` or `https://` URL.
fn http_url(key: &'static str, value: &str) -> Result<(), (&'static str, String)> {
    let scheme = value.split("://").next().unwrap_or_default();
    if matches!(scheme, "http" | "https") && value.contains("://") {
        Ok(())
    } else {
        Err((
            key,
            format!("must be an http:// or https:// URL, got {value:?}"),
        ))
    }
}

/// Checks a count against its minimum.
fn at_least(key: &'static str, value: usize, min: usize) -> Result<(), (&'static str, String)> {
    if value >= min {
        Ok(())
    } else {
        Err((key, format!("must be at least {min}, got {value}")))
    }
}

/// The built-in defaults as a table: the keys that exist and the type of each.
fn default_table() -> Table {
    Table::try_from(Settings::default()).expect("the default settings are representable in TOML")
}

/// Tables that are absent by default (`None`), so the defaults do not name them: serde
/// checks their keys.
const OPTIONAL_TABLES: &[(&str, &str)] =
    &[("memory", "embedder"), ("llm", "prices"), ("llm", "models")];

/// Fails on a section or key that no setting has, or a section that is not a table.
fn check_keys(table: &Table, schema: &Table, origin: &Origin) -> Result<(), ConfigError> {
    for (section, value) in table {
        let Some(known) = schema.get(section).and_then(Value::as_table) else {
            return Err(ConfigError::UnknownKey {
                origin: origin.clone(),
                key: section.clone(),
            });
        };
        let Some(keys) = value.as_table() else {
            return Err(ConfigError::Invalid {
                origin: origin.clone(),
                key: section.clone(),
                message: format!("expected a table [{section}], got {}", value.type_str()),
            });
        };
        let optional = |key: &str| OPTIONAL_TABLES.contains(&(section.as_str(), key));
        if let Some(key) = keys
            .keys()
            .find(|key| !known.contains_key(*key) && !optional(key))
        {
            return Err(ConfigError::UnknownKey {
                origin: origin.clone(),
                key: format!("{section}.{key}"),
            });
        }
    }
    Ok(())
}

/// Deserializes the merged table; a type error names its key and where the value came from.
fn deserialize(table: Table, origins: &BTreeMap<String, Origin>) -> Result<Settings, ConfigError> {
    let whole = match Settings::deserialize(Value::Table(table.clone())) {
        Ok(settings) => return Ok(settings),
        Err(err) => err,
    };
    // Every field deserializes on its own, so the key at fault is the one that fails alone.
    for (section, keys) in &table {
        for (key, value) in keys.as_table().into_iter().flatten() {
            let one = Table::from_iter([(
                section.clone(),
                Value::Table(Table::from_iter([(key.clone(), value.clone())])),
            )]);
            if let Err(err) = Settings::deserialize(Value::Table(one)) {
                let name = format!("{section}.{key}");
                return Err(ConfigError::Invalid {
                    origin: origins.get(&name).cloned().unwrap_or(Origin::Default),
                    key: name,
                    message: err.message().to_owned(),
                });
            }
        }
    }
    Err(ConfigError::Invalid {
        origin: Origin::Default,
        key: "settings".into(),
        message: whole.message().to_owned(),
    })
}

#[cfg(test)]
mod tests;
