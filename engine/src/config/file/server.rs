//! `[server]`: how the daemon listens and runs, and who may call it: the admin uids and the
//! socket's group, the admin token and the tokens bound to one owner, and the HTTP guards.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::unistd::{Group, Uid};
use serde::{Deserialize, Serialize};

use super::{at_least, seconds};
use crate::rpc::MAX_OWNER_BYTES;
use crate::server::{HttpAccess, OwnerToken, SocketAccess};

/// `[server]`: how the daemon listens and runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// Unix socket path; empty for the default (see [`super::Settings::socket_path`]).
    pub socket: PathBuf,
    /// HTTP listen address such as `127.0.0.1:8787`; empty for no HTTP server.
    pub http: String,
    /// The admin bearer token; empty for none.
    pub token: String,
    /// Tokens bound to one owner each: `[[server.tokens]] owner, token_file`.
    pub tokens: Vec<TokenSettings>,
    /// Uids that are admins on the socket, besides root and the daemon's own user.
    pub admin_uids: Vec<u32>,
    /// A group (name or number) whose members may connect to the socket as owners; empty
    /// keeps the socket private to the daemon's user.
    pub socket_group: String,
    /// `Origin` values an HTTP request may carry; any other is refused with 403.
    pub http_allowed_origins: Vec<String>,
    /// Host names HTTP requests may name besides loopback ones; any other gets 421.
    pub http_allowed_hosts: Vec<String>,
    /// How long an HTTP request's headers, and then its body, may take to arrive.
    pub http_request_timeout_s: f64,
    /// Longest JSON-RPC request line accepted.
    pub max_request_bytes: usize,
    /// Connections held at once per listener: more are refused on the socket, wait on HTTP.
    pub max_connections: usize,
    /// How long running executions may finish after SIGTERM, in seconds.
    pub shutdown_grace_s: f64,
    /// The daemon's PID file; empty for `pyvisor.pid` beside the socket.
    pub pid_file: PathBuf,
    /// Where `pyvisor daemon start` sends the daemon's stderr; empty for `pyvisor.log` beside
    /// the socket.
    pub log_file: PathBuf,
    /// Send `WATCHDOG=1` when systemd sets `WATCHDOG_USEC`.
    pub watchdog: bool,
}

/// One `[[server.tokens]]` entry: whoever presents the token in `token_file` is `owner`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    pub owner: String,
    /// A file holding the token, owned by the daemon's user with mode 0600 or stricter.
    pub token_file: PathBuf,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            socket: PathBuf::new(),
            http: String::new(),
            token: String::new(),
            tokens: Vec::new(),
            admin_uids: Vec::new(),
            socket_group: String::new(),
            http_allowed_origins: Vec::new(),
            http_allowed_hosts: Vec::new(),
            http_request_timeout_s: 10.0,
            max_request_bytes: 16 * 1024 * 1024,
            max_connections: 1024,
            shutdown_grace_s: 30.0,
            pid_file: PathBuf::new(),
            log_file: PathBuf::new(),
            watchdog: true,
        }
    }
}

impl ServerSettings {
    /// Checks the ranges that types do not, and reads the token files.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.token.chars().any(char::is_whitespace) {
            return Err(("server.token", "must not contain whitespace".into()));
        }
        at_least("server.max_request_bytes", self.max_request_bytes, 1024)?;
        at_least("server.max_connections", self.max_connections, 1)?;
        seconds("server.shutdown_grace_s", self.shutdown_grace_s, true)?;
        seconds(
            "server.http_request_timeout_s",
            self.http_request_timeout_s,
            false,
        )?;
        self.socket_gid()
            .map_err(|err| ("server.socket_group", err))?;
        self.owner_tokens().map_err(|err| ("server.tokens", err))?;
        Ok(())
    }

    /// Who may use the socket, and as whom. The workers' uids are the caller's to add.
    pub fn socket_access(&self) -> Result<SocketAccess, String> {
        Ok(SocketAccess {
            admin_uids: self.admin_uids.clone(),
            group: self.socket_gid()?,
            refused_uids: None,
        })
    }

    /// Who may call the HTTP API and from where (the admin token aside), with the token
    /// files read.
    pub fn http_access(&self) -> Result<HttpAccess, String> {
        Ok(HttpAccess {
            owner_tokens: self.owner_tokens()?,
            allowed_origins: self.http_allowed_origins.clone(),
            allowed_hosts: self.http_allowed_hosts.clone(),
            request_timeout: Duration::from_secs_f64(self.http_request_timeout_s),
        })
    }

    /// The gid of `socket_group`, a name or a number.
    fn socket_gid(&self) -> Result<Option<u32>, String> {
        let group = self.socket_group.trim();
        if group.is_empty() {
            return Ok(None);
        }
        if let Ok(gid) = group.parse::<u32>() {
            return Ok(Some(gid));
        }
        match Group::from_name(group) {
            Ok(Some(found)) => Ok(Some(found.gid.as_raw())),
            Ok(None) => Err(format!("no group is called {group:?}")),
            Err(err) => Err(format!("look up group {group:?}: {err}")),
        }
    }

    /// The owner tokens, each read from its file after checking who may read or replace it.
    fn owner_tokens(&self) -> Result<Vec<OwnerToken>, String> {
        let mut tokens: Vec<OwnerToken> = Vec::with_capacity(self.tokens.len());
        for entry in &self.tokens {
            if entry.owner.is_empty() || entry.owner.len() > MAX_OWNER_BYTES {
                return Err(format!(
                    "owner {:?}: must be 1 to {MAX_OWNER_BYTES} bytes",
                    entry.owner
                ));
            }
            let token = read_token_file(&entry.token_file)?;
            if token == self.token || tokens.iter().any(|other| other.token == token) {
                return Err(format!(
                    "{}: the same token is given twice; each caller needs its own",
                    entry.token_file.display()
                ));
            }
            tokens.push(OwnerToken {
                owner: entry.owner.clone(),
                token,
            });
        }
        Ok(tokens)
    }
}

/// The token in `path`: a file owned by the daemon's user that nobody else may read or write
/// (mode 0600 or stricter), holding one token without whitespace.
fn read_token_file(path: &Path) -> Result<String, String> {
    let text = read_private_file(path)?;
    let token = text.trim();
    if token.is_empty() || token.chars().any(char::is_whitespace) {
        return Err(format!(
            "{}: must hold one token without whitespace",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// The text of `path`, a file owned by the daemon's user that nobody else may read or write
/// (mode 0600 or stricter): a secret.
pub(super) fn read_private_file(path: &Path) -> Result<String, String> {
    let named = path.display();
    let meta = std::fs::metadata(path).map_err(|err| format!("{named}: {err}"))?;
    let own_uid = Uid::effective().as_raw();
    if meta.uid() != own_uid {
        return Err(format!(
            "{named}: belongs to uid {}, not to the daemon's user (uid {own_uid})",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{named}: mode {:04o} lets other users read it; make it 0600",
            meta.mode() & 0o7777
        ));
    }
    std::fs::read_to_string(path).map_err(|err| format!("{named}: {err}"))
}
