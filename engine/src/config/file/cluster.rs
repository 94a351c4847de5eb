//! `[cluster]`: several nodes sharing one PostgreSQL (docs/cluster.md). An empty `store`
//! leaves the daemon alone on its machine, exactly as without the section.
//!
//! The store's password never comes from the config file: the `store` connection string is
//! refused when it carries one, and the password is read from the environment variable
//! `password_env` names or from `password_file`, a file only the daemon's user may read.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::server::read_private_file;
use super::{http_url, seconds};
use crate::cluster::ClusterConfig;

/// The longest node id, so that it fits the store's column and the logs.
const MAX_NODE_ID: usize = 128;

/// The shortest lease: a heartbeat renews leases three times per lease, and each renewal is a
/// round trip to the store.
const MIN_LEASE_TTL_S: f64 = 0.5;

/// The longest lease: a session of a dead node waits this long before another takes it.
const MAX_LEASE_TTL_S: f64 = 3600.0;

/// `[cluster]` as read from TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// The shared store: `postgresql://user@host:port/db` or `host=… user=… dbname=…`,
    /// without a password. Empty: no cluster.
    pub store: String,
    /// An environment variable that holds the store's password; empty for none.
    pub password_env: String,
    /// A file (owned by the daemon's user, mode 0600 or stricter) that holds the store's
    /// password; empty for none.
    pub password_file: PathBuf,
    /// This node's name in the store; empty for the host name.
    pub node_id: String,
    /// Where the other nodes reach this node's HTTP API; empty for `http://` and
    /// `server.http`.
    pub advertise_url: String,
    /// How long a node's hold on a session lasts without a heartbeat, in seconds.
    pub lease_ttl_s: f64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            store: String::new(),
            password_env: String::new(),
            password_file: PathBuf::new(),
            node_id: String::new(),
            advertise_url: String::new(),
            lease_ttl_s: 5.0,
        }
    }
}

impl ClusterSettings {
    /// Whether the node shares a store with others.
    pub fn enabled(&self) -> bool {
        !self.store.is_empty()
    }

    /// Checks what can be checked without the environment: the connection string, the
    /// node id, the URL and the lease.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if !self.enabled() {
            return Ok(());
        }
        let store = tokio_postgres::Config::from_str(&self.store).map_err(|err| {
            (
                "cluster.store",
                format!("not a PostgreSQL connection string: {err}"),
            )
        })?;
        if store.get_password().is_some() {
            return Err((
                "cluster.store",
                "must not hold the password: set cluster.password_env or cluster.password_file"
                    .into(),
            ));
        }
        if !self.password_env.is_empty() && !self.password_file.as_os_str().is_empty() {
            return Err((
                "cluster.password_file",
                "set cluster.password_env or cluster.password_file, not both".into(),
            ));
        }
        if !self.node_id.is_empty() {
            check_node_id("cluster.node_id", &self.node_id)?;
        }
        if !self.advertise_url.is_empty() {
            http_url("cluster.advertise_url", &self.advertise_url)?;
        }
        seconds("cluster.lease_ttl_s", self.lease_ttl_s, false)?;
        if !(MIN_LEASE_TTL_S..=MAX_LEASE_TTL_S).contains(&self.lease_ttl_s) {
            return Err((
                "cluster.lease_ttl_s",
                format!(
                    "must be {MIN_LEASE_TTL_S} to {MAX_LEASE_TTL_S} seconds, got {}",
                    self.lease_ttl_s
                ),
            ));
        }
        Ok(())
    }

    /// The cluster as the daemon runs it, with the password read; `None` without a store.
    /// `http` is `server.http`, the default of the advertised URL; `var` reads the
    /// environment.
    pub fn resolve(
        &self,
        http: Option<String>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ClusterConfig>, (&'static str, String)> {
        if !self.enabled() {
            return Ok(None);
        }
        self.validate()?;
        let mut store = tokio_postgres::Config::from_str(&self.store)
            .map_err(|err| ("cluster.store", err.to_string()))?;
        if !self.password_env.is_empty() {
            let password = var(&self.password_env).filter(|value| !value.is_empty());
            let Some(password) = password else {
                return Err((
                    "cluster.password_env",
                    format!("the variable {} is not set", self.password_env),
                ));
            };
            store.password(password);
        } else if !self.password_file.as_os_str().is_empty() {
            let text = read_private_file(&self.password_file)
                .map_err(|err| ("cluster.password_file", err))?;
            let password = text.trim_end_matches(['\n', '\r']);
            if password.is_empty() {
                return Err((
                    "cluster.password_file",
                    format!("{}: is empty", self.password_file.display()),
                ));
            }
            store.password(password);
        }
        let node_id = match self.node_id.as_str() {
            "" => host_name().map_err(|err| ("cluster.node_id", err))?,
            given => given.to_owned(),
        };
        check_node_id("cluster.node_id", &node_id)?;
        let advertise_url = match (self.advertise_url.as_str(), http) {
            ("", Some(http)) => format!("http://{http}"),
            (url, _) => url.to_owned(),
        };
        Ok(Some(ClusterConfig {
            store,
            node_id,
            advertise_url,
            lease_ttl: Duration::from_secs_f64(self.lease_ttl_s),
            token: None,
            max_sessions_per_owner: None,
        }))
    }
}

