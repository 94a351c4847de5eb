//! Per-session limits enforced by the host (SPEC.md §1 defaults).

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
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            output_bytes: 10 * 1024 * 1024,
            result_repr_bytes: 64 * 1024,
            input_timeout: Duration::from_secs(300),
            interrupt_grace: Duration::from_secs(2),
        }
    }
}
