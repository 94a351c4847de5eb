//! The uids workers lease from the sandbox's range, machine-wide: [`UidPool`] claims each uid
//! it leases with a lock on a file of its own in the claims directory, so two engines given the
//! same range never lease one uid twice; [`UidLease`] is one leased uid, shared by a worker and
//! its clones of `session.fork` (they keep its uid), and swept and given back when the last of
//! them lets go of it.
//!
//! The kernel drops a dead engine's claims; the next engine to claim such a uid kills what
//! still runs under it first. A claim given back is unlocked explicitly, not by closing its
//! file: a child the engine forks holds a copy of every descriptor until its exec, and a lock
//! left to the last close would outlive its release by that window.

use std::collections::{BTreeSet, HashMap};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::RangeInclusive;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::errors::SpawnError;

/// Rounds of `kill(-1, SIGKILL)` at most when a uid is swept: until none is left, with
/// zombies (still signalable until reaped) bounding it.
const SWEEP_ROUNDS: usize = 64;

/// One uid leased from a [`UidPool`]. Dropping the last holder kills every process still
/// running under the uid, then gives it back; a uid that cannot be swept stays leased.
#[derive(Debug)]
pub(crate) struct UidLease {
    pool: Arc<UidPool>,
    uid: u32,
}

impl UidLease {
    /// The uid leased.
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        if let Err(err) = kill_every_process_of(self.uid) {
            // The uid stays leased: a survivor must never share it with the next worker.
            tracing::error!(uid = self.uid, error = %err, "cannot sweep a worker uid; it is retired");
            return;
        }
        self.pool.release(self.uid);
    }
}

/// The uids of a range not leased to a live worker, and the claims on the ones that are.
#[derive(Debug)]
pub(crate) struct UidPool {
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
    pub(crate) fn new(range: RangeInclusive<u32>, claims: PathBuf) -> io::Result<UidPool> {
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
    pub(crate) fn lease(self: &Arc<Self>) -> Result<UidLease, SpawnError> {
        self.lease_uid().map(|uid| UidLease {
            pool: self.clone(),
            uid,
        })
    }

    /// The lowest uid of the range no engine holds, claimed (see [`Self::lease`]).
    fn lease_uid(&self) -> Result<u32, SpawnError> {
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
        let (a, b) = (pool.lease_uid().unwrap(), pool.lease_uid().unwrap());
        assert_ne!(a, b);
        let err = pool.lease_uid().unwrap_err();
        assert!(matches!(
            err,
            SpawnError::UidsExhausted {
                first: 61_990,
                last: 61_991
            }
        ));
        pool.release(a);
        assert_eq!(pool.lease_uid().unwrap(), a);
    }

    #[test]
    fn two_engines_with_one_range_never_lease_the_same_uid() {
        let claims = tempfile::tempdir().unwrap();
        let first = UidPool::new(61_980..=61_982, claims.path().into()).unwrap();
        let second = UidPool::new(61_980..=61_982, claims.path().into()).unwrap();
        let (a, b) = (first.lease_uid().unwrap(), second.lease_uid().unwrap());
        let c = first.lease_uid().unwrap();
        assert_eq!((a, b, c), (61_980, 61_981, 61_982));
        assert!(matches!(
            second.lease_uid(),
            Err(SpawnError::UidsExhausted { .. })
        ));
        // A uid given back is free for the other engine at once, even while a child that
        // another test of this process forks holds a copy of the claim's descriptor; a
        // dropped engine's claims go with it.
        first.release(a);
        assert_eq!(second.lease_uid().unwrap(), a);
        drop(first);
        assert_eq!(second.lease_uid().unwrap(), 61_982);
    }

    #[test]
    fn a_uid_given_back_is_free_while_a_forked_child_holds_its_claims_descriptor() {
        let claims = tempfile::tempdir().unwrap();
        let pool = UidPool::new(61_970..=61_970, claims.path().into()).unwrap();
        let uid = pool.lease_uid().unwrap();
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
        let again = pool.lease_uid();
        // SAFETY: the child forked above, killed and reaped.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert_eq!(again.unwrap(), uid);
    }
}
