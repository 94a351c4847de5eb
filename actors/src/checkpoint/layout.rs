//! Where checkpoints live: the default state directory, and the names of session directories,
//! checkpoint files and temporary files under the store's root.

use std::env;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::errors::CheckpointError;

/// The directory under the root that holds one directory per session.
pub(super) const SESSIONS_DIR: &str = "sessions";

/// The start of every session directory's name; never empty, never `.` or `..`.
const SESSION_DIR_PREFIX: &str = "s-";

/// The longest session directory name, well under the 255 bytes file systems allow.
const MAX_SESSION_DIR_LEN: usize = 120;

/// The end of every checkpoint file's name.
const CHECKPOINT_SUFFIX: &str = ".ckpt";

/// Sequences are zero-padded to this many digits (all of `u64`), so names sort by sequence.
const SEQUENCE_DIGITS: usize = 20;

/// The start of a temporary file's name: hidden, and never a `.ckpt` name.
pub(super) const TEMP_PREFIX: &str = ".partial-";

/// The end of a temporary file's name.
pub(super) const TEMP_SUFFIX: &str = ".tmp";

/// Creates the directory `path` with mode 0700; one that exists already is fine.
pub(super) fn create_private_dir(path: &Path) -> io::Result<()> {
    match DirBuilder::new().mode(0o700).create(path) {
        Err(err) if err.kind() != io::ErrorKind::AlreadyExists => Err(err),
        _ => Ok(()),
    }
}

/// A name no other call of this process gives: `prefix`, the time and a counter.
pub(super) fn unique_name(prefix: &str) -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{nanos:x}-{count}")
}

/// The default state directory: `$XDG_STATE_HOME/pyvisor`, else `~/.local/state/pyvisor`.
///
/// A relative `XDG_STATE_HOME` is ignored, as the XDG base directory specification asks.
pub fn default_state_dir() -> Result<PathBuf, CheckpointError> {
    state_dir_from(env::var_os("XDG_STATE_HOME"), env::var_os("HOME"))
        .ok_or(CheckpointError::NoStateDir)
}

fn state_dir_from(xdg_state_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let xdg = xdg_state_home
        .map(PathBuf::from)
        .filter(|path| path.is_absolute());
    let base = match xdg {
        Some(path) => path,
        None => home
            .filter(|home| !home.is_empty())
            .map(|home| PathBuf::from(home).join(".local").join("state"))?,
    };
    Some(base.join("pyvisor"))
}

/// The directory name for a session: `s-` then the name with every byte outside
/// `[A-Za-z0-9_-]` percent-encoded; a name too long for that is cut and ends in `~` and a
/// hash of the whole name.
pub(super) fn session_dir_name(session: &str) -> String {
    let mut name = String::from(SESSION_DIR_PREFIX);
    for byte in session.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            name.push(char::from(byte));
        } else {
            write!(name, "%{byte:02X}").expect("writing to a String does not fail");
        }
    }
    if name.len() > MAX_SESSION_DIR_LEN {
        // The name is ASCII, so any byte index is a char boundary.
        name.truncate(MAX_SESSION_DIR_LEN - 17);
        write!(name, "~{:016x}", fnv1a64(session.as_bytes()))
            .expect("writing to a String does not fail");
    }
    name
}

/// Whether a directory entry could be a session directory.
pub(super) fn is_session_dir_name(name: &OsStr) -> bool {
    name.to_str()
        .is_some_and(|name| name.starts_with(SESSION_DIR_PREFIX))
}

/// The file name of the checkpoint with this sequence.
pub(super) fn checkpoint_file_name(sequence: u64) -> String {
    format!(
        "{sequence:0width$}{CHECKPOINT_SUFFIX}",
        width = SEQUENCE_DIGITS
    )
}

/// The sequence of a checkpoint file name, if it is one this store writes.
pub(super) fn parse_checkpoint_file_name(name: &OsStr) -> Option<u64> {
    let digits = name.to_str()?.strip_suffix(CHECKPOINT_SUFFIX)?;
    if digits.len() != SEQUENCE_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether a file name is that of a temporary file of a save.
pub(super) fn is_temp_file_name(name: &OsStr) -> bool {
    name.to_str()
        .is_some_and(|name| name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX))
}

/// 64-bit FNV-1a: tiny, and stable across Rust releases, unlike `DefaultHasher`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use std::path::{Component, Path};

    use super::*;

    fn assert_single_normal_component(name: &str) {
        let components: Vec<_> = Path::new(name).components().collect();
        assert!(
            matches!(components[..], [Component::Normal(_)]),
            "{name:?} is not one plain path component"
        );
        assert!(name.len() <= MAX_SESSION_DIR_LEN, "{name:?} is too long");
    }

    #[test]
    fn session_names_cannot_escape_the_sessions_directory() {
        let long = "a".repeat(10_000);
        let long_slashes = "../".repeat(1_000);
        for session in [
            "../x",
            "/",
            "",
            ".",
            "..",
            "a/b",
            "/etc/passwd",
            "x\0y",
            "é",
            &long,
            &long_slashes,
        ] {
            assert_single_normal_component(&session_dir_name(session));
        }
        assert_eq!(session_dir_name(""), "s-");
        assert_eq!(session_dir_name("../x"), "s-%2E%2E%2Fx");
        assert_eq!(session_dir_name("my-session_1"), "s-my-session_1");
    }

    #[test]
    fn distinct_names_get_distinct_directories() {
        let long_a = format!("{}a", "x".repeat(500));
        let long_b = format!("{}b", "x".repeat(500));
        let names = ["a b", "a%20b", "a_b", "A_b", &long_a, &long_b];
        let dirs: std::collections::HashSet<_> =
            names.iter().map(|name| session_dir_name(name)).collect();
        assert_eq!(dirs.len(), names.len());
    }

    #[test]
    fn checkpoint_file_names_round_trip_and_sort_by_sequence() {
        assert_eq!(checkpoint_file_name(7), "00000000000000000007.ckpt");
        for sequence in [0, 1, 9, 10, u64::MAX] {
            let name = checkpoint_file_name(sequence);
            assert_eq!(
                parse_checkpoint_file_name(OsStr::new(&name)),
                Some(sequence)
            );
        }
        assert!(checkpoint_file_name(9) < checkpoint_file_name(10));
        for other in [
            "7.ckpt",
            "junk.ckpt",
            "00000000000000000007.ckpt.tmp",
            ".partial-abc.tmp",
        ] {
            assert_eq!(
                parse_checkpoint_file_name(OsStr::new(other)),
                None,
                "{other}"
            );
        }
        assert!(is_temp_file_name(OsStr::new(".partial-abc123.tmp")));
        assert!(!is_temp_file_name(OsStr::new("00000000000000000007.ckpt")));
    }

    #[test]
    fn state_dir_prefers_an_absolute_xdg_state_home() {
        let dir = |xdg: Option<&str>, home: Option<&str>| {
            state_dir_from(xdg.map(OsString::from), home.map(OsString::from))
        };
        assert_eq!(
            dir(Some("/xdg"), Some("/home/u")),
            Some(PathBuf::from("/xdg/pyvisor"))
        );
        assert_eq!(
            dir(Some("relative"), Some("/home/u")),
            Some(PathBuf::from("/home/u/.local/state/pyvisor"))
        );
        assert_eq!(
            dir(None, Some("/home/u")),
            Some(PathBuf::from("/home/u/.local/state/pyvisor"))
        );
        assert_eq!(dir(None, Some("")), None);
        assert_eq!(dir(None, None), None);
    }
}
