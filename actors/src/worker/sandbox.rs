//! The host's side of worker confinement: the engine-wide [`Sandbox`] policy, the uid each
//! worker leases from its range, the worker's private directories, and the [`SandboxPlan`]
//! the worker applies to itself (pyworker/pyvisor_worker/sandbox.py) before any session code
//! runs.
//!
//! A uid is leased to one live worker at a time, on the whole machine: every engine claims
//! the uids it leases with a lock on a file of its own in [`UID_CLAIMS_DIR`], so two daemons
//! (or two engines in one process) given the same range never give one uid to two sessions.
//! The kernel drops a dead engine's claims; the next engine to claim such a uid kills what
//! still runs under it first. A claim given back is unlocked explicitly, not by closing its
//! file: a child the engine forks holds a copy of every descriptor until its exec, and a lock
//! left to the last close would outlive its release by that window. When the worker ends, every process still running under its uid
//! is killed (a short-lived helper becomes that uid and signals -1) before the uid goes back
//! to the free set, so that no survivor of one session shares a uid with the next.
//!
//! The worker's directories (`work`, the default working directory, and `tmp`, its TMPDIR,
//! HOME and MPLCONFIGDIR) are 0700 and owned by its uid, and are removed with it.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::RangeInclusive;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pyvisor_protocol::SandboxPlan;

use crate::errors::SpawnError;

/// Where every engine on the machine claims the worker uids it leases (root's, 0700).
pub const UID_CLAIMS_DIR: &str = "/run/pyvisor-uids";

/// Rounds of `kill(-1, SIGKILL)` at most when a uid is swept: until none is left, with
/// zombies (still signalable until reaped) bounding it.
const SWEEP_ROUNDS: usize = 64;

/// Which layers confine the workers of an engine, and where their directories go.
#[derive(Debug)]
pub struct Sandbox {
    uids: Option<UidPool>,
    /// Restrict file access with Landlock.
    pub landlock: bool,
    /// Install the seccomp filter.
    pub seccomp: bool,
    /// Where each worker's private directory is made (created 0711: entered, not listed).
    dirs: PathBuf,
    /// Readable by every worker besides the system paths (the worker package is added).
    read: Vec<PathBuf>,
    /// Readable and writable by every worker besides its own directory.
    write: Vec<PathBuf>,
    next_dir: AtomicU64,
}

/// What a [`Sandbox`] is made of.
#[derive(Debug, Clone, Default)]
pub struct SandboxSetup {
    /// Give every worker its own uid from this range (gid = uid); requires root.
    pub uid_range: Option<RangeInclusive<u32>>,
    /// Where the uids are claimed machine-wide ([`UID_CLAIMS_DIR`] but in tests).
    pub uid_claims: PathBuf,
    pub landlock: bool,
    pub seccomp: bool,
    /// Where the workers' private directories are made.
    pub dirs: PathBuf,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
}

