//! The `session.files.*` calls of the [`Client`]: file bytes move as base64 over the socket,
//! a large file in several calls (ranges read, appends written).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::{Client, ClientError};
use crate::rpc::files::{
    self, FileEntry, ListParams, ReadParams, ReadResult, RemoveParams, WriteParams, Written,
};
use crate::rpc::wire;

/// A range of a file, as [`Client::read_file`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRange {
    pub data: Vec<u8>,
    /// The file's size.
    pub size: u64,
    /// Whether the range reaches the end of the file.
    pub eof: bool,
}

impl Client {
    /// Writes `data` to `path` in the session's work directory (appends with `append`); the
    /// file's size after.
    pub async fn write_file(
        &self,
        session_id: &str,
        path: &str,
        data: &[u8],
        append: bool,
    ) -> Result<u64, ClientError> {
        let params = WriteParams {
            session_id: session_id.to_owned(),
            path: path.to_owned(),
            data: STANDARD.encode(data),
            append,
        };
        let written: Written = self.typed(files::WRITE, Some(&params)).await?;
        Ok(written.size)
    }

    /// Up to `length` bytes of `path` from `offset` (the server's most per call by default).
    pub async fn read_file(
        &self,
        session_id: &str,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<FileRange, ClientError> {
        let params = ReadParams {
            session_id: session_id.to_owned(),
            path: path.to_owned(),
            offset: Some(offset),
            length,
        };
        let read: ReadResult = self.typed(files::READ, Some(&params)).await?;
        let data = STANDARD.decode(read.data.as_bytes()).map_err(|err| {
            ClientError::Protocol(format!("{}: data is not base64: {err}", files::READ))
        })?;
        Ok(FileRange {
            data,
            size: read.size,
            eof: read.eof,
        })
    }

    /// The files and directories in `dir` of the session's work directory (itself when
    /// `None`).
    pub async fn list_files(
        &self,
        session_id: &str,
        dir: Option<&str>,
    ) -> Result<Vec<FileEntry>, ClientError> {
        let params = ListParams {
            session_id: session_id.to_owned(),
            path: dir.map(str::to_owned),
        };
        self.typed(files::LIST, Some(&params)).await
    }

    /// Removes the file or empty directory `path`.
    pub async fn remove_file(&self, session_id: &str, path: &str) -> Result<(), ClientError> {
        let params = RemoveParams {
            session_id: session_id.to_owned(),
            path: path.to_owned(),
        };
        let _: wire::Empty = self.typed(files::REMOVE, Some(&params)).await?;
        Ok(())
    }
}
