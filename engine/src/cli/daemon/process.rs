//! The signals `daemon stop` sends the daemon. Only the pid written by the live holder of the
//! PID file's lock is ever signalled (see `pidfile`).

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgid, Pid};
use pyvisor_actors::worker::is_running;

/// Asks the daemon to stop gracefully.
pub fn terminate(pid: Pid) -> nix::Result<()> {
    kill(pid, Signal::SIGTERM)
}

/// SIGKILLs the daemon and, when it leads its own process group (as `daemon start` makes it
/// do), everything in that group. Its workers run in process groups of their own; the
/// engine's janitor ends those once the daemon is gone.
pub fn kill_group(pid: Pid) -> nix::Result<()> {
    if getpgid(Some(pid)) == Ok(pid) {
        killpg(pid, Signal::SIGKILL)
    } else {
        kill(pid, Signal::SIGKILL)
    }
}

/// Waits, at most `within`, until process `pid` has finished exiting. Its PID file's lock is
/// released when the kernel closes its files, a moment before the process is gone: `stop`
/// reports a daemon stopped only once it is.
pub async fn wait_gone(pid: Pid, within: Duration) {
    let deadline = Instant::now() + within;
    while is_running(pid.as_raw() as u32) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
