//! What the compiler tells a user who gets it wrong: each case is a program a
//! newcomer writes, checked by `cargo check` in a crate of its own that
//! depends on this package by path, and the test asserts on rustc's error
//! (what a UI test with `trybuild` would, without building every
//! dev-dependency of this package a second time).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Each case: its file name, its program, and words its error must contain.
const CASES: &[(&str, &str, &[&str])] = &[
    (
        "service_not_clone",
        r#"
use tower::{Service, ServiceBuilder};
use tower_backoff::BackoffLayer;

struct Counter(u32); // not Clone

impl Service<u32> for Counter {
    type Response = u32;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u32, std::io::Error>>;
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, n: u32) -> Self::Future {
        self.0 += n;
        std::future::ready(Ok(self.0))
    }
}

fn main() {
    let _ = ServiceBuilder::new().layer(BackoffLayer::new()).service(Counter(0));
}
"#,
        &["is not `Clone`", "tower::buffer::Buffer"],
    ),
    (
        "rate_limit_inside",
        r#"
use std::time::Duration;
use tower::{service_fn, ServiceBuilder};
use tower_backoff::BackoffLayer;

fn main() {
    let _ = ServiceBuilder::new()
        .layer(BackoffLayer::new())
        .rate_limit(10, Duration::from_secs(1))
        .service(service_fn(|n: u32| async move { Ok::<_, std::io::Error>(n) }));
}
"#,
        &["CloneForRetries", "Clone", "RateLimit"],
    ),
    (
        "retry_hook_of_another_type",
        r#"
use tower_backoff::retry;

#[tokio::main]
async fn main() {
    let result = retry(|| async { Err::<u32, _>(std::io::Error::other("busy")) })
        .on_retry(|_, error: &String| eprintln!("{error}"))
        .await;
    let _ = result;
}
"#,
        &["expected", "std::io::Error", "String"],
    ),
];

/// Where the cases' crate lives: beside this test's own build, in a target
/// directory of its own so that its `cargo check` never waits on the one
/// running this test.
fn dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("in target/<profile>/deps")
        .to_path_buf();
    target.join("compile-errors")
}

/// Checks every case at once (`--keep-going`) and returns rustc's output.
fn checked() -> &'static str {
    static OUTPUT: OnceLock<String> = OnceLock::new();
    OUTPUT.get_or_init(|| {
        let dir = dir();
        let bin = dir.join("src/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut manifest = format!(
            r#"[package]
name = "compile-errors"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
tower-backoff = {{ path = {root:?} }}
tower = {{ version = "0.5.2", features = ["util", "limit", "buffer"] }}
tokio = {{ version = "1.50", features = ["macros", "rt-multi-thread"] }}
"#
        );
        manifest.push_str(&siblings_patch(root));
        std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
        // The same versions as this package's own build: nothing to fetch.
        std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
        for (name, program, _) in CASES {
            std::fs::write(bin.join(format!("{name}.rs")), program).unwrap();
        }
        let output = Command::new(env!("CARGO"))
            .args([
                "check",
                "--bins",
                "--keep-going",
                "--offline",
                "--color",
                "never",
            ])
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .env_remove("RUSTFLAGS")
            .output()
            .expect("cargo runs");
        assert!(
            !output.status.success(),
            "every case should fail to compile"
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    })
}

/// `[patch.crates-io]` for the crates this package re-exports, at the paths
/// its own build uses: the repository's `crates/`, or, for the packaged
/// crate `.ci/package.sh` tests, the tarballs unpacked beside it (where the
/// manifest names them by version only, and crates.io may not have them).
/// Both are members of the workspace the test runs in, which is all
/// `--no-deps` reads: resolving every dependency would download the ones of
/// other platforms, which `--offline` refuses.
fn siblings_patch(root: &Path) -> String {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--no-deps",
        ])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut patch = String::from("\n[patch.crates-io]\n");
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        let manifest = Path::new(package["manifest_path"].as_str().unwrap());
        if name.starts_with("tower-backoff-") && package["source"].is_null() {
            let dir = manifest.parent().unwrap();
            patch.push_str(&format!("{name} = {{ path = {dir:?} }}\n"));
        }
    }
    patch
}

/// The errors reported in the case `name`'s file.
fn errors_of(name: &str) -> String {
    let file = format!("src/bin/{name}.rs");
    checked()
        .split("\nerror")
        .filter(|block| block.contains(&file))
        .collect::<Vec<_>>()
        .join("\nerror")
}

fn assert_case(name: &str) {
    let (_, _, words) = CASES.iter().find(|(n, _, _)| *n == name).unwrap();
    let errors = errors_of(name);
    assert!(!errors.is_empty(), "no error in {name}:\n{}", checked());
    for word in *words {
        assert!(
            errors.contains(word),
            "{name}'s error should say `{word}`:\n{errors}"
        );
    }
}

#[test]
fn a_service_that_is_not_clone_is_told_it_must_be_clone() {
    assert_case("service_not_clone");
}

#[test]
fn a_rate_limit_inside_the_layer_is_told_it_must_be_clone() {
    assert_case("rate_limit_inside");
}

#[test]
fn a_retry_hook_that_asks_for_another_error_type_does_not_compile() {
    assert_case("retry_hook_of_another_type");
}
