//! The janitor: one small process per engine that ends every worker's process group and
//! empties every worker's cgroup leaf when the engine goes away, even when the host is killed
//! with SIGKILL.
//!
//! `PR_SET_PDEATHSIG` takes care of the workers themselves, but not of processes they
//! started, and a `setsid` or double-forked child leaves the worker's process group too. The
//! janitor runs in its own process group, reads registrations from a pipe whose write end only
//! the host holds: `+PGID`/`-PGID` for process groups, `L+LEAF`/`L-LEAF` for cgroup leaves
//! (`LEAF` is a JSON object naming the leaf's dirs, its v1 `freezer.state` and its v2
//! `cgroup.kill`). On end of input (the host exited, crashed, or dropped the engine) it
//! SIGKILLs every group still registered, then empties each leaf as the engine would (kill
//! file, or freeze, kill each member, thaw, until empty) and removes it.

use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::errors::SpawnError;

const JANITOR_SOURCE: &str = r#"
import json, os, signal, sys, time

def put(path, value):
    try:
        with open(path, 'w') as f:
            f.write(value)
        return True
    except OSError:
        return False

def members(leaf):
    pids = set()
    for d in leaf['dirs']:
        try:
            with open(os.path.join(d, 'cgroup.procs')) as f:
                pids.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            pass
    pids.discard(os.getpid())
    pids.discard(0)
    return pids

def kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

def empty(leaf):
    kill_file, freezer = leaf.get('kill'), leaf.get('freezer')
    if kill_file:
        put(kill_file, '1')
    frozen = bool(freezer) and put(freezer, 'FROZEN')
    until = time.monotonic() + 0.25
    while frozen and time.monotonic() < until:
        try:
            with open(freezer) as f:
                if f.read().strip() == 'FROZEN':
                    break
        except OSError:
            break
        time.sleep(0.005)
    kill(members(leaf))
    if frozen:
        put(freezer, 'THAWED')
    until = time.monotonic() + 1
    while True:
        pids = members(leaf)
        if not pids:
            break
        if time.monotonic() > until:
            return
        if kill_file:
            put(kill_file, '1')
        kill(pids)
        time.sleep(0.005)
    for d in leaf['dirs']:
        for group in (d, os.path.dirname(d)):
            try:
                os.rmdir(group)
            except OSError:
                pass

groups, leaves = set(), set()
for line in sys.stdin:
    line = line.rstrip('\n')
    if line.startswith('L'):
        (leaves.add if line[1:2] == '+' else leaves.discard)(line[2:])
        continue
    try:
        pgid = int(line[1:])
    except ValueError:
        continue
    if line.startswith('+'):
        groups.add(pgid)
    else:
        groups.discard(pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
for text in leaves:
    try:
        empty(json.loads(text))
    except (ValueError, KeyError, TypeError):
        pass
"#;

/// Handle on the engine's janitor process.
#[derive(Debug)]
pub struct Janitor {
    child: Child,
    registrations: Mutex<Option<ChildStdin>>,
}

impl Janitor {
    /// Starts the janitor with `python` (the resolved interpreter).
    pub fn start(python: &Path) -> Result<Janitor, SpawnError> {
        let mut child = Command::new(python)
            .args(["-I", "-S", "-c", JANITOR_SOURCE])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|source| SpawnError::Spawn {
                python: python.to_path_buf(),
                source,
            })?;
        let stdin = child.stdin.take().expect("stdin is piped");
        // A stuck janitor must never block an actor: a full pipe drops the registration.
        let flags = fcntl(&stdin, FcntlArg::F_GETFL).map_err(io_error)?;
        fcntl(
            &stdin,
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
        )
        .map_err(io_error)?;
        Ok(Janitor {
            child,
            registrations: Mutex::new(Some(stdin)),
        })
    }

    /// Asks the janitor to end process group `pgid` if the engine goes away.
    pub fn register(&self, pgid: u32) {
        self.send(&format!("+{pgid}\n"));
    }

    /// The group has ended normally; the janitor forgets it.
    pub fn unregister(&self, pgid: u32) {
        self.send(&format!("-{pgid}\n"));
    }

    /// Asks the janitor to empty and remove the cgroup leaf `leaf` (its JSON description)
    /// if the engine goes away.
    pub(crate) fn register_leaf(&self, leaf: &str) {
        self.send(&format!("L+{leaf}\n"));
    }

    /// The leaf is empty and removed; the janitor forgets it.
    pub(crate) fn unregister_leaf(&self, leaf: &str) {
        self.send(&format!("L-{leaf}\n"));
    }

    fn send(&self, line: &str) {
        if let Ok(mut guard) = self.registrations.lock() {
            if let Some(stdin) = guard.as_mut() {
                if let Err(err) = stdin.write_all(line.as_bytes()) {
                    tracing::warn!(error = %err, "janitor registration lost");
                }
            }
        }
    }
}

#[cfg(test)]
impl Janitor {
    /// Closes the registration pipe as a dying host would, while registrations stand.
    pub(crate) fn hang_up(&self) {
        if let Ok(mut guard) = self.registrations.lock() {
            guard.take();
        }
    }
}

fn io_error(errno: nix::errno::Errno) -> SpawnError {
    SpawnError::Pipe(io::Error::from(errno))
}

impl Drop for Janitor {
    fn drop(&mut self) {
        // End of input: the janitor kills what is still registered and exits.
        if let Ok(mut guard) = self.registrations.lock() {
            guard.take();
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn python() -> std::path::PathBuf {
        crate::worker::resolve_interpreter("python3").unwrap()
    }

    fn spawn_group() -> Child {
        Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    #[test]
    fn kills_registered_groups_when_the_engine_goes_away() {
        let janitor = Janitor::start(&python()).unwrap();
        let mut registered = spawn_group();
        let mut forgotten = spawn_group();
        janitor.register(registered.id());
        janitor.register(forgotten.id());
        janitor.unregister(forgotten.id());
        drop(janitor);
        let status = registered.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "the registered group was killed"
        );
        // The janitor has exited (the drop waited for it), so whatever it killed has its
        // SIGKILL already: a SIGTERM of ours decides how the unregistered one ends only if
        // the janitor left it alone.
        let pid = nix::unistd::Pid::from_raw(forgotten.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = forgotten.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGTERM),
            "an unregistered group is left alone"
        );
    }
}
