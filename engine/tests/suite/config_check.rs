//! `pyvisor config check` through the real binary: the effective configuration on stdout, and
//! exit status 2 with the file and key named on stderr when the configuration is wrong.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use tempfile::TempDir;

/// Runs `pyvisor config check` in an empty temp dir, with `HOME` and `XDG_CONFIG_HOME` in
/// temp dirs too so that no real config file is found, and with `envs` set.
fn check(dir: &TempDir, path: Option<&Path>, envs: &[(&str, &str)]) -> Output {
    let cwd = dir.path().join("cwd");
    fs::create_dir_all(&cwd).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_pyvisor"));
    command
        .args(["config", "check"])
        .args(path)
        .current_dir(&cwd)
        .env("HOME", dir.path().join("home"))
        .env("XDG_CONFIG_HOME", dir.path().join("xdg"));
    // Overrides from the environment of whoever runs the tests would change the output.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("PYVISOR_")) {
            command.env_remove(name);
        }
    }
    command
        .envs(envs.iter().copied())
        .output()
        .expect("pyvisor runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn good_file_prints_the_effective_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pyvisor.toml");
    fs::write(
        &path,
        "[pool]\nmin_idle = 4\n[engine]\npreload = [\"json\"]\n",
    )
    .unwrap();
    let out = check(&dir, Some(&path), &[("PYVISOR_LIMITS__TIMEOUT_S", "12.5")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let first = stdout.lines().next().unwrap();
    assert_eq!(first, format!("# source: {}", path.display()));
    let effective: toml::Table = stdout.parse().expect("the output is TOML");
    assert_eq!(effective["pool"]["min_idle"].as_integer(), Some(4));
    assert_eq!(effective["pool"]["max_idle"].as_integer(), Some(8));
    assert_eq!(effective["engine"]["preload"][0].as_str(), Some("json"));
    assert_eq!(effective["limits"]["timeout_s"].as_float(), Some(12.5));
}

#[test]
fn without_a_file_prints_the_defaults() {
    // The system file is last in the search order and cannot be moved for the test.
    if Path::new("/etc/pyvisor/config.toml").exists() {
        eprintln!("skipped: /etc/pyvisor/config.toml exists on this machine");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = check(&dir, None, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("# source: built-in defaults (no config file found)\n"),
        "{stdout}"
    );
    let effective: toml::Table = stdout.parse().expect("the output is TOML");
    assert_eq!(effective["pool"]["max_total"].as_integer(), Some(64));
}

#[test]
fn search_order_finds_the_file_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cwd").join("pyvisor.toml");
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, "[pool]\nmax_total = 7\n").unwrap();
    let out = check(&dir, None, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(&format!("# source: {}\n", path.display())),
        "{stdout}"
    );
    let effective: toml::Table = stdout.parse().unwrap();
    assert_eq!(effective["pool"]["max_total"].as_integer(), Some(7));
}

#[test]
fn unknown_key_exits_2_naming_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pyvisor.toml");
    fs::write(&path, "[pool]\nmax_idel = 9\n").unwrap();
    let out = check(&dir, Some(&path), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        text(&out.stderr).trim_end(),
        format!("pyvisor: {}: unknown key pool.max_idel", path.display())
    );
}

#[test]
fn missing_explicit_file_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    let out = check(&dir, Some(&path), &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(stderr.contains("no such file"), "{stderr}");
}

#[test]
fn unknown_env_override_exits_2_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(&dir, None, &[("PYVISOR_POOL__SIZE", "3")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("PYVISOR_POOL__SIZE: unknown key pool.size"));
}

#[test]
fn defaults_print_the_resolved_paths_and_never_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(
        &dir,
        None,
        &[
            ("PYVISOR_SERVER__TOKEN", "do-not-print-me"),
            ("XDG_RUNTIME_DIR", "/run/user/4242"),
            ("XDG_STATE_HOME", "/var/tmp/state-home"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("# source: built-in defaults (no config file found) and the environment overrides below"),
        "{stdout}"
    );
    assert!(
        stdout.contains("# resolved socket:    /run/user/4242/pyvisor/pyvisor.sock"),
        "{stdout}"
    );
    assert!(
        stdout.contains("# resolved state dir: /var/tmp/state-home/pyvisor"),
        "{stdout}"
    );
    assert!(stdout.contains("token = \"<set>\""), "{stdout}");
    assert!(!stdout.contains("do-not-print-me"), "{stdout}");
}
