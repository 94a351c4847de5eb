//! The embedding example runs as a plain tokio program and prints what the README says.

use std::process::Command;

#[test]
fn quickstart_runs_from_a_plain_tokio_main() {
    // Its own state directory: the default one is locked by any engine already running here.
    let state = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .env("XDG_STATE_HOME", state.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout, "area: 12.566370614359172\nstatus: Ok\n");
}