impl Sandbox {
    /// The policy of `setup`; creates its directory for worker directories.
    pub fn new(setup: SandboxSetup) -> io::Result<Sandbox> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&setup.dirs)?;
        let uids = match setup.uid_range {
            Some(range) => Some(UidPool::new(range, setup.uid_claims)?),
            None => None,
        };
        Ok(Sandbox {
            uids,
            landlock: setup.landlock,
            seccomp: setup.seccomp,
            dirs: setup.dirs,
            read: setup.read,
            write: setup.write,
            next_dir: AtomicU64::new(1),
        })
    }

    /// Leases a uid and makes the directories of one worker that runs `script`, in `cwd`
    /// when given (used as is), else in its own work directory. `None` when no layer is on
    /// and the worker may use the network: such a worker is not confined at all. Without
    /// the network, the seccomp filter is always installed (it refuses the sockets).
    /// Whether every worker gets a uid of its own.
    pub fn separates_uids(&self) -> bool {
        self.uids.is_some()
    }

    pub(crate) fn prepare(
        self: &Arc<Self>,
        script: &Path,
        cwd: Option<&Path>,
        network: bool,
    ) -> Result<Option<Confinement>, SpawnError> {
        if self.uids.is_none() && !self.landlock && !self.seccomp && network {
            return Ok(None);
        }
        let uid = match &self.uids {
            Some(pool) => Some(pool.lease()?),
            None => None,
        };
        let root = self.dirs.join(format!(
            "w-{}",
            self.next_dir.fetch_add(1, Ordering::Relaxed)
        ));
        // Built first, so that a failure below returns the uid and removes what was made.
        let mut confinement = Confinement {
            sandbox: self.clone(),
            uid,
            root: root.clone(),
            plan: None,
        };
        make_worker_dirs(&root, uid).map_err(|source| SpawnError::Sandbox {
            reason: format!("create {}: {source}", root.display()),
        })?;
        let text = |path: &Path| path.to_string_lossy().into_owned();
        let mut read: Vec<String> = self.read.iter().map(|p| text(p)).collect();
        read.push(text(script));
        let mut write: Vec<String> = self.write.iter().map(|p| text(p)).collect();
        write.push(text(&root));
        write.extend(cwd.map(text));
        let work = root.join("work");
        confinement.plan = Some(SandboxPlan {
            uid,
            network,
            landlock: self.landlock,
            seccomp: self.seccomp || !network,
            read,
            write,
            cwd: Some(text(cwd.unwrap_or(&work))),
        });
        Ok(Some(confinement))
    }
}

/// Creates `root` with `work` and `tmp` in it, all 0700 and owned by `uid` when given.
fn make_worker_dirs(root: &Path, uid: Option<u32>) -> io::Result<()> {
    for dir in [root.to_path_buf(), root.join("work"), root.join("tmp")] {
        DirBuilder::new().mode(0o700).create(&dir)?;
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&dir, Some(uid), Some(uid))?;
        }
    }
    Ok(())
}

/// One worker's share of the sandbox: its uid lease, its directories and its plan. Dropping
/// it, once the worker is dead, kills whatever still runs under the uid, removes the
/// directories and frees the uid.
#[derive(Debug)]
pub struct Confinement {
    sandbox: Arc<Sandbox>,
    uid: Option<u32>,
    root: PathBuf,
    plan: Option<SandboxPlan>,
}

impl Confinement {
    /// The uid the worker runs as, when it has its own.
    pub fn uid(&self) -> Option<u32> {
        self.uid
    }

    /// Whether the worker cannot read the checkpoint store (a uid of its own, or Landlock):
    /// a restore must hand it copies of the blobs, in [`Self::checkpoint_dir`].
    pub fn cannot_read_the_store(&self) -> bool {
        self.uid.is_some() || self.plan.as_ref().is_some_and(|plan| plan.landlock)
    }

    /// The worker's working directory: the client's `cwd`, else its own `work` directory.
    pub fn work_dir(&self) -> Option<&str> {
        self.plan.as_ref()?.cwd.as_deref()
    }

    /// The plan the worker applies to itself.
    pub(crate) fn plan(&self) -> Option<&SandboxPlan> {
        self.plan.as_ref()
    }

    /// The worker's private temp dir, as TMPDIR, HOME and MPLCONFIGDIR.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let tmp = self.root.join("tmp").to_string_lossy().into_owned();
        ["TMPDIR", "HOME", "MPLCONFIGDIR"]
            .into_iter()
            .map(|name| (name.to_owned(), tmp.clone()))
            .collect()
    }

    /// Where the worker's checkpoints are written: a directory of its own that it can
    /// write, on the same file system as the checkpoint store's scratch directory.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.root.clone()
    }
}

impl Drop for Confinement {
    fn drop(&mut self) {
        if let Some(uid) = self.uid {
            if let Err(err) = kill_every_process_of(uid) {
                // The uid stays leased: a survivor must never share it with the next worker.
                tracing::error!(uid, error = %err, "cannot sweep a worker uid; it is retired");
                let _ = fs::remove_dir_all(&self.root);
                return;
            }
        }
        let _ = fs::remove_dir_all(&self.root);
        if let (Some(uid), Some(pool)) = (self.uid, &self.sandbox.uids) {
            pool.release(uid);
        }
    }
}

