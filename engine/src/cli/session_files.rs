//! `pyvisor session cp` and `pyvisor session ls`: a session's work directory from the shell,
//! through the daemon's `session.files.*` methods. `cp LOCAL SESSION:PATH` uploads,
//! `cp SESSION:PATH LOCAL` downloads, in chunks (the first write replaces the file, the rest
//! append; a download reads ranges), so a file of any size moves without being held whole.
//! A `SESSION:` operand is one whose part before the first `:` holds no `/`; write `./a:b`
//! for a local path with a colon.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use clap::Args;
use pyvisor::client::Client;
use pyvisor::rpc::files::FileEntry;

use super::table::{age, bytes, render_or};
use super::target::{refused, Target, EXIT_REFUSED};
use super::EXIT_USAGE;

/// Bytes per upload call: their base64 stays well under the daemon's request limit.
const UPLOAD_CHUNK: usize = 4 * 1024 * 1024;

/// Arguments of `session cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// `LOCAL` or `SESSION:PATH`.
    from: String,
    /// `SESSION:PATH` or `LOCAL` (the other kind than the source). A path ending in `/` (or
    /// an existing local directory) gets the source's file name.
    to: String,
    #[command(flatten)]
    pub target: Target,
}

/// Arguments of `session ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// `SESSION` or `SESSION:DIR`.
    session: String,
    #[command(flatten)]
    pub target: Target,
}

/// A `SESSION:PATH` operand, split; `None` for a local path.
fn remote(operand: &str) -> Option<(&str, &str)> {
    let (session, path) = operand.split_once(':')?;
    (!session.is_empty() && !session.contains('/')).then_some((session, path))
}

/// The last component of `path`, for a destination that names a directory.
fn file_name(path: &str) -> Option<&str> {
    path.rsplit('/').find(|part| !part.is_empty())
}

pub async fn cp(client: &Client, args: &CpArgs) -> u8 {
    match (remote(&args.from), remote(&args.to)) {
        (None, Some((session, path))) => {
            upload(client, Path::new(&args.from), session, path, &args.target).await
        }
        (Some((session, path)), None) => {
            download(client, session, path, Path::new(&args.to), &args.target).await
        }
        _ => {
            eprintln!(
                "pyvisor: session cp copies between a local path and SESSION:PATH, one of each"
            );
            EXIT_USAGE
        }
    }
}

async fn upload(client: &Client, local: &Path, session: &str, path: &str, target: &Target) -> u8 {
    let mut path = path.to_owned();
    if path.is_empty() || path.ends_with('/') {
        let name = local.file_name().map(|n| n.to_string_lossy().into_owned());
        path.push_str(&name.unwrap_or_default());
    }
    let mut file = match File::open(local) {
        Ok(file) => file,
        Err(err) => return local_failure("read", local, &err),
    };
    let mut chunk = vec![0; UPLOAD_CHUNK];
    let mut size = 0;
    let mut first = true;
    loop {
        let n = match read_full(&mut file, &mut chunk) {
            Ok(n) => n,
            Err(err) => return local_failure("read", local, &err),
        };
        if n == 0 && !first {
            break;
        }
        size = match client.write_file(session, &path, &chunk[..n], !first).await {
            Ok(size) => size,
            Err(err) => return refused(err),
        };
        first = false;
        if n < chunk.len() {
            break;
        }
    }
    let done = serde_json::json!({"session": session, "path": path, "size": size});
    target.print(&done, |_| {
        format!(
            "{} -> {session}:{path} ({})\n",
            local.display(),
            bytes(size)
        )
    })
}

async fn download(client: &Client, session: &str, path: &str, local: &Path, target: &Target) -> u8 {
    let mut local = local.to_path_buf();
    if local.is_dir() {
        local.push(file_name(path).unwrap_or("file"));
    }
    // Read the first range before creating anything: a refused path leaves no empty file.
    let mut offset = 0;
    let mut range = match client.read_file(session, path, 0, None).await {
        Ok(range) => range,
        Err(err) => return refused(err),
    };
    let mut file = match File::create(&local) {
        Ok(file) => file,
        Err(err) => return local_failure("create", &local, &err),
    };
    loop {
        if let Err(err) = file.write_all(&range.data) {
            return local_failure("write", &local, &err);
        }
        offset += range.data.len() as u64;
        if range.eof || range.data.is_empty() {
            break;
        }
        range = match client.read_file(session, path, offset, None).await {
            Ok(range) => range,
            Err(err) => return refused(err),
        };
    }
    let done =
        serde_json::json!({"session": session, "path": path, "local": local, "size": offset});
    target.print(&done, |_| {
        format!(
            "{session}:{path} -> {} ({})\n",
            local.display(),
            bytes(offset)
        )
    })
}

pub async fn ls(client: &Client, args: &LsArgs) -> u8 {
    let (session, dir) = match remote(&args.session) {
        Some((session, dir)) => (session, Some(dir)),
        None => (args.session.as_str(), None),
    };
    match client.list_files(session, dir).await {
        Ok(entries) => args.target.print(&entries, |entries| listing(entries)),
        Err(err) => refused(err),
    }
}

/// The table of `session ls`.
fn listing(entries: &[FileEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|entry| {
            let kind = serde_json::to_value(entry.kind).ok();
            vec![
                entry.name.clone(),
                kind.and_then(|k| k.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                bytes(entry.size),
                age(entry.mtime),
            ]
        })
        .collect();
    render_or("no files", &["NAME", "TYPE", "SIZE", "MODIFIED"], &rows)
}

/// Fills `buf` from `file` as far as the file goes; the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

fn local_failure(what: &str, path: &Path, err: &std::io::Error) -> u8 {
    eprintln!("pyvisor: failed to {what} {}: {err}", path.display());
    EXIT_REFUSED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_operands_are_told_from_local_paths() {
        assert_eq!(remote("s-1:data/x.csv"), Some(("s-1", "data/x.csv")));
        assert_eq!(remote("work:"), Some(("work", "")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("/tmp/x"), None);
        assert_eq!(remote(":x"), None);
        assert_eq!(file_name("out/plot.png"), Some("plot.png"));
    }
}
