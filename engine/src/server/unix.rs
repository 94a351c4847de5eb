//! The Unix-socket listener of `pyvisor serve`: creates the socket (mode 0600, in a
//! directory created 0700, refusing one that another user could tamper with; 0660 and
//! group-traversable 0710 with `server.socket_group`), refuses to take over a socket another
//! daemon still answers on, replaces a stale one, and serves each accepted connection up to
//! `max_connections`.
//!
//! Who the caller is comes from the peer's credentials (`SO_PEERCRED`) at accept: root, the
//! daemon's own user and `server.admin_uids` are admins; any other uid is the owner named
//! after its user name (`uid:<n>` without a passwd entry); a uid of the workers' range is
//! refused.

use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::stat::{umask, Mode};
use nix::unistd::{Gid, Uid, User};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::connection::serve_connection;
use super::connection_threads::ConnectionThreads;
use crate::errors::ServeError;
use crate::rpc::{self, Caller, Dispatcher, RpcError};

/// Who may use the socket, and as whom.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketAccess {
    /// Admins besides root and the daemon's own user (`server.admin_uids`).
    pub admin_uids: Vec<u32>,
    /// The group whose members may connect (`server.socket_group`): the socket becomes 0660
    /// with this group, its directory 0710. `None` keeps both private to the daemon's user.
    pub group: Option<u32>,
    /// Uids refused at accept: the workers' (`[sandbox] uid_range`), so that session code
    /// never reaches the engine.
    pub refused_uids: Option<RangeInclusive<u32>>,
}

impl SocketAccess {
    /// The caller a peer with `uid` is, or `None` when it is refused.
    pub fn caller(&self, uid: u32) -> Option<Caller> {
        if self
            .refused_uids
            .as_ref()
            .is_some_and(|range| range.contains(&uid))
        {
            return None;
        }
        if uid == 0 || uid == Uid::effective().as_raw() || self.admin_uids.contains(&uid) {
            return Some(Caller::admin());
        }
        Some(Caller::owner(owner_name(uid)))
    }
}

/// The owner a non-admin uid is: its user name, or `uid:<n>` when it has none.
fn owner_name(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => format!("uid:{uid}"),
    }
}

/// A bound socket, removed from the file system when dropped.
pub struct UnixServer {
    listener: UnixListener,
    path: PathBuf,
}

impl UnixServer {
    /// Binds `path`: creates missing parent directories with mode 0700, removes a stale
    /// socket file, and makes the socket 0600; with a `group`, the socket is 0660 and its
    /// directory 0710, both of that group.
    pub async fn bind(path: &Path, group: Option<u32>) -> Result<UnixServer, ServeError> {
        let fail = |source: io::Error| ServeError::Socket {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(fail)?;
            check_directory(dir).map_err(fail)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                if UnixStream::connect(path).await.is_ok() {
                    return Err(ServeError::InUse {
                        path: path.to_owned(),
                    });
                }
                tracing::info!(path = %path.display(), "removing a stale socket");
                std::fs::remove_file(path).map_err(fail)?;
            }
            Ok(_) => {
                return Err(fail(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the path exists and is not a socket",
                )))
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(fail(err)),
        }
        // Bind under a umask that leaves the socket 0600 from its first moment.
        let previous = umask(Mode::from_bits_truncate(0o177));
        let bound = UnixListener::bind(path);
        umask(previous);
        let listener = bound.map_err(fail)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
        let server = UnixServer {
            listener,
            path: path.to_owned(),
        };
        if let Some(gid) = group {
            share_with_group(path, gid).map_err(fail)?;
        }
        Ok(server)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts connections until `shutdown` turns true, then waits for the open
    /// connections to finish (they stop reading at the same signal). Each connection's
    /// caller comes from its peer's credentials through `access`.
    pub async fn serve(
        &self,
        dispatcher: Arc<Dispatcher>,
        access: Arc<SocketAccess>,
        max_request_bytes: usize,
        max_connections: usize,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let slots = Arc::new(Semaphore::new(max_connections));
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
        let threads = match ConnectionThreads::start(threads) {
            Ok(threads) => threads,
            Err(err) => {
                tracing::error!(error = %err, "could not start the connection threads");
                return;
            }
        };
        let mut connections = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            while connections.try_join_next().is_some() {}
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let uid = match stream.peer_cred() {
                Ok(credentials) => credentials.uid(),
                Err(err) => {
                    tracing::warn!(error = %err, "no peer credentials; connection refused");
                    continue;
                }
            };
            let Some(caller) = access.caller(uid) else {
                tracing::warn!(uid, "refused a connection from a worker uid");
                connections.spawn(refuse(stream, refused_uid(uid)));
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                connections.spawn(refuse(stream, too_many(max_connections)));
                continue;
            };
            // The stream leaves this runtime's reactor for the connection thread's.
            let stream = match stream.into_std() {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, "could not hand a connection over; closed");
                    continue;
                }
            };
            let dispatcher = dispatcher.clone();
            let shutdown = shutdown.clone();
            let connection = threads.next_runtime().spawn(async move {
                let stream = match UnixStream::from_std(stream) {
                    Ok(stream) => stream,
                    Err(err) => {
                        tracing::warn!(error = %err, "could not take a connection over; closed");
                        return;
                    }
                };
                let (reader, writer) = stream.into_split();
                serve_connection(
                    dispatcher,
                    caller,
                    reader,
                    writer,
                    max_request_bytes,
                    shutdown,
                )
                .await;
                drop(slot);
            });
            connections.spawn(async move {
                let _ = connection.await;
            });
        }
        while connections.join_next().await.is_some() {}
        drop(threads);
    }
}

/// Opens the socket `path` to the group `gid`: the socket 0660, its directory 0710 (enough
/// to reach the socket, not to list or change the directory).
fn share_with_group(path: &Path, gid: u32) -> io::Result<()> {
    let gid = Gid::from_raw(gid);
    nix::unistd::chown(path, None, Some(gid)).map_err(io::Error::from)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        nix::unistd::chown(dir, None, Some(gid)).map_err(io::Error::from)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))?;
    }
    Ok(())
}

/// The error a worker uid gets before its connection is closed.
fn refused_uid(uid: u32) -> RpcError {
    RpcError::new(
        rpc::code::UNAUTHORIZED,
        format!("unauthorized: uid {uid} runs session code and may not use the engine socket"),
    )
}

/// The error a connection over the limit gets before it is closed.
fn too_many(max_connections: usize) -> RpcError {
    RpcError::new(
        rpc::code::ENGINE_ERROR,
        format!("too many connections: the server holds at most {max_connections}"),
    )
}

impl Drop for UnixServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Refuses a directory where someone else could replace the socket: one owned by another
/// user (root aside), or writable by everyone without the sticky bit.
fn check_directory(dir: &Path) -> io::Result<()> {
    let meta = std::fs::metadata(dir)?;
    let owner = meta.uid();
    if owner != 0 && owner != nix::unistd::geteuid().as_raw() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} belongs to another user (uid {owner})", dir.display()),
        ));
    }
    let mode = meta.mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is writable by every user", dir.display()),
        ));
    }
    Ok(())
}

/// Tells a refused connection why it is closed.
async fn refuse(mut stream: UnixStream, error: RpcError) {
    let mut line = rpc::error_text(&serde_json::Value::Null, error);
    line.push('\n');
    let _ = stream.write_all(line.as_bytes()).await;
    let _ = stream.shutdown().await;
}
