//! Newline-delimited framing with a size limit: one JSON message per line, through
//! tokio-util's delimiter codec. A line over the limit is skipped without being buffered, up
//! to its newline, and reported as [`Frame::Oversized`] (an item, not an error, because a
//! framed stream ends at its first error), so the connection stays usable for the next line.

use std::io;

use bytes::BytesMut;
use tokio::io::AsyncRead;
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, Decoder, FramedRead};

/// What the next line of a connection held.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A line without its `\n` (or `\r\n`).
    Line(Vec<u8>),
    /// A line longer than the limit; its bytes were skipped.
    Oversized,
}

/// The non-blank lines of `reader`, each of at most `limit` bytes; the stream ends at end of
/// input (an unterminated last line counts) or at the first read error.
pub fn lines<R: AsyncRead>(reader: R, limit: usize) -> FramedRead<R, Lines> {
    FramedRead::new(
        reader,
        Lines(AnyDelimiterCodec::new_with_max_length(
            b"\n".to_vec(),
            Vec::new(),
            limit,
        )),
    )
}

/// The decoder of [`lines`].
pub struct Lines(AnyDelimiterCodec);

impl Lines {
    fn frame(
        &mut self,
        chunk: Result<Option<bytes::Bytes>, AnyDelimiterCodecError>,
    ) -> Option<io::Result<Option<Frame>>> {
        match chunk {
            Ok(Some(line)) => {
                let line = line.strip_suffix(b"\r").unwrap_or(&line);
                let blank = line.iter().all(u8::is_ascii_whitespace);
                (!blank).then(|| Ok(Some(Frame::Line(line.to_vec()))))
            }
            Ok(None) => Some(Ok(None)),
            Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => Some(Ok(Some(Frame::Oversized))),
            Err(AnyDelimiterCodecError::Io(err)) => Some(Err(err)),
        }
    }
}

impl Decoder for Lines {
    type Item = Frame;
    type Error = io::Error;

    fn decode(&mut self, buffer: &mut BytesMut) -> io::Result<Option<Frame>> {
        loop {
            let chunk = self.0.decode(buffer);
            if let Some(frame) = self.frame(chunk) {
                return frame;
            }
        }
    }

    fn decode_eof(&mut self, buffer: &mut BytesMut) -> io::Result<Option<Frame>> {
        loop {
            let chunk = self.0.decode_eof(buffer);
            if let Some(frame) = self.frame(chunk) {
                return frame;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use proptest::prelude::*;

    use super::*;

    /// The frames of `input`, read `buffer` bytes at a time.
    fn frames(input: &[u8], limit: usize, buffer: usize) -> Vec<Frame> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds");
        runtime.block_on(async {
            let mut reader = lines(chunked(input, buffer), limit);
            let mut out = Vec::new();
            while let Some(frame) = reader.next().await {
                out.push(frame.expect("reading a slice cannot fail"));
            }
            out
        })
    }

    /// A reader that hands out `input` at most `buffer` bytes per read.
    fn chunked(input: &[u8], buffer: usize) -> impl AsyncRead + Unpin {
        let chunks: Vec<io::Result<bytes::Bytes>> = input
            .chunks(buffer)
            .map(|chunk| Ok(bytes::Bytes::copy_from_slice(chunk)))
            .collect();
        tokio_util::io::StreamReader::new(futures::stream::iter(chunks))
    }

    fn is_blank(line: &[u8]) -> bool {
        line.iter().all(u8::is_ascii_whitespace)
    }

    fn line(text: &str) -> Frame {
        Frame::Line(text.as_bytes().to_vec())
    }

    #[test]
    fn splits_lines_and_skips_blank_ones() {
        let got = frames(b"{\"a\":1}\n\n  \r\n{\"b\":2}\r\n{\"c\":3}", 100, 4);
        assert_eq!(
            got,
            vec![line("{\"a\":1}"), line("{\"b\":2}"), line("{\"c\":3}")]
        );
    }

    #[test]
    fn an_oversized_line_is_reported_once_and_the_next_line_is_read() {
        let mut input = vec![b'x'; 1000];
        input.extend_from_slice(b"\n{\"ok\":1}\n");
        let got = frames(&input, 100, 16);
        assert_eq!(got, vec![Frame::Oversized, line("{\"ok\":1}")]);
    }

    #[test]
    fn a_line_of_exactly_the_limit_is_accepted() {
        let got = frames(b"12345\n123456\n", 5, 3);
        assert_eq!(got, vec![line("12345"), Frame::Oversized]);
    }

    proptest! {
        /// Whatever the bytes and buffer size, the reader never returns a line over the
        /// limit or containing a newline, and lines under the limit come back intact.
        #[test]
        fn framing_holds_for_arbitrary_bytes(
            input in proptest::collection::vec(any::<u8>(), 0..2048),
            limit in 1usize..300,
            buffer in 1usize..64,
        ) {
            for frame in frames(&input, limit, buffer) {
                if let Frame::Line(line) = frame {
                    prop_assert!(line.len() <= limit);
                    prop_assert!(!line.contains(&b'\n'));
                }
            }
            let expected: Vec<&[u8]> = input
                .split(|&b| b == b'\n')
                .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                .filter(|l| !is_blank(l))
                .collect();
            let got = frames(&input, usize::MAX, buffer);
            let got: Vec<&[u8]> = got.iter().map(|f| match f {
                Frame::Line(l) => l.as_slice(),
                Frame::Oversized => unreachable!("no limit"),
            }).collect();
            prop_assert_eq!(got, expected);
        }
    }
}