/// Checks a node id: 1 to [`MAX_NODE_ID`] bytes of letters, digits, `.`, `_` and `-`.
fn check_node_id(key: &'static str, id: &str) -> Result<(), (&'static str, String)> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if id.is_empty() || id.len() > MAX_NODE_ID || !id.chars().all(allowed) {
        return Err((
            key,
            format!("must be 1 to {MAX_NODE_ID} letters, digits, '.', '_' or '-', got {id:?}"),
        ));
    }
    Ok(())
}

/// This machine's host name, the default node id.
fn host_name() -> Result<String, String> {
    let name = nix::unistd::gethostname().map_err(|err| format!("read the host name: {err}"))?;
    name.into_string()
        .map_err(|name| format!("the host name {name:?} is not UTF-8; set cluster.node_id"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(store: &str) -> ClusterSettings {
        ClusterSettings {
            store: store.into(),
            node_id: "n1".into(),
            ..ClusterSettings::default()
        }
    }

    #[test]
    fn no_store_is_no_cluster() {
        let resolved = ClusterSettings::default().resolve(None, |_| None);
        assert_eq!(resolved.map(|c| c.is_none()), Ok(true));
    }

    #[test]
    fn a_password_in_the_store_url_is_refused() {
        let err = settings("postgresql://pv:secret@localhost/pv").validate();
        let (key, message) = err.expect_err("a password in the file must be refused");
        assert_eq!(key, "cluster.store");
        assert!(message.contains("password"), "{message}");
        let err = settings("host=/tmp user=pv password=secret").validate();
        assert_eq!(err.map_err(|(key, _)| key), Err("cluster.store"));
    }

    #[test]
    fn the_password_comes_from_the_named_variable() {
        let mut cluster = settings("postgresql://pv@localhost/pv");
        cluster.password_env = "PV_PASSWORD".into();
        let missing = cluster.resolve(None, |_| None).map(|_| ());
        let (key, message) = missing.expect_err("an unset variable is an error");
        assert_eq!(key, "cluster.password_env");
        assert!(message.contains("PV_PASSWORD"), "{message}");
        let resolved = cluster
            .resolve(None, |var| (var == "PV_PASSWORD").then(|| "s3cret".into()))
            .expect("resolves")
            .expect("a cluster");
        assert_eq!(resolved.store.get_password(), Some(&b"s3cret"[..]));
    }

    #[test]
    fn a_password_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret\n").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let mut cluster = settings("postgresql://pv@localhost/pv");
        cluster.password_file = file.clone();
        let (key, message) = cluster
            .resolve(None, |_| None)
            .map(|_| ())
            .expect_err("0644");
        assert_eq!(key, "cluster.password_file");
        assert!(message.contains("0600"), "{message}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let resolved = cluster
            .resolve(None, |_| None)
            .expect("0600")
            .expect("cluster");
        assert_eq!(resolved.store.get_password(), Some(&b"s3cret"[..]));
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut cluster = settings("postgresql://pv@localhost/pv");
        cluster.node_id = "a b".into();
        assert_eq!(cluster.validate().map_err(|e| e.0), Err("cluster.node_id"));
        cluster.node_id = "n1".into();
        cluster.lease_ttl_s = 0.1;
        assert_eq!(
            cluster.validate().map_err(|e| e.0),
            Err("cluster.lease_ttl_s")
        );
        cluster.lease_ttl_s = 5.0;
        cluster.advertise_url = "n1:8787".into();
        assert_eq!(
            cluster.validate().map_err(|e| e.0),
            Err("cluster.advertise_url")
        );
        cluster.advertise_url = String::new();
        cluster.store = "postgresql://[".into();
        assert_eq!(cluster.validate().map_err(|e| e.0), Err("cluster.store"));
    }

    #[test]
    fn defaults_come_from_the_host_and_the_http_address() {
        let mut cluster = settings("postgresql://pv@localhost/pv");
        cluster.node_id = String::new();
        let resolved = cluster
            .resolve(Some("127.0.0.1:8787".into()), |_| None)
            .expect("resolves")
            .expect("a cluster");
        assert_eq!(resolved.advertise_url, "http://127.0.0.1:8787");
        assert_eq!(resolved.lease_ttl, Duration::from_secs(5));
        assert!(!resolved.node_id.is_empty());
    }
}
