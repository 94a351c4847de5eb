//! The documentation a newcomer follows, checked against the repository and the binary:
//! every relative link resolves and nothing points outside the repository, the README's
//! shell snippet finds the daemon's socket with and without `XDG_RUNTIME_DIR`, and every
//! `--config` help states the search order itself instead of sending the reader elsewhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the engine crate sits in the repository")
        .to_owned()
}

/// The Markdown pages a user reads: the README, `docs/`, and the client's README.
fn pages() -> Vec<PathBuf> {
    let root = repo();
    let mut pages = vec![
        root.join("README.md"),
        root.join("clients/python/README.md"),
    ];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/ exists") {
        let path = entry.expect("a docs entry").path();
        if path.extension().is_some_and(|ext| ext == "md") {
            pages.push(path);
        }
    }
    pages
}

/// The targets of the inline Markdown links `[text](target)` of `text`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("](") {
        rest = &rest[start + 2..];
        if let Some(end) = rest.find(')') {
            targets.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    targets
}

#[test]
fn every_relative_link_resolves_and_nothing_refers_outside_the_repository() {
    let pages = pages();
    for name in ["protocol.md", "python.md", "metrics.md"] {
        assert!(
            pages.iter().any(|page| page.ends_with(name)),
            "docs/{name} is missing"
        );
    }
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for forbidden in ["SPEC.md", "shared/", "build machine"] {
            assert!(
                !text.contains(forbidden),
                "{} mentions {forbidden:?}",
                page.display()
            );
        }
        for target in link_targets(&text) {
            if target.starts_with("http") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap_or_default();
            let resolved = page.parent().unwrap().join(file);
            assert!(
                resolved.exists(),
                "{} links to {target}, which does not exist",
                page.display()
            );
        }
        // The README links every page of docs/.
        if page.parent().is_some_and(|dir| dir.ends_with("docs")) {
            let link = format!("(docs/{})", page.file_name().unwrap().to_string_lossy());
            assert!(readme.contains(&link), "the README does not link {link}");
        }
    }
}

/// The resolved socket `pyvisor config check` prints, in an environment of `vars` alone.
fn resolved_socket(vars: &BTreeMap<&str, String>) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pyvisor"))
        .args(["config", "check"])
        .env_clear()
        .envs(vars)
        .current_dir(&vars["HOME"])
        .output()
        .expect("pyvisor runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("# resolved socket:"))
        .unwrap_or_else(|| panic!("no resolved socket in {stdout}"))
        .trim()
        .to_owned()
}

/// The socket path the `sock=` lines of `page` compute in an environment of `vars` alone.
fn snippet_socket(page: &Path, vars: &BTreeMap<&str, String>) -> String {
    let text = std::fs::read_to_string(page).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("sock="))
        .collect();
    assert!(!lines.is_empty(), "{} has no sock= lines", page.display());
    let script = format!("{}\nprintf %s \"$sock\"", lines.join("\n"));
    let out = Command::new("sh")
        .args(["-c", &script])
        .env_clear()
        .envs(vars)
        .output()
        .expect("sh runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_socat_snippets_find_the_daemons_socket_with_and_without_xdg_runtime_dir() {
    let home = tempfile::tempdir().unwrap();
    let mut vars = BTreeMap::from([
        ("HOME", home.path().display().to_string()),
        ("PATH", std::env::var("PATH").unwrap_or_default()),
    ]);
    for page in [repo().join("README.md"), repo().join("docs/protocol.md")] {
        vars.remove("XDG_RUNTIME_DIR");
        let without = resolved_socket(&vars);
        assert_eq!(
            without,
            home.path()
                .join(".pyvisor/pyvisor.sock")
                .display()
                .to_string()
        );
        assert_eq!(snippet_socket(&page, &vars), without, "{}", page.display());
        vars.insert("XDG_RUNTIME_DIR", "/run/user/4242".into());
        let with = resolved_socket(&vars);
        assert_eq!(with, "/run/user/4242/pyvisor/pyvisor.sock");
        assert_eq!(snippet_socket(&page, &vars), with, "{}", page.display());
    }
}

#[test]
fn every_config_option_states_the_search_order_instead_of_pointing_elsewhere() {
    let commands: [&[&str]; 7] = [
        &["serve"],
        &["exec"],
        &["repl"],
        &["config", "check"],
        &["daemon", "start"],
        &["daemon", "stop"],
        &["daemon", "status"],
    ];
    for command in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_pyvisor"))
            .args(command)
            .arg("--help")
            .output()
            .expect("pyvisor runs");
        assert_eq!(out.status.code(), Some(0), "{command:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        for needed in [
            "$PYVISOR_CONFIG",
            "./pyvisor.toml",
            "$XDG_CONFIG_HOME/pyvisor/config.toml",
            "/etc/pyvisor/config.toml",
        ] {
            assert!(
                help.contains(needed),
                "{command:?} --help lacks {needed}:\n{help}"
            );
        }
        assert!(
            !help.contains("search order of"),
            "{command:?} --help sends the reader to another command:\n{help}"
        );
    }
}
