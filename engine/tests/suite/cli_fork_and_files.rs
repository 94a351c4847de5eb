//! `pyvisor session cp`, `ls` and `fork` through the real binary against a daemon whose workers
//! run as uids of their own: a file larger than one call's chunk goes up and comes back byte
//! for byte, the listing shows it, refusals and misuse get their exit statuses, and a fork
//! makes named clones that start from the source.

use crate::common;

use std::path::Path;

use common::{text, Daemon};
use serde_json::Value;

/// A daemon with a uid range of its own, so that no other test's workers share its uids.
fn daemon(home: &Path) -> Daemon {
    let config = home.join("config/pyvisor");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        "[pool]\nmin_idle = 1\n[sandbox]\nuid_range = \"62750-62759\"\n",
    )
    .unwrap();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(Daemon::start_in(home, &[], &[]))
}

fn pyvisor(daemon: &Daemon, args: &[&str]) -> (Option<i32>, String, String) {
    let out = common::run_in(daemon, args[0], &args[1..], "");
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn ok(daemon: &Daemon, args: &[&str]) -> String {
    let (status, stdout, stderr) = pyvisor(daemon, args);
    assert_eq!(status, Some(0), "{args:?}: {stdout}{stderr}");
    stdout
}

#[test]
fn cp_moves_files_both_ways_and_ls_lists_them() {
    let home = tempfile::tempdir().unwrap();
    let daemon = daemon(home.path());
    ok(
        &daemon,
        &["exec", "--session", "nb", "import os\nos.mkdir('out')"],
    );
    // 9 MiB: three upload calls, two reads down.
    let data: Vec<u8> = (0..9 * 1024 * 1024u32)
        .map(|i| (i * 7 % 253) as u8)
        .collect();
    let local = home.path().join("data.bin");
    std::fs::write(&local, &data).unwrap();
    let up = ok(
        &daemon,
        &["session", "cp", local.to_str().unwrap(), "nb:in/"],
    );
    assert!(up.contains("nb:in/data.bin (9.0 MiB)"), "{up}");
    let seen = ok(
        &daemon,
        &[
            "exec",
            "--session",
            "nb",
            "print(os.path.getsize('in/data.bin'))",
        ],
    );
    assert_eq!(seen.trim(), data.len().to_string());
    let back = home.path().join("back");
    std::fs::create_dir(&back).unwrap();
    ok(
        &daemon,
        &["session", "cp", "nb:in/data.bin", back.to_str().unwrap()],
    );
    assert!(
        std::fs::read(back.join("data.bin")).unwrap() == data,
        "the copy differs"
    );

    let table = ok(&daemon, &["session", "ls", "nb"]);
    assert!(table.starts_with("NAME "), "{table}");
    assert!(table.contains("in ") && table.contains("out "), "{table}");
    let listed: Value = serde_json::from_str(&ok(
        &daemon,
        &["session", "ls", "nb:in", "--format", "json"],
    ))
    .unwrap();
    assert_eq!(listed[0]["name"], "data.bin");
    assert_eq!(listed[0]["type"], "file");
    assert_eq!(listed[0]["size"], data.len());

    // Refusals: an escape, a missing file (and no empty local file made for it).
    let (status, _, stderr) = pyvisor(&daemon, &["session", "cp", "nb:../../etc/passwd", "x"]);
    assert_eq!(status, Some(1), "{stderr}");
    assert!(stderr.contains("-32602"), "{stderr}");
    let missing = home.path().join("missing");
    let (status, _, _) = pyvisor(
        &daemon,
        &["session", "cp", "nb:nope", missing.to_str().unwrap()],
    );
    assert_eq!(status, Some(1));
    assert!(!missing.exists());
    // Misuse: two local paths.
    let (status, _, stderr) = pyvisor(&daemon, &["session", "cp", "./a", "./b"]);
    assert_eq!(status, Some(2), "{stderr}");

    // Fork: named clones, as text and as JSON.
    let text = ok(&daemon, &["session", "fork", "nb", "--name", "nb-a"]);
    assert!(
        text.contains("name nb-a") && text.contains("forked 1 clone(s)"),
        "{text}"
    );
    let forked: Value = serde_json::from_str(&ok(
        &daemon,
        &["session", "fork", "nb", "--count", "2", "--format", "json"],
    ))
    .unwrap();
    assert_eq!(forked["sessions"].as_array().unwrap().len(), 2);
    let seen = ok(
        &daemon,
        &[
            "exec",
            "--session",
            "nb-a",
            "print(os.path.getsize('in/data.bin'))",
        ],
    );
    assert_eq!(
        seen.trim(),
        data.len().to_string(),
        "a clone shares the work directory"
    );
    let (status, _, stderr) = pyvisor(&daemon, &["session", "fork", "nb", "--count", "17"]);
    assert_eq!(status, Some(1), "{stderr}");
}
