//! The files of a session's work directory, reached through the engine rather than the
//! session's code (`session.files.*`, the HTTP file routes, [`crate::Session::files`]).
//!
//! The work directory is the one the session's current worker runs in: the client's `cwd`,
//! else the worker's own `work` directory under the sandbox (a session with neither has none
//! here, and the calls say so). Every path is relative to it and resolved safely
//! (`resolve`); the I/O itself (`ops`) runs on a thread of its own that acts as the session's
//! uid when it has one (`identity`). Writes are held to `limits.file_bytes` and
//! `limits.disk_mb`; large files move in chunks ([`Upload`], [`Download`]), never whole.

mod identity;
mod ops;
mod resolve;

use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use nix::errno::Errno;
use pyvisor_actors::session::WorkDir;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

pub use ops::{FileEntry, FileKind, ReadChunk, MAX_LIST_ENTRIES};

use identity::on_own_thread;
use ops::{Upload as Writer, WriteLimits};
use resolve::{open_root, RelPath};

use crate::errors::EngineError;
use crate::session::Session;

/// Most bytes one [`SessionFiles::read`] returns (and its default length).
pub const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes per chunk of a [`Download`].
const CHUNK_BYTES: usize = 256 * 1024;
/// Chunks on their way between a transfer and its thread.
const CHUNKS_IN_FLIGHT: usize = 4;

/// The bytes of a file that a [`Download`] sends, chosen once the file is open and its size
/// known; `None` when the caller's choice cannot be met (an HTTP range past the end).
pub type Window = Box<dyn FnOnce(u64) -> Option<Range<u64>> + Send>;

/// A [`Window`] of the whole file.
pub fn whole_file() -> Window {
    Box::new(|size| Some(0..size))
}

/// Why a files call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FileError {
    /// The path is refused: absolute, `..`, leading out through a symlink, or naming
    /// something that is not what the call needs.
    #[error("path {path:?}: {reason}")]
    BadPath { path: String, reason: String },
    /// Nothing is at the path.
    #[error("path {path:?}: no such file or directory")]
    NotFound { path: String },
    /// A write would make the file larger than `limits.file_bytes`.
    #[error("write {path:?}: {size} bytes is over limits.file_bytes ({limit} bytes)")]
    TooLarge { path: String, size: u64, limit: u64 },
    /// A write would fill the work directory past `limits.disk_mb`.
    #[error(
        "write {path:?}: the work directory would hold more than limits.disk_mb ({limit_mb} MiB)"
    )]
    DiskFull { path: String, limit_mb: u64 },
    /// A directory holds more entries than one listing returns.
    #[error("list {path:?}: more than {limit} entries")]
    TooMany { path: String, limit: usize },
    /// The file system failed.
    #[error("file {path:?}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl FileError {
    fn io(path: &RelPath, source: std::io::Error) -> FileError {
        FileError::Io {
            path: path.given.clone(),
            source,
        }
    }

    /// The error of `errno` for `path`: an escape, a wrong kind or a missing file are the
    /// caller's; anything else is the file system's.
    fn from_errno(path: &str, errno: Errno) -> FileError {
        let reason = match errno {
            Errno::ENOENT => {
                return FileError::NotFound {
                    path: path.to_owned(),
                }
            }
            Errno::EXDEV => "leads out of the session's work directory",
            Errno::ELOOP => "goes through a symlink that leads out of the work directory",
            Errno::ENOTDIR => "a component is not a directory",
            Errno::EISDIR => "is a directory",
            Errno::ENOTEMPTY => "is a directory that is not empty",
            Errno::EEXIST => "exists and is not a directory",
            Errno::EACCES | Errno::EPERM => "permission denied to the session",
            Errno::ENAMETOOLONG => "a component is too long",
            Errno::ENXIO => "is not a regular file",
            other => {
                return FileError::Io {
                    path: path.to_owned(),
                    source: other.into(),
                }
            }
        };
        FileError::BadPath {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }
}

