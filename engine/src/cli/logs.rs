//! `pyvisor logs [-f] [-n N]`: the last lines of the daemon's log (`server.log_file`, else
//! `pyvisor.log` beside the socket, where `pyvisor daemon start` sends the daemon's output),
//! and with `-f` the lines appended after them, across a rotation (the path names a new file)
//! or a truncation (the file shrank), as `tail -F` does.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::target::EXIT_REFUSED;
use super::EXIT_USAGE;

/// How often `-f` looks for new lines, a rotation or a truncation.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// How much of the log's end is read at a time to find its last lines.
const TAIL_CHUNK: u64 = 64 * 1024;

/// Arguments of `pyvisor logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Keep printing lines as the daemon appends them (survives rotation and truncation);
    /// Ctrl-C stops.
    #[arg(short, long)]
    follow: bool,
    /// How many of the last lines to print first.
    #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
    lines: usize,
    /// The config file (else the search order of `pyvisor serve`).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
}

pub fn run(args: LogsArgs) -> u8 {
    let settings = match pyvisor::config::Settings::load(args.config.as_deref()) {
        Ok(loaded) => loaded.settings,
        Err(err) => {
            eprintln!("pyvisor: failed to load the configuration: {err}");
            return EXIT_USAGE;
        }
    };
    let path = settings.log_file();
    let mut file = match File::open(&path) {
        Ok(file) => file,
        Err(err) => {
            eprintln!(
                "pyvisor: no daemon log at {} ({err}); `pyvisor daemon start` writes it; a \
                 daemon under systemd logs to its journal",
                path.display()
            );
            return EXIT_REFUSED;
        }
    };
    let shown = tail(&mut file, args.lines).and_then(|(text, end)| {
        write_out(&text)?;
        Ok(end)
    });
    let outcome = match (shown, args.follow) {
        (Ok(end), true) => follow(&path, file, end),
        (shown, _) => shown.map(drop),
    };
    match outcome {
        Ok(()) => 0,
        // `pyvisor logs | head` closes the pipe: that is a normal end.
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(err) => {
            eprintln!("pyvisor: failed to read {}: {err}", path.display());
            EXIT_REFUSED
        }
    }
}

/// The last `lines` lines of `file`, and the offset of its end.
fn tail(file: &mut File, lines: usize) -> io::Result<(Vec<u8>, u64)> {
    let end = file.seek(SeekFrom::End(0))?;
    let mut start = end;
    let mut text = Vec::new();
    // Newlines seen, not counting one that ends the file.
    let mut found = 0;
    while start > 0 && found < lines {
        let from = start.saturating_sub(TAIL_CHUNK);
        let mut chunk = vec![0; (start - from) as usize];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&text);
        text = chunk;
        start = from;
        found = newlines(&text);
    }
    text.drain(..start_of_last(&text, lines));
    Ok((text, end))
}

/// Where the last `lines` lines of `text` begin (a final newline ends a line, not starts one).
fn start_of_last(text: &[u8], lines: usize) -> usize {
    if lines == 0 {
        return text.len();
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    body.iter()
        .enumerate()
        .rev()
        .filter(|(_, byte)| **byte == b'\n')
        .nth(lines - 1)
        .map_or(0, |(at, _)| at + 1)
}

fn newlines(text: &[u8]) -> usize {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    body.iter().filter(|byte| **byte == b'\n').count()
}

/// Prints what is appended to the log at `path` from `offset` of `file` on, until killed.
fn follow(path: &Path, mut file: File, mut offset: u64) -> io::Result<()> {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = file.read(&mut buffer)?;
        if read > 0 {
            offset += read as u64;
            write_out(&buffer[..read])?;
            continue;
        }
        std::thread::sleep(FOLLOW_POLL);
        if file.metadata()?.len() < offset {
            // Truncated in place (`> pyvisor.log`, copytruncate): read it from the start.
            file.seek(SeekFrom::Start(0))?;
            offset = 0;
        } else if let Some(renewed) = reopened(path, &file)? {
            // Rotated: the old file is read to its end above before this switch, since a
            // read that returned nothing came first.
            file = renewed;
            offset = 0;
        }
    }
}

/// The file now at `path` when it is not `current` (the log was rotated); `None` while it
/// is, or while nothing is at `path` yet.
fn reopened(path: &Path, current: &File) -> io::Result<Option<File>> {
    let now = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    let open = current.metadata()?;
    if (now.dev(), now.ino()) == (open.dev(), open.ino()) {
        return Ok(None);
    }
    match File::open(path) {
        Ok(file) => Ok(Some(file)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

fn write_out(bytes: &[u8]) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(text: &str, lines: usize) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, text).unwrap();
        let (tail, end) = tail(&mut File::open(&path).unwrap(), lines).unwrap();
        assert_eq!(end, text.len() as u64);
        String::from_utf8(tail).unwrap()
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(last("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last("a\nb\nc", 2), "b\nc");
        assert_eq!(last("a\nb\n", 5), "a\nb\n");
        assert_eq!(last("a\nb\n", 0), "");
        assert_eq!(last("", 3), "");
    }

    #[test]
    fn tail_reads_past_one_chunk() {
        let line = "x".repeat(1000);
        let text: String = (0..200).map(|n| format!("{n} {line}\n")).collect();
        let tail = last(&text, 150);
        assert_eq!(tail.lines().count(), 150);
        assert!(tail.starts_with(&format!("50 {line}\n")));
    }
}
