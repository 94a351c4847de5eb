//! Newline-delimited framing with a size limit: one JSON message per line. A line over the
//! limit is skipped without being buffered, up to its newline, so the connection stays
//! usable for the next line.

use std::io;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What the next line of a connection held.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A line without its `\n` (or `\r\n`).
    Line(Vec<u8>),
    /// A line longer than the limit; its bytes were skipped.
    Oversized,
}

/// Reads size-limited lines from `R`.
pub struct LineReader<R> {
    inner: R,
    limit: usize,
    line: Vec<u8>,
    /// Inside an oversized line: bytes are dropped up to its newline.
    skipping: bool,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    /// Reads lines of at most `limit` bytes from `inner`.
    pub fn new(inner: R, limit: usize) -> Self {
        Self {
            inner,
            limit,
            line: Vec::new(),
            skipping: false,
        }
    }

    /// The next non-blank line; `None` at end of input. An unterminated last line counts.
    pub async fn next(&mut self) -> io::Result<Option<Frame>> {
        loop {
            let chunk = self.inner.fill_buf().await?;
            if chunk.is_empty() {
                if self.skipping || self.line.is_empty() {
                    return Ok(None);
                }
                let line = without_cr(std::mem::take(&mut self.line));
                if is_blank(&line) {
                    return Ok(None);
                }
                return Ok(Some(Frame::Line(line)));
            }
            let newline = chunk.iter().position(|&b| b == b'\n');
            let taken = newline.map_or(chunk.len(), |at| at);
            let consumed = newline.map_or(chunk.len(), |at| at + 1);
            if self.skipping {
                self.inner.consume(consumed);
                if newline.is_some() {
                    self.skipping = false;
                }
                continue;
            }
            if self.line.len() + taken > self.limit {
                self.line = Vec::new();
                self.skipping = newline.is_none();
                self.inner.consume(consumed);
                return Ok(Some(Frame::Oversized));
            }
            self.line.extend_from_slice(&chunk[..taken]);
            self.inner.consume(consumed);
            if newline.is_none() {
                continue;
            }
            let line = without_cr(std::mem::take(&mut self.line));
            if !is_blank(&line) {
                return Ok(Some(Frame::Line(line)));
            }
        }
    }
}

fn without_cr(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    line
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tokio::io::BufReader;

    use super::*;

    fn frames(input: &[u8], limit: usize, buffer: usize) -> Vec<Frame> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime builds");
        runtime.block_on(async {
            let mut reader = LineReader::new(BufReader::with_capacity(buffer, input), limit);
            let mut out = Vec::new();
            while let Some(frame) = reader.next().await.expect("reading a slice cannot fail") {
                out.push(frame);
            }
            out
        })
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