/// The kernel's Landlock ABI version; `None` without Landlock (or with it disabled).
pub fn landlock_abi() -> Option<u32> {
    const CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with the VERSION flag the syscall reads no memory and returns a number.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(abi).ok().filter(|abi| *abi > 0)
}

/// Whether the kernel filters syscalls with seccomp (its status line exists).
pub fn seccomp_available() -> bool {
    fs::read_to_string("/proc/self/status")
        .is_ok_and(|status| status.lines().any(|line| line.starts_with("Seccomp:")))
}

/// Checks that `uid` can run `python` on the worker package `script` (every directory on
/// the way must be open to it): the interpreter starts and imports the package's sandbox
/// module as that uid. The error says why not.
pub fn probe_uid(python: &Path, script: &Path, uid: u32) -> Result<(), String> {
    use std::os::unix::process::CommandExt;

    let import = "import sys; sys.path.insert(0, sys.argv[1]); import pyvisor_worker.sandbox";
    let output = std::process::Command::new(python)
        .args(["-I", "-B", "-c", import])
        .arg(script)
        .env_clear()
        .current_dir("/")
        .uid(uid)
        .gid(uid)
        .output()
        .map_err(|err| format!("run {} as uid {uid}: {err}", python.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{} cannot run the worker package {} as uid {uid} ({}): {}",
        python.display(),
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// The uids of a range not leased to a live worker, and the claims on the ones that are.
#[derive(Debug)]
struct UidPool {
    range: RangeInclusive<u32>,
    claims: PathBuf,
    state: Mutex<UidLeases>,
}

#[derive(Debug, Default)]
struct UidLeases {
    /// Not leased by this engine (another may hold some: its claim says so).
    free: BTreeSet<u32>,
    /// The claim of each uid leased.
    held: HashMap<u32, UidClaim>,
}

impl UidPool {
    /// The pool of `range`, claiming in `claims` (made 0700 if missing).
    fn new(range: RangeInclusive<u32>, claims: PathBuf) -> io::Result<UidPool> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&claims)
            .map_err(|err| {
                io::Error::new(err.kind(), format!("create {}: {err}", claims.display()))
            })?;
        Ok(UidPool {
            state: Mutex::new(UidLeases {
                free: range.clone().collect(),
                held: HashMap::new(),
            }),
            range,
            claims,
        })
    }

    /// The lowest uid of the range no engine on the machine holds, claimed. A uid whose last
    /// holder died without giving it back is swept before it is handed out.
    fn lease(&self) -> Result<u32, SpawnError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut claimed = None;
        for &uid in &state.free {
            if let Some(claim) = self.claim(uid)? {
                claimed = Some((uid, claim));
                break;
            }
        }
        let (uid, claim) = claimed.ok_or(SpawnError::UidsExhausted {
            first: *self.range.start(),
            last: *self.range.end(),
        })?;
        state.free.remove(&uid);
        state.held.insert(uid, claim);
        Ok(uid)
    }

    /// Locks `uid`'s claim file; `None` when another engine holds it. The file holds the
    /// holder's pid while it is held, and is emptied when the uid is given back, so a file
    /// found not empty is a dead holder's: its survivors are killed first.
    fn claim(&self, uid: u32) -> Result<Option<UidClaim>, SpawnError> {
        let path = self.claims.join(uid.to_string());
        let failed = |err: io::Error| SpawnError::Sandbox {
            reason: format!("claim uid {uid} in {}: {err}", path.display()),
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(failed)?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EWOULDBLOCK) => Ok(None),
                _ => Err(failed(err)),
            };
        }
        let mut claim = UidClaim(file);
        let mut previous = String::new();
        claim.0.read_to_string(&mut previous).map_err(failed)?;
        if !previous.is_empty() {
            kill_every_process_of(uid).map_err(failed)?;
        }
        claim.0.set_len(0).map_err(failed)?;
        claim
            .0
            .write_all(std::process::id().to_string().as_bytes())
            .map_err(failed)?;
        Ok(Some(claim))
    }

    /// Gives `uid` back, its processes swept: its claim is emptied and unlocked.
    fn release(&self, uid: u32) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(claim) = state.held.remove(&uid) {
            if let Err(err) = claim.0.set_len(0) {
                tracing::warn!(uid, error = %err, "cannot empty a uid claim; its next holder sweeps it");
            }
        }
        state.free.insert(uid);
    }
}

