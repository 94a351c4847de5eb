//! Per-session limits (defaults in docs/config.md): what the host enforces itself, and what the
//! kernel enforces on the worker process through rlimits or a cgroup leaf.

use std::time::Duration;

/// Limits that bound what one session may consume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLimits {
    /// Default wall-clock limit of one execution.
    pub timeout: Duration,
    /// Bytes of stdout+stderr kept per execution; the rest is discarded with a marker.
    pub output_bytes: usize,
    /// Longest repr of a final expression returned.
    pub result_repr_bytes: usize,
    /// How long `input()` waits for an answer before raising `EOFError`.
    pub input_timeout: Duration,
    /// How long interrupted code may take to stop before the worker is killed.
    pub interrupt_grace: Duration,
    /// Memory of the worker and its children, in MiB (cgroup `memory.max`, else `RLIMIT_AS`).
    pub memory_mb: Option<u64>,
    /// CPU seconds over the worker's lifetime (`RLIMIT_CPU`); the worker is killed past it.
    pub cpu_s: Option<u64>,
    /// Open file descriptors of the worker (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
    /// Processes and threads of the session (cgroup `pids.max`, else `RLIMIT_NPROC`).
    pub processes: Option<u64>,
    /// Largest file the files API writes into the session's work directory.
    pub file_bytes: u64,
    /// Most MiB of files the work directory may hold after a write through the files API;
    /// no bound when `None`. Session code's own writes are bounded by the file system.
    pub disk_mb: Option<u64>,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            output_bytes: 10 * 1024 * 1024,
            result_repr_bytes: 64 * 1024,
            input_timeout: Duration::from_secs(300),
            interrupt_grace: Duration::from_secs(2),
            memory_mb: Some(2048),
            cpu_s: None,
            open_files: Some(256),
            processes: Some(64),
            file_bytes: 100 * 1024 * 1024,
            disk_mb: Some(1024),
        }
    }
}

/// The kernel-enforced part of [`SessionLimits`], as applied to one worker process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessLimits {
    pub memory_bytes: Option<u64>,
    pub cpu_seconds: Option<u64>,
    pub open_files: Option<u64>,
    pub processes: Option<u64>,
}

impl From<&SessionLimits> for ProcessLimits {
    fn from(limits: &SessionLimits) -> Self {
        Self {
            memory_bytes: limits.memory_mb.map(|mb| mb.saturating_mul(1024 * 1024)),
            cpu_seconds: limits.cpu_s,
            open_files: limits.open_files,
            processes: limits.processes,
        }
    }
}
