//! Where the config file is looked for and how it is read: `--config`, `$PYVISOR_CONFIG`,
//! then `./pyvisor.toml`, the user's file and the system-wide one, the first that exists,
//! parsed as TOML with the line and column of a syntax error.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};

use toml::Table;

use super::{LoadContext, CONFIG_VAR};
use crate::errors::ConfigError;

impl LoadContext {
    /// A variable's value, with an empty one taken as unset.
    fn var(&self, name: &str) -> Option<&OsStr> {
        self.vars
            .get(name)
            .map(OsString::as_os_str)
            .filter(|value| !value.is_empty())
    }

    /// An absolute directory from a variable; XDG says relative ones are to be ignored.
    fn dir_var(&self, name: &str) -> Option<PathBuf> {
        self.var(name)
            .map(PathBuf::from)
            .filter(|dir| dir.is_absolute())
    }

    /// `$XDG_CONFIG_HOME/pyvisor/config.toml`, else `~/.config/pyvisor/config.toml`.
    fn user_file(&self) -> Option<PathBuf> {
        let base = self
            .dir_var("XDG_CONFIG_HOME")
            .or_else(|| self.var("HOME").map(|home| Path::new(home).join(".config")))?;
        Some(base.join("pyvisor").join("config.toml"))
    }
}

/// The file to read and its text: the explicit one, `$PYVISOR_CONFIG`, or the first of the
/// search order that exists.
pub(super) fn find_file(
    explicit: Option<&Path>,
    ctx: &LoadContext,
) -> Result<Option<(PathBuf, String)>, ConfigError> {
    let named = match (explicit, ctx.var(CONFIG_VAR)) {
        (Some(path), _) => Some((path, "--config")),
        (None, Some(path)) => Some((Path::new(path), "$PYVISOR_CONFIG")),
        (None, None) => None,
    };
    if let Some((path, named_by)) = named {
        let path = ctx.cwd.join(path);
        return match read_if_exists(&path)? {
            Some(text) => Ok(Some((path, text))),
            None => Err(ConfigError::Missing { path, named_by }),
        };
    }
    let candidates = [
        Some(ctx.cwd.join("pyvisor.toml")),
        ctx.user_file(),
        Some(ctx.system_file.clone()),
    ];
    for path in candidates.into_iter().flatten() {
        if let Some(text) = read_if_exists(&path)? {
            return Ok(Some((path, text)));
        }
    }
    Ok(None)
}

/// A file's text, or `None` when it does not exist.
fn read_if_exists(path: &Path) -> Result<Option<String>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses a file's TOML, with the line and column of a syntax error.
pub(super) fn parse_file(path: &Path, text: &str) -> Result<Table, ConfigError> {
    text.parse::<Table>().map_err(|err| {
        let message = err.message().trim_end().to_owned();
        let location = err.span().map(|span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: ")
        });
        ConfigError::Parse {
            path: path.to_path_buf(),
            message: format!("{}{message}", location.unwrap_or_default()),
        }
    })
}
