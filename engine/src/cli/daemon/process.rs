//! The signals `daemon stop` sends the daemon. Only the pid written by the live holder of the
//! PID file's lock is ever signalled (see `pidfile`).

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgid, Pid};

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
