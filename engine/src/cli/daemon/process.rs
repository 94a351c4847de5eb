//! Is the process a PID file names our daemon, and the signals `daemon stop` sends it.
//!
//! A pid alone proves nothing: the daemon may have died and the number been given to another
//! program. A process counts as our daemon only when `/proc/<pid>/cmdline` reads
//! `pyvisor … serve …`; anything else is "not ours" and is never signalled.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgid, Pid};
use pyvisor_actors::worker::is_running;

/// What a pid names right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// A running `pyvisor serve`.
    Daemon,
    /// A running process that is not a pyvisor daemon (the pid was reused).
    Other,
    /// No process, or one that has exited and waits to be reaped.
    Gone,
}

/// What `pid` names: our daemon, another program, or nothing.
pub fn state(pid: Pid, our_exe: Option<&Path>) -> State {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        // An exited process (a zombie) has an empty command line; so has a kernel thread.
        Ok(cmdline) if cmdline.is_empty() => {
            if !is_running(pid.as_raw() as u32) {
                State::Gone
            } else {
                State::Other
            }
        }
        Ok(cmdline) if is_daemon_cmdline(&cmdline, our_exe) => State::Daemon,
        Ok(_) => State::Other,
        // /proc/<pid> vanished, or is hidden from us: then it is no process we may signal.
        Err(_) if kill(pid, None) == Err(Errno::ESRCH) => State::Gone,
        Err(_) => State::Other,
    }
}

/// Whether a `/proc/<pid>/cmdline` (NUL-separated arguments) is `pyvisor serve`: the
/// program's file name is `pyvisor` or that of `our_exe`, and its first argument that is not
/// an option is `serve`.
pub fn is_daemon_cmdline(cmdline: &[u8], our_exe: Option<&Path>) -> bool {
    let mut args = cmdline
        .split(|&byte| byte == 0)
        .map(String::from_utf8_lossy);
    let Some(program) = args.next() else {
        return false;
    };
    let name = Path::new(program.as_ref()).file_name();
    let ours = our_exe.and_then(Path::file_name);
    if name.is_none() || (name != Some("pyvisor".as_ref()) && name != ours) {
        return false;
    }
    args.find(|arg| !arg.starts_with('-'))
        .is_some_and(|command| command == "serve")
}

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

/// Waits until `pid` is no longer our daemon, up to `limit`; whether it went.
pub async fn wait_gone(pid: Pid, our_exe: Option<&Path>, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if state(pid, our_exe) != State::Daemon {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmdline(args: &[&str]) -> Vec<u8> {
        let mut bytes = args.join("\0").into_bytes();
        bytes.push(0);
        bytes
    }

    #[test]
    fn pyvisor_serve_is_our_daemon() {
        let yes = |args: &[&str]| is_daemon_cmdline(&cmdline(args), None);
        assert!(yes(&["/usr/local/bin/pyvisor", "serve"]));
        assert!(yes(&[
            "pyvisor",
            "serve",
            "--config",
            "/etc/pyvisor/config.toml"
        ]));
        assert!(yes(&[
            "/opt/bin/pyvisor",
            "serve",
            "--socket",
            "/tmp/s.sock"
        ]));
    }

    #[test]
    fn other_programs_and_commands_are_not() {
        let no = |args: &[&str]| !is_daemon_cmdline(&cmdline(args), None);
        assert!(no(&["sleep", "30"]));
        assert!(no(&[
            "/usr/bin/python3",
            "-I",
            "-u",
            "/cache/pyvisor/worker-0123456789abcdef"
        ]));
        assert!(no(&["pyvisor", "exec", "serve"]));
        assert!(no(&["pyvisor", "daemon", "start"]));
        assert!(no(&["pyvisor"]));
        assert!(no(&["/usr/bin/pyvisor-serve", "serve"]));
        assert!(no(&["vim", "pyvisor", "serve"]));
        assert!(!is_daemon_cmdline(b"", None));
        assert!(!is_daemon_cmdline(b"\0", None));
    }

    #[test]
    fn a_renamed_binary_counts_when_it_is_this_one() {
        let args = cmdline(&["/opt/pv/pyvisor-0.1", "serve"]);
        assert!(!is_daemon_cmdline(&args, None));
        assert!(is_daemon_cmdline(
            &args,
            Some(Path::new("/somewhere/else/pyvisor-0.1"))
        ));
    }

    #[test]
    fn this_test_process_and_a_dead_pid_are_not_daemons() {
        let me = Pid::from_raw(std::process::id() as i32);
        assert_eq!(state(me, None), State::Other);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        child.wait().unwrap();
        assert_eq!(state(pid, None), State::Gone);
    }

    #[test]
    fn an_unreaped_child_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_running(pid.as_raw() as u32) {
            assert!(Instant::now() < deadline, "`true` never exited");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(state(pid, None), State::Gone);
        child.wait().unwrap();
    }
}
