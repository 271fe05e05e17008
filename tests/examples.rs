//! The examples, run as a reader runs them: each must exit successfully, and
//! every request it means to succeed must have succeeded. The examples are
//! the crate's first users, and they run with the layer's defaults: one that
//! fails its own requests is a defect of the defaults.
//!
//! Each example talks to its own server on 127.0.0.1. The first test to run
//! builds the examples: `cargo test --test suite examples::` alone builds none, and
//! would run whatever binaries an older build left.
#![cfg(feature = "hyper")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// Far longer than any example needs (the slowest, paced_writers below,
/// writes 100 records at 50 a second): past it, the example is stuck.
const TIME_LIMIT: Duration = Duration::from_secs(60);

#[cfg(all(feature = "tracing", feature = "metrics"))]
#[test]
fn observability_gets_a_200_for_each_of_its_three_requests() {
    let out = run("observability", &[]);
    for n in 1..=3 {
        assert_line_starting(&out, &format!("request {n}: 200 OK"));
    }
}

#[test]
fn hyper_client_gets_its_get_and_put_through_and_sends_the_post_once() {
    let out = run("hyper_client", &[]);
    let through = out.lines().filter(|line| is_200_after_3(line)).count();
    assert_eq!(
        through, 2,
        "the GET and the PUT, each after a 503 and a 429:\n{out}"
    );
    assert!(
        out.contains("= 503 Service Unavailable after 1 attempt(s)"),
        "the POST is sent once:\n{out}"
    );
}

#[cfg(feature = "reqwest")]
#[test]
fn reqwest_client_gets_its_get_through_and_retries_every_failure_as_configured() {
    let out = run("reqwest_client", &[]);
    assert!(
        out.lines().any(is_200_after_3),
        "the GET, after two 503s:\n{out}"
    );
    // The other two end as the server and the closed port make them, each
    // after every attempt: the POST's outage spends its host's budget, not
    // the closed port's.
    assert!(
        out.contains("= 503 Service Unavailable after 3 attempt(s)"),
        "{out}"
    );
    assert!(out.contains("= error (connect: true)"), "{out}");
    let refused = out.lines().filter(|l| l.contains("<- error:")).count();
    assert_eq!(
        refused, 3,
        "the closed port, tried three times:
{out}"
    );
}

#[cfg(feature = "grpc")]
#[test]
fn grpc_client_gets_both_health_checks_served() {
    let out = run("grpc_client", &[]);
    assert_line_starting(&out, "client: call 1 -> Serving after 3 attempt(s)");
    assert_line_starting(&out, "client: call 2 -> Serving after 2 attempt(s)");
}

/// 100 records at 50 a second take 2 s; 20 s leaves room for a slow machine.
/// Every record is stored in time. The budget pays for the retries of 429s
/// too, so while the pacing measures at full speed some writes come back to
/// the job, each after its delay, and are written again: their count is
/// printed, and the store admitted each record once.
#[test]
fn paced_writers_store_every_record_with_the_default_budget() {
    let out = run(
        "paced_writers",
        &["--writes", "100", "--rate", "50", "--seconds", "20"],
    );
    assert_line_starting(&out, "100 records in ");
    assert!(
        out.contains("requests the layer gave up on (written again): "),
        "{out}"
    );
    assert_line_starting(&out, "server: 100 admitted, ");
}

/// A status line of a request that got its 200 on the third attempt.
fn is_200_after_3(line: &str) -> bool {
    line.trim_start()
        .starts_with("= 200 OK after 3 attempt(s),")
}

fn assert_line_starting(out: &str, start: &str) {
    assert!(
        out.lines().any(|l| l.starts_with(start)),
        "no line starting {start:?} in:\n{out}"
    );
}

/// Runs example `name` with `args` and returns what it printed to stdout.
/// Panics, with everything it printed, if it fails or outlives
/// [`TIME_LIMIT`].
fn run(name: &str, args: &[&str]) -> String {
    if let Err(error) = built() {
        panic!("building the examples failed:\n{error}");
    }
    let path = examples_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let mut child = Command::new(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Read both pipes while it runs, so a chatty example never blocks on a
    // full one.
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the example can be waited on") {
            break Some(status);
        }
        if started.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    match status {
        Some(status) if status.success() => stdout,
        Some(status) => panic!("{name} {args:?} exited with {status}\n{stdout}\n{stderr}"),
        None => panic!("{name} {args:?} still ran after {TIME_LIMIT:?}\n{stdout}\n{stderr}"),
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// `target/<profile>/examples`: this test runs from `target/<profile>/deps`.
fn examples_dir() -> PathBuf {
    profile_dir().join("examples")
}

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("in target/<profile>/deps");
    deps.parent().expect("in target/<profile>").to_path_buf()
}

/// Builds, once for all tests, the examples above with the features this
/// test was built with, into the target directory and profile it runs
/// from: the same build `cargo test` makes, so usually one that is fresh.
fn built() -> &'static Result<(), String> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let features = [
            ("http", cfg!(feature = "http")),
            ("hyper", cfg!(feature = "hyper")),
            ("reqwest", cfg!(feature = "reqwest")),
            ("reqwest-middleware", cfg!(feature = "reqwest-middleware")),
            ("tracing", cfg!(feature = "tracing")),
            ("metrics", cfg!(feature = "metrics")),
            ("grpc", cfg!(feature = "grpc")),
            ("poll", cfg!(feature = "poll")),
        ];
        let examples = [
            ("hyper_client", true),
            ("paced_writers", true),
            (
                "observability",
                cfg!(all(feature = "tracing", feature = "metrics")),
            ),
            ("reqwest_client", cfg!(feature = "reqwest")),
            ("grpc_client", cfg!(feature = "grpc")),
        ];
        let on = |list: &[(&'static str, bool)]| -> Vec<&'static str> {
            list.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect()
        };
        let profile_dir = profile_dir();
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => "dev",
        };
        let target_dir = profile_dir.parent().unwrap_or(Path::new("target"));
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args(["build", "--quiet", "--profile", profile])
            .arg("--manifest-path")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target_dir)
            .args(["--features", &on(&features).join(",")]);
        for example in on(&examples) {
            cargo.args(["--example", example]);
        }
        let output = cargo.output().map_err(|e| format!("{cargo:?}: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cargo:?}: {}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    })
}
