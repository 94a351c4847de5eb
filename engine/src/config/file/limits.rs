//! `[limits]`: the default limits of every session (see [`SessionLimits`]), what one owner may
//! hold, and `[limits.max]`, the operator's ceilings on the limits a client may ask for.
//!
//! 0 means "no limit" for `memory_mb`, `cpu_s`, `open_files` and `processes`, both as a
//! default and in `session.create`; 0 as a ceiling means "no ceiling" for that field. A
//! default above its own ceiling is a configuration error, so a client that asks for nothing
//! always gets limits it could have asked for.

use serde::{Deserialize, Serialize};

use pyvisor_actors::SessionLimits;

use super::{at_least, seconds};

/// `[limits]` as read from TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitSettings {
    /// Memory of the worker and its children, in MiB.
    pub memory_mb: u64,
    /// Wall-clock limit of one execution, in seconds.
    pub timeout_s: f64,
    /// CPU seconds over the worker's lifetime.
    pub cpu_s: u64,
    /// Open file descriptors of the worker.
    pub open_files: u64,
    /// Processes and threads of the session.
    pub processes: u64,
    /// Bytes of stdout+stderr kept per execution.
    pub output_bytes: usize,
    /// Largest file the files API writes into a session's work directory.
    pub file_bytes: u64,
    /// Most MiB of files a session's work directory may hold after a files API write; 0: none.
    pub disk_mb: u64,
    /// Longest repr of a final expression returned.
    pub result_repr_bytes: usize,
    /// How long `input()` waits for an answer, in seconds.
    pub input_timeout_s: f64,
    /// How long interrupted code may take to stop before the worker is killed, in seconds.
    pub interrupt_grace_s: f64,
    /// Live sessions one owner may hold at once; 0 for no bound.
    pub max_sessions_per_owner: usize,
    /// Checkpoint and close a session after this many seconds without an execution; 0 never.
    pub idle_timeout_s: f64,
    /// `[limits.max]`: the most a client may ask for.
    pub max: LimitCeilings,
}

impl Default for LimitSettings {
    fn default() -> Self {
        let limits = SessionLimits::default();
        Self {
            memory_mb: limits.memory_mb.unwrap_or(0),
            timeout_s: limits.timeout.as_secs_f64(),
            cpu_s: limits.cpu_s.unwrap_or(0),
            open_files: limits.open_files.unwrap_or(0),
            processes: limits.processes.unwrap_or(0),
            output_bytes: limits.output_bytes,
            file_bytes: limits.file_bytes,
            disk_mb: limits.disk_mb.unwrap_or(0),
            result_repr_bytes: limits.result_repr_bytes,
            input_timeout_s: limits.input_timeout.as_secs_f64(),
            interrupt_grace_s: limits.interrupt_grace.as_secs_f64(),
            max_sessions_per_owner: 0,
            idle_timeout_s: 0.0,
            max: LimitCeilings::default(),
        }
    }
}

/// `[limits.max]`: ceilings on the per-session limits of `session.create` (and on the
/// `timeout_s` of `session.execute`); 0 leaves a field without a ceiling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitCeilings {
    pub memory_mb: u64,
    pub cpu_s: u64,
    pub open_files: u64,
    pub processes: u64,
    pub timeout_s: f64,
    /// Output is held in the daemon's memory until the reply is written: this bounds it.
    pub output_bytes: usize,
    pub file_bytes: u64,
    pub disk_mb: u64,
}

impl Default for LimitCeilings {
    fn default() -> Self {
        Self {
            memory_mb: 32 * 1024,
            // No CPU limit by default, so no ceiling either.
            cpu_s: 0,
            open_files: 65_536,
            processes: 4_096,
            timeout_s: 86_400.0,
            output_bytes: 64 * 1024 * 1024,
            file_bytes: 1024 * 1024 * 1024,
            disk_mb: 16 * 1024,
        }
    }
}

/// One limit against its ceiling, for messages and checks alike.
pub struct Bounded {
    /// The key under `limits.` (and `limits.max.`).
    pub field: &'static str,
    /// The ceiling; `None` when there is none.
    pub ceiling: Option<f64>,
}

impl Bounded {
    /// Checks `value` (`None`: no limit) against the ceiling: the message names the field and
    /// the ceiling.
    pub fn check(&self, value: Option<f64>) -> Result<(), String> {
        let Some(ceiling) = self.ceiling else {
            return Ok(());
        };
        let field = self.field;
        match value {
            None => Err(format!(
                "{field}: 0 (no limit) is above the ceiling limits.max.{field} = {ceiling}"
            )),
            Some(value) if value > ceiling => Err(format!(
                "{field}: {value} is above the ceiling limits.max.{field} = {ceiling}"
            )),
            Some(_) => Ok(()),
        }
    }
}

impl LimitCeilings {
    /// The ceiling of `field` (one of the keys of `[limits.max]`).
    pub fn of(&self, field: &'static str) -> Bounded {
        let ceiling = match field {
            "memory_mb" => self.memory_mb as f64,
            "cpu_s" => self.cpu_s as f64,
            "open_files" => self.open_files as f64,
            "processes" => self.processes as f64,
            "timeout_s" => self.timeout_s,
            "output_bytes" => self.output_bytes as f64,
            "file_bytes" => self.file_bytes as f64,
            "disk_mb" => self.disk_mb as f64,
            _ => unreachable!("{field} is not a key of [limits.max]"),
        };
        Bounded {
            field,
            ceiling: (ceiling > 0.0).then_some(ceiling),
        }
    }
}

impl LimitSettings {
    /// Checks the ranges that types do not, and every default against its ceiling.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        seconds("limits.timeout_s", self.timeout_s, false)?;
        seconds("limits.input_timeout_s", self.input_timeout_s, false)?;
        seconds("limits.interrupt_grace_s", self.interrupt_grace_s, true)?;
        seconds("limits.idle_timeout_s", self.idle_timeout_s, true)?;
        seconds("limits.max.timeout_s", self.max.timeout_s, true)?;
        at_least("limits.output_bytes", self.output_bytes, 1)?;
        at_least("limits.file_bytes", self.file_bytes as usize, 1)?;
        let none_if_zero = |n: u64| (n > 0).then_some(n as f64);
        let defaults = [
            ("memory_mb", none_if_zero(self.memory_mb)),
            ("cpu_s", none_if_zero(self.cpu_s)),
            ("open_files", none_if_zero(self.open_files)),
            ("processes", none_if_zero(self.processes)),
            ("timeout_s", Some(self.timeout_s)),
            ("output_bytes", Some(self.output_bytes as f64)),
            ("file_bytes", Some(self.file_bytes as f64)),
            ("disk_mb", none_if_zero(self.disk_mb)),
        ];
        for (field, value) in defaults {
            self.max
                .of(field)
                .check(value)
                .map_err(|message| ("limits.max", format!("the default limits.{message}")))?;
        }
        Ok(())
    }
}
