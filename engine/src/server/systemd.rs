//! The systemd side of `pyvisor serve` (`Type=notify`): `READY=1` once the pool is warm,
//! `STOPPING=1` when a graceful stop begins, `RELOADING=1` around a reload, and watchdog
//! pings while the engine answers. Outside systemd (`NOTIFY_SOCKET` unset) these do nothing.

use std::time::Duration;

use sd_notify::NotifyState;

/// Tells systemd the service is ready.
pub fn ready() {
    notify(&[NotifyState::Ready]);
}

/// Tells systemd a graceful stop has begun.
pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}

/// Tells systemd a reload has begun; [`ready`] ends it.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// Pings the watchdog.
pub fn watchdog() {
    notify(&[NotifyState::Watchdog]);
}

/// How often to ping the watchdog: half the interval systemd asked for, if it asked.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|interval| interval / 2)
}

fn notify(states: &[NotifyState]) {
    if let Err(err) = sd_notify::notify(states) {
        tracing::warn!(error = %err, "failed to notify systemd");
    }
}
