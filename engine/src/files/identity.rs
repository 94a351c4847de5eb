//! The thread a files API call runs on. With uid separation the engine is root and each
//! session has a uid of its own: the thread takes that uid (and gid) as its file-system
//! identity and drops its supplementary groups before it touches the work directory, so the
//! kernel checks every access as it would for the session's code, and what it creates belongs
//! to the session. Credentials are per thread on Linux (the raw syscalls, not the libc
//! wrappers that change every thread), and the thread is used for one call only and then
//! ends, so no other work ever runs with them.

use std::thread;

use nix::unistd::{setfsgid, setfsuid, Gid, Uid};
use tokio::sync::oneshot;

use super::FileError;

/// Runs `job` on a thread of its own, as `uid`'s file-system identity when given.
pub(super) async fn on_own_thread<T: Send + 'static>(
    uid: Option<u32>,
    job: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, FileError> {
    let (done_tx, done_rx) = oneshot::channel();
    thread::Builder::new()
        .name("pyvisor-files".into())
        .spawn(move || {
            let result = match uid.map(act_as).transpose() {
                Ok(_) => job(),
                Err(err) => Err(err),
            };
            let _ = done_tx.send(result);
        })
        .map_err(|source| FileError::Io {
            path: String::new(),
            source,
        })?;
    done_rx.await.unwrap_or_else(|_| {
        Err(FileError::Io {
            path: String::new(),
            source: std::io::Error::other("the files thread ended without an answer"),
        })
    })
}

/// Makes the calling thread's file-system identity `uid`:`uid` with no supplementary groups.
fn act_as(uid: u32) -> Result<(), FileError> {
    let failed = |what: &str| FileError::Io {
        path: String::new(),
        source: std::io::Error::other(format!("act as the session's uid {uid}: {what}")),
    };
    // SAFETY: the raw syscall changes this thread's groups only and reads no memory (size 0).
    let dropped = unsafe { libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<u32>()) };
    if dropped != 0 {
        return Err(failed(&std::io::Error::last_os_error().to_string()));
    }
    setfsgid(Gid::from_raw(uid));
    setfsuid(Uid::from_raw(uid));
    // Each call returns the identity before it: asking again tells whether the change held.
    if setfsgid(Gid::from_raw(uid)) != Gid::from_raw(uid)
        || setfsuid(Uid::from_raw(uid)) != Uid::from_raw(uid)
    {
        return Err(failed("the kernel refused the file-system ids"));
    }
    Ok(())
}
