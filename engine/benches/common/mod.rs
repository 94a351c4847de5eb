//! What the engine's bench binaries share: order statistics of their samples.

use std::time::Duration;

/// `samples` in ascending order, for [`quantile`].
pub fn sorted(mut samples: Vec<Duration>) -> Vec<Duration> {
    samples.sort();
    samples
}

/// The `q` quantile (0 to 1) of `sorted` samples, by nearest rank below.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}