/// The files of one session: [`Session::files`].
#[derive(Debug, Clone)]
pub struct SessionFiles {
    session: Session,
}

impl SessionFiles {
    pub(crate) fn new(session: Session) -> SessionFiles {
        SessionFiles { session }
    }

    /// Runs `job` with the work directory open, on a thread acting as the session's uid.
    /// The future owns what it needs: an upload keeps it after this call returns.
    fn run<T: Send + 'static>(
        &self,
        path: &str,
        job: impl FnOnce(&std::os::fd::OwnedFd, RelPath, &WorkDir) -> Result<T, FileError>
            + Send
            + 'static,
    ) -> impl Future<Output = Result<T, EngineError>> + Send + 'static {
        let session = self.session.clone();
        let path = RelPath::parse(path);
        async move {
            let path = path?;
            let dir = session.work_dir().await?;
            Ok(on_own_thread(dir.uid, move || {
                let root = open_root(&dir.path)?;
                job(&root, path, &dir)
            })
            .await?)
        }
    }

    /// Up to `length` bytes (at most and by default [`MAX_READ_BYTES`]) of the file `path`
    /// from `offset`.
    pub async fn read(
        &self,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<ReadChunk, EngineError> {
        let length = length.unwrap_or(MAX_READ_BYTES);
        if length > MAX_READ_BYTES {
            return Err(FileError::BadPath {
                path: path.to_owned(),
                reason: format!("length: at most {MAX_READ_BYTES} bytes per read, got {length}"),
            }
            .into());
        }
        self.run(path, move |root, path, _| {
            ops::read(root, &path, offset, length)
        })
        .await
    }

    /// Writes `data` to the file `path` (appends with `append`), creating the directories on
    /// the way; the file's size after.
    pub async fn write(&self, path: &str, data: Vec<u8>, append: bool) -> Result<u64, EngineError> {
        self.run(path, move |root, path, dir| {
            let mut writer = Writer::begin(root, path, append, limits(dir))?;
            writer.write(&data)?;
            writer.commit()
        })
        .await
    }

    /// The files and directories in `dir` (`""` for the work directory), by name.
    pub async fn list(&self, dir: &str) -> Result<Vec<FileEntry>, EngineError> {
        self.run(dir, |root, path, _| ops::list(root, &path)).await
    }

    /// Removes the file or empty directory `path`.
    pub async fn remove(&self, path: &str) -> Result<(), EngineError> {
        self.run(path, |root, path, _| ops::remove(root, &path))
            .await
    }

    /// Starts a write of `path` fed in chunks; nothing is in place until [`Upload::finish`],
    /// and an upload dropped before that leaves nothing behind.
    pub async fn upload(&self, path: &str) -> Result<Upload, EngineError> {
        let (chunks_tx, mut chunks) = mpsc::channel::<Vec<u8>>(CHUNKS_IN_FLIGHT);
        let (finish_tx, finish) = oneshot::channel::<()>();
        let (begun_tx, begun) = oneshot::channel();
        let done = self.run(path, move |root, path, dir| {
            let mut writer = Writer::begin(root, path, false, limits(dir))?;
            let _ = begun_tx.send(());
            while let Some(chunk) = chunks.blocking_recv() {
                writer.write(&chunk)?;
            }
            // The sender is gone: finished, or dropped half way (then the writer's drop
            // removes the temporary file).
            match finish.blocking_recv() {
                Ok(()) => writer.commit(),
                Err(_) => Err(FileError::Io {
                    path: String::new(),
                    source: std::io::Error::other("the upload was abandoned"),
                }),
            }
        });
        let mut done: Pin<Box<dyn Future<Output = Result<u64, EngineError>> + Send>> =
            Box::pin(done);
        first_answer(begun, &mut done).await?;
        Ok(Upload {
            chunks: Some(chunks_tx),
            finish: Some(finish_tx),
            done,
        })
    }

    /// Reads the bytes `window` chooses of the file `path` in chunks: its size and the range
    /// chosen, then the bytes.
    pub async fn download(&self, path: &str, window: Window) -> Result<Download, EngineError> {
        let (chunks_tx, chunks) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let (opened_tx, opened) = oneshot::channel();
        let read = self.run(path, move |root, path, _| {
            let (mut file, size) = ops::open_file(root, &path)?;
            let range = window(size);
            let _ = opened_tx.send((size, range.clone()));
            let Some(range) = range else {
                return Ok(());
            };
            let mut file = match file.seek(SeekFrom::Start(range.start)) {
                Ok(_) => file.take(range.end - range.start),
                Err(err) => {
                    let _ = chunks_tx.blocking_send(Err(err));
                    return Ok(());
                }
            };
            loop {
                let chunk = ops::next_chunk(&mut file, CHUNK_BYTES);
                let last = matches!(&chunk, Ok(data) if data.is_empty()) || chunk.is_err();
                if last {
                    if let Err(err) = chunk {
                        let _ = chunks_tx.blocking_send(Err(err));
                    }
                    return Ok(());
                }
                if chunks_tx.blocking_send(chunk).is_err() {
                    return Ok(());
                }
            }
        });
        let mut read = Box::pin(read);
        let (size, range) = first_answer(opened, &mut read).await?;
        // The thread goes on alone; it ends when the download is dropped.
        Ok(Download {
            size,
            range,
            chunks,
        })
    }
}

