//! The demos the README's first lines run, run as a user runs them: the
//! quickstart must end with a 200 after its 503s, and the retry storm must
//! at least start and explain itself (its full run is minutes in a debug
//! build; its numbers are asserted in the root package's `tests/repo`).

use std::process::Command;

#[test]
fn the_quickstart_rides_out_its_flaky_server() {
    let output = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .output()
        .expect("the quickstart runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.matches("-> 503").count(), 3, "{stdout}");
    assert!(stdout.contains("final: 200 OK"), "{stdout}");
    assert!(stdout.contains("after 4 attempts"), "{stdout}");
}

#[test]
fn the_retry_storm_says_how_to_run_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_retry-storm"))
        .arg("--help")
        .output()
        .expect("the demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.starts_with("usage: retry-storm"), "{stdout}");
}
