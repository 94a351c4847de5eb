//! `[sandbox]`: how the daemon confines its workers (see [`SandboxConfig`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{SandboxConfig, SandboxLayer};

/// The uid range the daemon uses when it runs as root and `uid_range` is `"auto"`.
const DAEMON_UID_RANGE: (u32, u32) = (61_000, 61_999);

/// `[sandbox]` as read from TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxSettings {
    /// `"FIRST-LAST"`: every worker gets its own uid from the range; `"auto"`: 61000-61999
    /// when the daemon runs as root, off otherwise; `""` or `"off"`: off.
    pub uid_range: String,
    /// Restrict each worker's file access with Landlock.
    pub landlock: bool,
    /// Install the seccomp filter in each worker.
    pub seccomp: bool,
    /// Whether sessions may open internet sockets unless `session.create` says otherwise.
    pub network: bool,
    /// Paths every worker may read besides the defaults.
    pub read_paths: Vec<PathBuf>,
    /// Layers whose absence is a start-up error: `"landlock"`, `"seccomp"`, `"uid"`.
    pub require: Vec<String>,
    /// Where the workers' private directories go; empty for the default.
    pub dir: PathBuf,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        Self {
            uid_range: "auto".into(),
            landlock: true,
            seccomp: true,
            network: true,
            read_paths: Vec::new(),
            require: Vec::new(),
            dir: PathBuf::new(),
        }
    }
}

impl SandboxSettings {
    /// Checks what types do not: the range's syntax and the layer names.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        self.uid_range()?;
        self.layers()?;
        Ok(())
    }

    fn uid_range(&self) -> Result<Option<(u32, u32)>, (&'static str, String)> {
        let value = self.uid_range.trim();
        match value {
            "" | "off" => return Ok(None),
            "auto" => return Ok(nix::unistd::geteuid().is_root().then_some(DAEMON_UID_RANGE)),
            _ => {}
        }
        let bad = || {
            (
                "sandbox.uid_range",
                format!("must be \"FIRST-LAST\" with 0 < FIRST <= LAST, \"auto\" or \"off\", got {value:?}"),
            )
        };
        let (first, last) = value.split_once('-').ok_or_else(bad)?;
        let first: u32 = first.trim().parse().map_err(|_| bad())?;
        let last: u32 = last.trim().parse().map_err(|_| bad())?;
        if first == 0 || first > last {
            return Err(bad());
        }
        Ok(Some((first, last)))
    }

    fn layers(&self) -> Result<Vec<SandboxLayer>, (&'static str, String)> {
        self.require
            .iter()
            .map(|name| {
                SandboxLayer::from_name(name).ok_or_else(|| {
                    (
                        "sandbox.require",
                        format!("knows \"landlock\", \"seccomp\" and \"uid\", got {name:?}"),
                    )
                })
            })
            .collect()
    }

    /// The engine's sandbox configuration (validated settings).
    pub fn config(&self) -> SandboxConfig {
        SandboxConfig {
            uid_range: self
                .uid_range()
                .ok()
                .flatten()
                .map(|(first, last)| first..=last),
            landlock: self.landlock,
            seccomp: self.seccomp,
            network: self.network,
            read_paths: self.read_paths.clone(),
            require: self.layers().unwrap_or_default(),
            dir: Some(self.dir.clone()).filter(|dir| !dir.as_os_str().is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_and_layers_are_checked() {
        let mut settings = SandboxSettings {
            uid_range: "61000-61009".into(),
            require: vec!["uid".into(), "seccomp".into()],
            ..SandboxSettings::default()
        };
        assert!(settings.validate().is_ok());
        let config = settings.config();
        assert_eq!(config.uid_range, Some(61_000..=61_009));
        assert_eq!(config.require, [SandboxLayer::Uid, SandboxLayer::Seccomp]);
        for bad in ["0-5", "9-3", "61000", "a-b"] {
            settings.uid_range = bad.into();
            assert_eq!(
                settings.validate().unwrap_err().0,
                "sandbox.uid_range",
                "{bad}"
            );
        }
        settings.uid_range = "off".into();
        assert_eq!(settings.config().uid_range, None);
        settings.require = vec!["apparmor".into()];
        assert_eq!(settings.validate().unwrap_err().0, "sandbox.require");
    }
}