/// A locked claim file. Dropping it unlocks the lock itself (`LOCK_UN` acts on the open file
/// description, whoever else holds a copy of the descriptor), so the uid is free to every
/// engine the moment it is given back or its pool is dropped.
#[derive(Debug)]
struct UidClaim(File);

impl Drop for UidClaim {
    fn drop(&mut self) {
        // SAFETY: flock on the descriptor this claim owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Kills every process running as `uid`: a forked helper takes the uid and sends SIGKILL to
/// every process it may signal (which, as that uid, are exactly the uid's), until none is
/// left or [`SWEEP_ROUNDS`] have passed.
pub(crate) fn kill_every_process_of(uid: u32) -> io::Result<()> {
    // SAFETY: the child makes raw syscalls only and leaves through _exit, as a fork of a
    // multithreaded process must.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(uid, uid, uid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                libc::_exit(2);
            }
            for _ in 0..SWEEP_ROUNDS {
                // ESRCH: nothing of the uid is left (kill(-1) spares the caller).
                if libc::kill(-1, libc::SIGKILL) != 0 {
                    libc::_exit(0);
                }
                libc::sched_yield();
            }
            libc::_exit(0)
        },
        pid => {
            let mut status = 0;
            // SAFETY: waiting for the child just forked.
            while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
            if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "the sweeper of uid {uid} failed (wait status {status})"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_is_leased_once_and_the_range_runs_out_with_a_typed_error() {
        let claims = tempfile::tempdir().unwrap();
        let pool = UidPool::new(61_990..=61_991, claims.path().into()).unwrap();
        let (a, b) = (pool.lease().unwrap(), pool.lease().unwrap());
        assert_ne!(a, b);
        let err = pool.lease().unwrap_err();
        assert!(matches!(
            err,
            SpawnError::UidsExhausted {
                first: 61_990,
                last: 61_991
            }
        ));
        pool.release(a);
        assert_eq!(pool.lease().unwrap(), a);
    }

    #[test]
    fn two_engines_with_one_range_never_lease_the_same_uid() {
        let claims = tempfile::tempdir().unwrap();
        let first = UidPool::new(61_980..=61_982, claims.path().into()).unwrap();
        let second = UidPool::new(61_980..=61_982, claims.path().into()).unwrap();
        let (a, b) = (first.lease().unwrap(), second.lease().unwrap());
        let c = first.lease().unwrap();
        assert_eq!((a, b, c), (61_980, 61_981, 61_982));
        assert!(matches!(
            second.lease(),
            Err(SpawnError::UidsExhausted { .. })
        ));
        // A uid given back is free for the other engine at once, even while a child that
        // another test of this process forks holds a copy of the claim's descriptor; a
        // dropped engine's claims go with it.
        first.release(a);
        assert_eq!(second.lease().unwrap(), a);
        drop(first);
        assert_eq!(second.lease().unwrap(), 61_982);
    }

    #[test]
    fn a_uid_given_back_is_free_while_a_forked_child_holds_its_claims_descriptor() {
        let claims = tempfile::tempdir().unwrap();
        let pool = UidPool::new(61_970..=61_970, claims.path().into()).unwrap();
        let uid = pool.lease().unwrap();
        // SAFETY: the child only sleeps and leaves through _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe {
                libc::sleep(30);
                libc::_exit(0);
            }
        }
        assert!(child > 0, "fork: {}", io::Error::last_os_error());
        pool.release(uid);
        let again = pool.lease();
        // SAFETY: the child forked above, killed and reaped.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert_eq!(again.unwrap(), uid);
    }
}
