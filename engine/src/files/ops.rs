//! The file operations of the files API, synchronous, run on a thread that acts as the
//! session's uid (`identity`): read a range, list a directory, remove an entry, and write
//! through an [`Upload`], which fills a temporary file beside the target under the limits and
//! renames it into place when complete (an append writes in place). Only regular files with a
//! single link are read or appended to: a hard link made by session code is not a way to
//! another file.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};

use super::resolve::{make_dirs, open_beneath, RelPath};
use super::FileError;

/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// A range of a file and where it stands in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadChunk {
    pub data: Vec<u8>,
    /// The file's size when it was read.
    pub size: u64,
    /// Whether the range reaches the end of the file.
    pub eof: bool,
}

/// What an entry of a listing is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Dir,
}

/// One entry of a directory listing (`session.files.list`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Bytes of a file; 0 for a directory.
    pub size: u64,
    /// Last modification, in seconds since the Unix epoch.
    pub mtime: f64,
}

/// Opens the regular file `path` for reading; its size.
pub(super) fn open_file(root: &OwnedFd, path: &RelPath) -> Result<(File, u64), FileError> {
    // O_NONBLOCK: a FIFO made by session code must not hang the open.
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    let fd = open_beneath(root, &path.joined(), flags, Mode::empty()).map_err(|e| path.error(e))?;
    let stat = fstat(&fd).map_err(|e| path.error(e))?;
    single_regular(path, &stat)?;
    Ok((File::from(fd), stat.st_size as u64))
}

/// Up to `length` bytes of `path` from `offset`.
pub(super) fn read(
    root: &OwnedFd,
    path: &RelPath,
    offset: u64,
    length: u64,
) -> Result<ReadChunk, FileError> {
    let (file, size) = open_file(root, path)?;
    let want = length.min(size.saturating_sub(offset));
    let mut data = vec![0; want as usize];
    let mut filled = 0;
    while filled < data.len() {
        match file.read_at(&mut data[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => return Err(FileError::io(path, source)),
        }
    }
    data.truncate(filled);
    Ok(ReadChunk {
        eof: offset + filled as u64 >= size,
        data,
        size,
    })
}

/// The files and directories in `path`, by name (symlinks, sockets and devices are left out).
pub(super) fn list(root: &OwnedFd, path: &RelPath) -> Result<Vec<FileEntry>, FileError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
    let fd = open_beneath(root, &path.joined(), flags, Mode::empty()).map_err(|e| path.error(e))?;
    let mut dir = Dir::from_fd(fd).map_err(|e| path.error(e))?;
    let mut entries = Vec::new();
    let names: Vec<_> = dir
        .iter()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_owned())
        .collect();
    for name in names {
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        // Gone since the listing, or not ours to see: not listed.
        let Ok(stat) = fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        let kind = match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFREG => FileKind::File,
            SFlag::S_IFDIR => FileKind::Dir,
            _ => continue,
        };
        if entries.len() == MAX_LIST_ENTRIES {
            return Err(FileError::TooMany {
                path: path.given.clone(),
                limit: MAX_LIST_ENTRIES,
            });
        }
        entries.push(FileEntry {
            name: String::from_utf8_lossy(bytes).into_owned(),
            kind,
            size: if kind == FileKind::File {
                stat.st_size as u64
            } else {
                0
            },
            mtime: stat.st_mtime as f64 + stat.st_mtime_nsec as f64 / 1e9,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Removes the file (or empty directory) `path`; a symlink is removed, not followed.
pub(super) fn remove(root: &OwnedFd, path: &RelPath) -> Result<(), FileError> {
    let (parents, last) = path.split_last()?;
    let parent = parent_dir(root, path, parents)?;
    match unlinkat(&parent, last, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(()),
        Err(Errno::EISDIR) => {
            unlinkat(&parent, last, UnlinkatFlags::RemoveDir).map_err(|e| path.error(e))
        }
        Err(errno) => Err(path.error(errno)),
    }
}

/// The directory of `parents` beneath `root`.
fn parent_dir(root: &OwnedFd, path: &RelPath, parents: &[String]) -> Result<OwnedFd, FileError> {
    let joined = if parents.is_empty() {
        ".".to_owned()
    } else {
        parents.join("/")
    };
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    open_beneath(root, &joined, flags, Mode::empty()).map_err(|e| path.error(e))
}

/// Refuses anything but a regular file with one link.
fn single_regular(path: &RelPath, stat: &FileStat) -> Result<(), FileError> {
    let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
    let reason = if kind == SFlag::S_IFDIR {
        "is a directory"
    } else if kind != SFlag::S_IFREG {
        "is not a regular file"
    } else if stat.st_nlink > 1 {
        "has several hard links; such files are not served"
    } else {
        return Ok(());
    };
    Err(FileError::BadPath {
        path: path.given.clone(),
        reason: reason.into(),
    })
}

/// Bytes of the regular files beneath `root`, symlinks not followed; what cannot be read is
/// not counted.
fn used_bytes(root: &OwnedFd) -> u64 {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Ok(top) = openat(root, ".", flags, Mode::empty()) else {
        return 0;
    };
    let mut pending = vec![top];
    let mut total = 0u64;
    while let Some(fd) = pending.pop() {
        let Ok(mut dir) = Dir::from_fd(fd) else {
            continue;
        };
        let names: Vec<_> = dir
            .iter()
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_owned())
            .filter(|name| !matches!(name.to_bytes(), b"." | b".."))
            .collect();
        for name in names {
            let Ok(stat) = fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFREG => total = total.saturating_add(stat.st_size as u64),
                SFlag::S_IFDIR => {
                    if let Ok(sub) = openat(&dir, name.as_c_str(), flags, Mode::empty()) {
                        pending.push(sub);
                    }
                }
                _ => {}
            }
        }
    }
    total
}

