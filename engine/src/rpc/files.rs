//! The `session.files.*` methods of docs/protocol.md (write, read, list, remove): their
//! params and results, shared by the server and the client, and (server side) how each
//! becomes a call on the session's [`crate::files::SessionFiles`]. File bytes travel as
//! base64; a large file is read in ranges (`offset`, `length`) and written in appends.

use serde::{Deserialize, Serialize};

pub use crate::files::FileEntry;

/// Method names.
pub const WRITE: &str = "session.files.write";
pub const READ: &str = "session.files.read";
pub const LIST: &str = "session.files.list";
pub const REMOVE: &str = "session.files.remove";

/// Whether `method` is one of the files methods.
pub fn is_files_method(method: &str) -> bool {
    matches!(method, WRITE | READ | LIST | REMOVE)
}

/// `session.files.write` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    pub session_id: String,
    pub path: String,
    /// The bytes, base64 (standard alphabet, padded).
    pub data: String,
    #[serde(default)]
    pub append: bool,
}

/// `session.files.write` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Written {
    /// The file's size after the write.
    pub size: u64,
}

/// `session.files.read` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadParams {
    pub session_id: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
}

/// `session.files.read` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadResult {
    /// The bytes read, base64.
    pub data: String,
    /// The file's size.
    pub size: u64,
    /// Whether the bytes reach the end of the file.
    pub eof: bool,
}

/// `session.files.list` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    pub session_id: String,
    /// The directory; the work directory itself when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// `session.files.remove` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveParams {
    pub session_id: String,
    pub path: String,
}

#[cfg(feature = "server")]
pub(super) use server::call;

#[cfg(feature = "server")]
mod server {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde_json::value::RawValue;
    use serde_json::Value;

    use super::*;
    use crate::rpc::errors::RpcError;
    use crate::rpc::params::{decode, encode};
    use crate::rpc::wire;
    use crate::Session;

    /// The session a files call names, from its params, before they are decoded whole.
    pub(in crate::rpc) fn session_key(params: &Option<Value>) -> Result<String, RpcError> {
        match params.as_ref().and_then(|p| p.get("session_id")) {
            Some(Value::String(id)) => Ok(id.clone()),
            _ => Err(RpcError::invalid_params("session_id: a string is required")),
        }
    }

    /// Runs the files `method` on `session` (found within the caller's scope).
    pub(in crate::rpc) async fn call(
        session: &Session,
        method: &str,
        params: Option<Value>,
    ) -> Result<Box<RawValue>, RpcError> {
        let files = session.files();
        match method {
            WRITE => {
                let params: WriteParams = decode(params)?;
                let data = STANDARD
                    .decode(params.data.as_bytes())
                    .map_err(|err| RpcError::invalid_params(format!("data: not base64: {err}")))?;
                let size = files.write(&params.path, data, params.append).await?;
                encode(Written { size })
            }
            READ => {
                let params: ReadParams = decode(params)?;
                let chunk = files
                    .read(&params.path, params.offset.unwrap_or(0), params.length)
                    .await?;
                encode(ReadResult {
                    data: STANDARD.encode(&chunk.data),
                    size: chunk.size,
                    eof: chunk.eof,
                })
            }
            LIST => {
                let params: ListParams = decode(params)?;
                encode(files.list(params.path.as_deref().unwrap_or("")).await?)
            }
            REMOVE => {
                let params: RemoveParams = decode(params)?;
                files.remove(&params.path).await?;
                encode(wire::Empty {})
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }
}

#[cfg(feature = "server")]
pub(super) use server::session_key;
