//! The limits a client gets: the operator's defaults with what `session.create` asks for on
//! top, each checked against the operator's ceilings (`[limits.max]`, see
//! [`LimitCeilings`]), and the `timeout_s` of one execution under the same ceiling.

use std::time::Duration;

use pyvisor_actors::SessionLimits;

use super::errors::RpcError;
use super::wire::LimitParams;
use crate::config::LimitCeilings;

/// The shortest timeout a client may ask for: anything shorter could not even reach the
/// worker.
const MIN_TIMEOUT_S: f64 = 0.001;
/// The smallest memory limit a Python worker starts under.
const MIN_MEMORY_MB: u64 = 32;
/// The fewest descriptors a worker needs: its protocol pipes, output pipes and a few files.
const MIN_OPEN_FILES: u64 = 16;
/// The fewest processes and threads a worker needs (its main and control threads).
const MIN_PROCESSES: u64 = 2;

/// Defaults and ceilings of every session's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitPolicy {
    pub defaults: SessionLimits,
    pub ceilings: LimitCeilings,
}

impl From<SessionLimits> for LimitPolicy {
    /// `defaults` under the default ceilings.
    fn from(defaults: SessionLimits) -> Self {
        Self {
            defaults,
            ceilings: LimitCeilings::default(),
        }
    }
}

impl LimitPolicy {
    /// The defaults with `params` applied; `-32602` naming the field when one is nonsense or
    /// above its ceiling.
    pub fn session_limits(&self, params: &LimitParams) -> Result<SessionLimits, RpcError> {
        let mut limits = self.defaults.clone();
        let kernel = [
            (
                "memory_mb",
                params.memory_mb,
                MIN_MEMORY_MB,
                &mut limits.memory_mb,
            ),
            ("cpu_s", params.cpu_s, 1, &mut limits.cpu_s),
            (
                "open_files",
                params.open_files,
                MIN_OPEN_FILES,
                &mut limits.open_files,
            ),
            (
                "processes",
                params.processes,
                MIN_PROCESSES,
                &mut limits.processes,
            ),
        ];
        for (field, asked, least, limit) in kernel {
            let Some(asked) = asked else { continue };
            // 0 asks for no limit at all.
            let asked = (asked > 0).then_some(asked);
            if let Some(value) = asked.filter(|&value| value < least) {
                return Err(invalid(format!(
                    "{field}: {value} is below the least a worker runs with, {least} (0 means no limit)"
                )));
            }
            self.ceilings
                .of(field)
                .check(asked.map(|value| value as f64))
                .map_err(invalid)?;
            *limit = asked;
        }
        if let Some(file_bytes) = params.file_bytes {
            limits.file_bytes = self.positive("file_bytes", file_bytes)?;
        }
        if let Some(disk_mb) = params.disk_mb {
            // 0 asks for no bound, like the kernel limits.
            let asked = (disk_mb > 0).then_some(disk_mb);
            self.ceilings
                .of("disk_mb")
                .check(asked.map(|mb| mb as f64))
                .map_err(invalid)?;
            limits.disk_mb = asked;
        }
        if let Some(timeout_s) = params.timeout_s {
            limits.timeout = self.timeout("limits.timeout_s", timeout_s)?;
        }
        if let Some(output_bytes) = params.output_bytes {
            let output_bytes = self.positive("output_bytes", output_bytes as u64)?;
            limits.output_bytes = usize::try_from(output_bytes).unwrap_or(usize::MAX);
        }
        Ok(limits)
    }

    /// `value` of `field`, which must be at least 1 and within its ceiling.
    fn positive(&self, field: &'static str, value: u64) -> Result<u64, RpcError> {
        if value == 0 {
            return Err(invalid(format!("{field}: must be at least 1")));
        }
        self.ceilings
            .of(field)
            .check(Some(value as f64))
            .map_err(invalid)?;
        Ok(value)
    }

    /// The `timeout_s` of one execution (`field` names it in errors), within the ceiling.
    pub fn timeout(&self, field: &str, seconds: f64) -> Result<Duration, RpcError> {
        let duration = Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|_| seconds >= MIN_TIMEOUT_S);
        let Some(duration) = duration else {
            return Err(RpcError::invalid_params(format!(
                "{field}: expected a number of seconds from {MIN_TIMEOUT_S}, got {seconds}"
            )));
        };
        if let Some(ceiling) = self.ceilings.of("timeout_s").ceiling {
            if seconds > ceiling {
                return Err(RpcError::invalid_params(format!(
                    "{field}: {seconds} is above the ceiling limits.max.timeout_s = {ceiling}"
                )));
            }
        }
        Ok(duration)
    }
}

/// A `-32602` about a field of `limits`.
fn invalid(message: String) -> RpcError {
    RpcError::invalid_params(format!("limits.{message}"))
}
