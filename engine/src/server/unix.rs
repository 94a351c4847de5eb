//! The Unix-socket listener of `pyvisor serve`: creates the socket (mode 0600, in a
//! directory created 0700, refusing one that another user could tamper with), refuses to take over a socket another daemon still answers on,
//! replaces a stale one, and serves each accepted connection up to `max_connections`.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::stat::{umask, Mode};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::connection::serve_connection;
use crate::errors::ServeError;
use crate::rpc::{self, Dispatcher, RpcError};

/// A bound socket, removed from the file system when dropped.
pub struct UnixServer {
    listener: UnixListener,
    path: PathBuf,
}

impl UnixServer {
    /// Binds `path`: creates missing parent directories with mode 0700, removes a stale
    /// socket file, and makes the socket 0600.
    pub async fn bind(path: &Path) -> Result<UnixServer, ServeError> {
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
        Ok(UnixServer {
            listener,
            path: path.to_owned(),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts connections until `shutdown` turns true, then waits for the open
    /// connections to finish (they stop reading at the same signal).
    pub async fn serve(
        &self,
        dispatcher: Arc<Dispatcher>,
        max_request_bytes: usize,
        max_connections: usize,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let slots = Arc::new(Semaphore::new(max_connections));
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
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                connections.spawn(refuse(stream, max_connections));
                continue;
            };
            let dispatcher = dispatcher.clone();
            let shutdown = shutdown.clone();
            connections.spawn(async move {
                let (reader, writer) = stream.into_split();
                serve_connection(
                    dispatcher,
                    BufReader::new(reader),
                    writer,
                    max_request_bytes,
                    shutdown,
                )
                .await;
                drop(slot);
            });
        }
        while connections.join_next().await.is_some() {}
    }
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

/// Tells a connection over the limit why it is closed.
async fn refuse(mut stream: UnixStream, max_connections: usize) {
    let error = RpcError::new(
        rpc::code::ENGINE_ERROR,
        format!("too many connections: the server holds at most {max_connections}"),
    );
    let mut line = rpc::error_text(&serde_json::Value::Null, error);
    line.push('\n');
    let _ = stream.write_all(line.as_bytes()).await;
    let _ = stream.shutdown().await;
}
