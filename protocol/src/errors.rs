//! Errors raised while decoding or encoding frames.

use thiserror::Error;

/// Why a frame could not be read or written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix announces more bytes than the receiver accepts.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// The stream ended in the middle of a frame.
    #[error("stream ended inside a frame ({buffered} bytes buffered)")]
    Truncated { buffered: usize },
    /// The payload is not a valid JSON message of the expected kind.
    #[error("malformed frame payload: {0}")]
    Malformed(#[from] serde_json::Error),
}
