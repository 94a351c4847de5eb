//! Bounded capture of a worker's stdout/stderr for one execution.
//!
//! Output is decoded as UTF-8 incrementally (a multi-byte character split across two reads is
//! kept whole) and kept up to a byte cap; past the cap it is counted and dropped, never
//! buffered, so a 200 MB print costs the host no memory.

/// Appended once when an execution's output passes its cap.
const TRUNCATION_MARKER: &str = "\n[pyvisor: output truncated]\n";

/// Decodes a byte stream as UTF-8 across chunk boundaries (invalid bytes become U+FFFD).
#[derive(Debug, Default)]
pub struct Utf8Chunker {
    pending: Vec<u8>,
}

impl Utf8Chunker {
    /// Decodes `bytes`, holding back an incomplete trailing character for the next call.
    pub fn decode(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let complete = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..complete]).into_owned();
        self.pending.drain(..complete);
        text
    }

    /// Whatever incomplete character is left at the end of the stream.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// Output of one execution, shared across stdout and stderr against one byte budget.
#[derive(Debug)]
pub struct CappedOutput {
    budget: usize,
    used: usize,
    dropped: usize,
    stdout: String,
    stderr: String,
}

impl CappedOutput {
    /// An empty capture that keeps at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            used: 0,
            dropped: 0,
            stdout: String::new(),
            stderr: String::new(),
        }
    }

    /// Keeps as much of `text` as the budget allows; returns the part kept (to stream).
    pub fn push<'a>(&mut self, to_stderr: bool, text: &'a str) -> &'a str {
        let room = self.budget - self.used;
        let kept = if text.len() <= room {
            text
        } else {
            let mut end = room;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            &text[..end]
        };
        self.used += kept.len();
        self.dropped += text.len() - kept.len();
        let target = if to_stderr {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        target.push_str(kept);
        kept
    }

    /// The captured `(stdout, stderr)`, with a marker on stdout if anything was dropped.
    pub fn into_parts(mut self) -> (String, String) {
        if self.dropped > 0 {
            self.stdout.push_str(TRUNCATION_MARKER);
            self.stdout
                .push_str(&format!("[{} bytes dropped]\n", self.dropped));
        }
        (self.stdout, self.stderr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunker_keeps_split_characters_whole() {
        let bytes = "héllo €".as_bytes();
        let mut chunker = Utf8Chunker::default();
        let mut text = String::new();
        for byte in bytes {
            text.push_str(&chunker.decode(std::slice::from_ref(byte)));
        }
        text.push_str(&chunker.finish());
        assert_eq!(text, "héllo €");
    }

    #[test]
    fn chunker_replaces_invalid_bytes() {
        let mut chunker = Utf8Chunker::default();
        assert_eq!(chunker.decode(b"a\xffb"), "a\u{fffd}b");
    }

    #[test]
    fn cap_is_shared_and_marks_truncation() {
        let mut output = CappedOutput::new(5);
        assert_eq!(output.push(false, "abc"), "abc");
        assert_eq!(output.push(true, "defgh"), "de");
        assert_eq!(output.push(false, "more"), "");
        let (stdout, stderr) = output.into_parts();
        assert!(stdout.starts_with("abc\n[pyvisor: output truncated]"));
        assert!(stdout.contains("[7 bytes dropped]"));
        assert_eq!(stderr, "de");
    }

    #[test]
    fn cap_never_splits_a_character() {
        let mut output = CappedOutput::new(2);
        assert_eq!(output.push(false, "é€"), "é");
    }
}
