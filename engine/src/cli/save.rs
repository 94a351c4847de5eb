//! `pyvisor exec --save DIR`: rich output (PNG, SVG, HTML, JSON displays, and the HTML of a
//! final value such as a DataFrame) written to `DIR/<n>-<kind>.<ext>` instead of dropped.
//! `<n>` goes on from the highest number already in `DIR`, so repeated calls never overwrite
//! each other's files; `<kind>` is `display` or `result`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use pyvisor::{DisplayData, ExecutionResult};

/// A rich output written to a file.
pub struct Saved {
    pub path: PathBuf,
    pub mime: String,
    pub bytes: usize,
}

/// The file extension and encoding of each MIME type worth a file; text/plain is printed.
const KINDS: &[(&str, &str, Encoding)] = &[
    ("image/png", "png", Encoding::Base64),
    ("image/jpeg", "jpg", Encoding::Base64),
    ("image/svg+xml", "svg", Encoding::Text),
    ("text/html", "html", Encoding::Text),
    ("application/json", "json", Encoding::Text),
    ("text/markdown", "md", Encoding::Text),
    ("text/latex", "tex", Encoding::Text),
];

#[derive(Clone, Copy)]
enum Encoding {
    Text,
    Base64,
}

/// Creates `dir` if needed; fails when it cannot be a directory to write into.
pub fn prepare(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let probe = tempfile::NamedTempFile::new_in(dir)?;
    probe.close()
}

/// Whether [`save`] writes this display to a file.
pub fn is_saved(display: &DisplayData) -> bool {
    kind(&display.mime).is_some()
}

/// Writes the rich outputs of `result` into `dir`, in order: its displays, then the HTML of
/// its value.
pub fn save(dir: &Path, result: &ExecutionResult) -> io::Result<Vec<Saved>> {
    let mut next = next_number(dir)?;
    let html = result
        .result
        .as_ref()
        .and_then(|value| value.html.as_ref())
        .map(|html| ("result", "text/html", html));
    let displays = result
        .display
        .iter()
        .map(|display| ("display", display.mime.as_str(), &display.data));
    let mut saved = Vec::new();
    for (what, mime, data) in displays.chain(html) {
        let Some((extension, encoding)) = kind(mime) else {
            continue;
        };
        let content = match encoding {
            Encoding::Text => data.as_bytes().to_vec(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|err| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a {mime} display is not base64: {err}"),
                    )
                })?,
        };
        let path = dir.join(format!("{next}-{what}.{extension}"));
        // `create_new`: never overwrite a file, even one another call just wrote.
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut file| io::Write::write_all(&mut file, &content))?;
        saved.push(Saved {
            path,
            mime: mime.to_owned(),
            bytes: content.len(),
        });
        next += 1;
    }
    Ok(saved)
}

fn kind(mime: &str) -> Option<(&'static str, Encoding)> {
    KINDS
        .iter()
        .find(|(known, ..)| *known == mime)
        .map(|(_, extension, encoding)| (*extension, *encoding))
}

/// One more than the highest `<n>` of a `<n>-…` file in `dir`.
fn next_number(dir: &Path) -> io::Result<u64> {
    let mut highest = 0;
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let number = name
            .to_str()
            .and_then(|name| name.split_once('-'))
            .and_then(|(number, _)| number.parse::<u64>().ok());
        highest = highest.max(number.unwrap_or(0));
    }
    Ok(highest + 1)
}