/// The limits a write is held to.
#[derive(Debug, Clone, Copy)]
pub(super) struct WriteLimits {
    pub file_bytes: u64,
    pub disk_bytes: Option<u64>,
}

/// A write in progress: bytes go to a temporary file beside the target (or, for an append,
/// to the target), each chunk checked against the limits first. Dropped before
/// [`Upload::commit`], the temporary file is removed.
pub(super) struct Upload {
    path: RelPath,
    parent: OwnedFd,
    name: String,
    /// The temporary file's name; `None` for an append or once committed.
    temp: Option<String>,
    file: File,
    /// Bytes the file held before (an append's), plus those written.
    size: u64,
    /// Bytes that may still be written before `limits.disk_mb` is reached.
    room: Option<u64>,
    limits: WriteLimits,
}

impl Upload {
    /// Begins a write of `path` (missing directories on the way are created).
    pub fn begin(
        root: &OwnedFd,
        path: RelPath,
        append: bool,
        limits: WriteLimits,
    ) -> Result<Upload, FileError> {
        let (parents, name) = path.split_last()?;
        let name = name.to_owned();
        let parent = make_dirs(root, &path, parents)?;
        let used = limits.disk_bytes.map(|_| used_bytes(root));
        let (file, temp, size, replaced) = if append {
            let flags = OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NONBLOCK;
            let fd = open_beneath(&parent, &name, flags, Mode::from_bits_truncate(0o644))
                .map_err(|e| path.error(e))?;
            let stat = fstat(&fd).map_err(|e| path.error(e))?;
            single_regular(&path, &stat)?;
            (File::from(fd), None, stat.st_size as u64, 0)
        } else {
            let replaced = fstatat(&parent, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .ok()
                .filter(|stat| {
                    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG
                })
                .map_or(0, |stat| stat.st_size as u64);
            let temp = temp_name();
            let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW;
            let fd = openat(
                &parent,
                temp.as_str(),
                flags | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .map_err(|e| path.error(e))?;
            (File::from(fd), Some(temp), 0, replaced)
        };
        let room = match (limits.disk_bytes, used) {
            (Some(disk), Some(used)) => Some(disk.saturating_sub(used.saturating_sub(replaced))),
            _ => None,
        };
        Ok(Upload {
            path,
            parent,
            name,
            temp,
            file,
            size,
            room,
            limits,
        })
    }

    /// Writes `data`, or refuses it whole when it would pass a limit.
    pub fn write(&mut self, data: &[u8]) -> Result<(), FileError> {
        let len = data.len() as u64;
        let size = self.size.saturating_add(len);
        if size > self.limits.file_bytes {
            return Err(FileError::TooLarge {
                path: self.path.given.clone(),
                size,
                limit: self.limits.file_bytes,
            });
        }
        if let Some(room) = self.room {
            if len > room {
                return Err(FileError::DiskFull {
                    path: self.path.given.clone(),
                    limit_mb: self.limits.disk_bytes.unwrap_or_default() >> 20,
                });
            }
            self.room = Some(room - len);
        }
        self.file
            .write_all(data)
            .map_err(|source| FileError::io(&self.path, source))?;
        self.size = size;
        Ok(())
    }

    /// Puts the file in place; its size.
    pub fn commit(mut self) -> Result<u64, FileError> {
        if let Some(temp) = self.temp.take() {
            if let Err(errno) = renameat(
                &self.parent,
                temp.as_str(),
                &self.parent,
                self.name.as_str(),
            ) {
                let _ = unlinkat(&self.parent, temp.as_str(), UnlinkatFlags::NoRemoveDir);
                return Err(self.path.error(errno));
            }
        }
        Ok(self.size)
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = unlinkat(
                self.parent.as_fd(),
                temp.as_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// A name for a temporary file that no other write picks.
fn temp_name() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(".pyvisor-upload-{:x}-{:x}", nanos, fastrand::u64(..))
}

/// Reads `file` in chunks of `chunk` bytes for a download.
pub(super) fn next_chunk(file: &mut impl Read, chunk: usize) -> std::io::Result<Vec<u8>> {
    let mut data = vec![0; chunk];
    let n = loop {
        match file.read(&mut data) {
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            read => break read?,
        }
    };
    data.truncate(n);
    Ok(data)
}
