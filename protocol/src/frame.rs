//! Length-prefixed framing: 4-byte big-endian length, then the JSON payload.
//!
//! [`FrameDecoder`] is incremental: feed it whatever a read returned, then pull complete
//! frames out. It checks the announced length before buffering the body, so a hostile length
//! prefix costs nothing, and it never panics on any byte sequence.

use bytes::{Buf, BytesMut};
use serde::{de::DeserializeOwned, Serialize};

use crate::errors::FrameError;

/// Size of the length prefix in bytes.
pub const FRAME_HEADER_BYTES: usize = 4;

/// Largest frame accepted by default (32 MiB): room for a large image display.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 32 * 1024 * 1024;

/// Serialises `message` into one frame (length prefix + JSON).
pub fn encode_frame<T: Serialize>(message: &T, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; FRAME_HEADER_BYTES];
    serde_json::to_writer(&mut out, message)?;
    let len = out.len() - FRAME_HEADER_BYTES;
    if len > max || u32::try_from(len).is_err() {
        return Err(FrameError::TooLarge { len, max });
    }
    out[..FRAME_HEADER_BYTES].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(out)
}

/// Incremental decoder of frames from a byte stream.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: BytesMut,
    max_frame: usize,
}

impl FrameDecoder {
    /// A decoder that rejects frames longer than `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        Self {
            buffer: BytesMut::with_capacity(8 * 1024),
            max_frame,
        }
    }

    /// Appends bytes just read from the stream.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Number of bytes received but not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Returns the next complete payload, `Ok(None)` when more bytes are needed.
    ///
    /// After an error the stream cannot be resynchronised; the caller must drop it.
    pub fn next_payload(&mut self) -> Result<Option<BytesMut>, FrameError> {
        if self.buffer.len() < FRAME_HEADER_BYTES {
            return Ok(None);
        }
        let mut header = [0u8; FRAME_HEADER_BYTES];
        header.copy_from_slice(&self.buffer[..FRAME_HEADER_BYTES]);
        let len = u32::from_be_bytes(header) as usize;
        if len > self.max_frame {
            return Err(FrameError::TooLarge {
                len,
                max: self.max_frame,
            });
        }
        if self.buffer.len() < FRAME_HEADER_BYTES + len {
            self.buffer
                .reserve(FRAME_HEADER_BYTES + len - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(FRAME_HEADER_BYTES);
        Ok(Some(self.buffer.split_to(len)))
    }

    /// Returns the next complete frame decoded as `T`, `Ok(None)` when more bytes are needed.
    pub fn next_message<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        match self.next_payload()? {
            Some(payload) => Ok(Some(serde_json::from_slice(&payload)?)),
            None => Ok(None),
        }
    }

    /// Called at end of stream: an error if a partial frame is left over.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buffer.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated {
                buffered: self.buffer.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{HostMessage, WorkerMessage};
    use proptest::prelude::*;

    fn execute(code: &str) -> HostMessage {
        HostMessage::Execute {
            id: "e-1".into(),
            code: code.into(),
            repr_limit: 64,
            transaction: Default::default(),
            facts: false,
            cell: None,
        }
    }

    #[test]
    fn round_trips_a_message() {
        let frame = encode_frame(&execute("x = 1"), DEFAULT_MAX_FRAME_BYTES).unwrap();
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
        decoder.extend(&frame);
        let decoded: HostMessage = decoder.next_message().unwrap().unwrap();
        assert_eq!(decoded, execute("x = 1"));
        assert!(decoder.next_payload().unwrap().is_none());
        decoder.finish().unwrap();
    }

    #[test]
    fn rejects_oversize_length_before_buffering_body() {
        let mut decoder = FrameDecoder::new(16);
        decoder.extend(&1_000_000u32.to_be_bytes());
        assert!(matches!(
            decoder.next_payload(),
            Err(FrameError::TooLarge {
                len: 1_000_000,
                max: 16
            })
        ));
    }

    #[test]
    fn encode_refuses_frames_over_the_limit() {
        let err = encode_frame(&execute(&"x".repeat(100)), 32).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { max: 32, .. }));
    }

    #[test]
    fn truncated_frame_is_reported_at_end_of_stream() {
        let frame = encode_frame(&execute("x"), DEFAULT_MAX_FRAME_BYTES).unwrap();
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
        decoder.extend(&frame[..frame.len() - 1]);
        assert!(decoder.next_payload().unwrap().is_none());
        assert!(matches!(
            decoder.finish(),
            Err(FrameError::Truncated { .. })
        ));
    }

    /// A decoder holding one frame of `body`.
    fn holding(body: &[u8]) -> FrameDecoder {
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
        decoder.extend(&(body.len() as u32).to_be_bytes());
        decoder.extend(body);
        decoder
    }

    #[test]
    fn an_unknown_worker_message_kind_is_unknown_and_a_bad_known_one_malformed() {
        let body = br#"{"type":"launch_missiles","at":[1,2]}"#;
        let result: Result<Option<WorkerMessage>, _> = holding(body).next_message();
        assert!(
            matches!(result, Ok(Some(WorkerMessage::Unknown))),
            "{result:?}"
        );
        let body = br#"{"type":"result","id":7}"#;
        let result: Result<Option<WorkerMessage>, _> = holding(body).next_message();
        assert!(
            matches!(result, Err(FrameError::Malformed(_))),
            "{result:?}"
        );
    }

    #[test]
    fn an_unknown_host_message_kind_is_malformed() {
        let body = br#"{"type":"launch_missiles"}"#;
        let result: Result<Option<HostMessage>, _> = holding(body).next_message();
        assert!(matches!(result, Err(FrameError::Malformed(_))));
    }

    proptest! {
        #[test]
        fn decoder_never_panics_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096),
            max in 0usize..2048,
        ) {
            let mut decoder = FrameDecoder::new(max);
            decoder.extend(&bytes);
            while let Ok(Some(_)) = decoder.next_message::<WorkerMessage>() {}
            let _ = decoder.finish();
        }

        #[test]
        fn split_reads_yield_the_same_frames(
            codes in proptest::collection::vec(".{0,64}", 1..8),
            cuts in proptest::collection::vec(1usize..50, 1..40),
        ) {
            let messages: Vec<HostMessage> = codes.iter().map(|c| execute(c)).collect();
            let mut stream = Vec::new();
            for m in &messages {
                stream.extend(encode_frame(m, DEFAULT_MAX_FRAME_BYTES).unwrap());
            }
            let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
            let mut decoded = Vec::new();
            let mut rest = &stream[..];
            let mut cut = cuts.iter().cycle();
            while !rest.is_empty() {
                let n = (*cut.next().unwrap()).min(rest.len());
                decoder.extend(&rest[..n]);
                rest = &rest[n..];
                while let Some(m) = decoder.next_message::<HostMessage>().unwrap() {
                    decoded.push(m);
                }
            }
            prop_assert_eq!(decoded, messages);
            prop_assert!(decoder.finish().is_ok());
        }

        #[test]
        fn any_oversize_prefix_is_rejected(len in 17u32.., tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut decoder = FrameDecoder::new(16);
            decoder.extend(&len.to_be_bytes());
            decoder.extend(&tail);
            let rejected = matches!(decoder.next_payload(), Err(FrameError::TooLarge { .. }));
            prop_assert!(rejected);
        }

        #[test]
        fn truncated_frames_never_yield_a_message(code in ".{0,64}", keep in 0usize..100) {
            let frame = encode_frame(&execute(&code), DEFAULT_MAX_FRAME_BYTES).unwrap();
            let keep = keep.min(frame.len() - 1);
            let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
            decoder.extend(&frame[..keep]);
            prop_assert!(decoder.next_payload().unwrap().is_none());
            prop_assert_eq!(decoder.finish().is_err(), keep > 0);
        }
    }
}
