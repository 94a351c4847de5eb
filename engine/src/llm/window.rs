//! [`BatchWindow`]: the `[llm] batch_window_ms` of the bridges. The first call after a
//! window closed opens one; every call waits until the open window closes, so the calls
//! made within it go out together.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One batch window, shared by the calls it gathers.
#[derive(Debug)]
pub struct BatchWindow {
    length: Duration,
    /// When the open window closes.
    ends: Mutex<Option<Instant>>,
}

impl BatchWindow {
    /// Windows of `length`; a zero length lets every call go at once.
    pub fn new(length: Duration) -> Self {
        Self {
            length,
            ends: Mutex::new(None),
        }
    }

    /// Waits until the open window closes, opening one if none is.
    pub async fn wait(&self) {
        if self.length.is_zero() {
            return;
        }
        let now = Instant::now();
        let ends = {
            let mut open = self.ends.lock().unwrap_or_else(|e| e.into_inner());
            match *open {
                Some(ends) if ends > now => ends,
                _ => *open.insert(now + self.length),
            }
        };
        tokio::time::sleep_until(ends.into()).await;
    }
}