/// Drives `thread` (the future of a transfer's thread) until the thread's first answer on
/// `first`; the thread's own error when it ended without one.
async fn first_answer<T, R, F>(
    mut first: oneshot::Receiver<T>,
    thread: &mut F,
) -> Result<T, EngineError>
where
    F: Future<Output = Result<R, EngineError>> + Unpin,
{
    let ended = tokio::select! {
        biased;
        answer = &mut first => match answer {
            Ok(answer) => return Ok(answer),
            Err(_) => thread.await,
        },
        ended = &mut *thread => ended,
    };
    // The thread may have answered and ended between two polls: its answer is kept.
    match first.try_recv() {
        Ok(answer) => Ok(answer),
        Err(_) => Err(ended.err().unwrap_or(EngineError::Stopped)),
    }
}

fn limits(dir: &WorkDir) -> WriteLimits {
    WriteLimits {
        file_bytes: dir.file_bytes,
        disk_bytes: dir.disk_bytes,
    }
}

/// A write in chunks ([`SessionFiles::upload`]).
pub struct Upload {
    chunks: Option<mpsc::Sender<Vec<u8>>>,
    finish: Option<oneshot::Sender<()>>,
    /// The writing thread's answer.
    done: Pin<Box<dyn Future<Output = Result<u64, EngineError>> + Send>>,
}

impl Upload {
    /// Writes the next chunk; a refusal (a limit passed) ends the upload.
    pub async fn send(&mut self, chunk: Vec<u8>) -> Result<(), EngineError> {
        let sent = match &self.chunks {
            Some(chunks) => chunks.send(chunk).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        self.chunks = None;
        match (&mut self.done).await {
            Err(err) => Err(err),
            Ok(_) => Err(EngineError::Stopped),
        }
    }

    /// Puts the file in place; its size.
    pub async fn finish(mut self) -> Result<u64, EngineError> {
        if let Some(finish) = self.finish.take() {
            let _ = finish.send(());
        }
        self.chunks = None;
        self.done.await
    }
}

/// A file's bytes in chunks ([`SessionFiles::download`]).
pub struct Download {
    /// The file's size when it was opened.
    pub size: u64,
    /// The bytes sent (as the window chose); `None`: nothing is sent, the window could not
    /// be met.
    pub range: Option<Range<u64>>,
    chunks: mpsc::Receiver<std::io::Result<Vec<u8>>>,
}

impl Stream for Download {
    type Item = std::io::Result<Vec<u8>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.chunks.poll_recv(cx)
    }
}
