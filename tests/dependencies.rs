//! What a user pays per feature: the crates `cargo tree` resolves for the
//! package's normal dependencies, counted as the README's feature table
//! states them. `http` stays within 20 crates (no hyper, hyper-util or
//! tokio's `net` unless a feature that needs them is on), and the poller is
//! built only with `poll`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The unique crates of the facade's normal dependency tree with `features`
/// (and no default features), itself included.
fn crates(features: &str) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(root)
        .args([
            "tree",
            "--quiet",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["-p", "tower-backoff", "--no-default-features"]);
    if !features.is_empty() {
        cargo.args(["--features", features]);
    }
    let output = cargo.output().expect("cargo runs");
    assert!(
        output.status.success(),
        "{cargo:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The README's feature table: each feature with the count it states.
fn stated_counts() -> Vec<(String, usize)> {
    let readme = include_str!("../README.md");
    readme
        .lines()
        .skip_while(|line| !line.starts_with("| feature |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let count = cells.get(3)?.parse().ok()?;
            let feature = match cells[1] {
                "(none)" => String::new(),
                named => named.trim_matches('`').to_owned(),
            };
            Some((feature, count))
        })
        .collect()
}

#[test]
fn http_builds_at_most_twenty_crates_and_no_hyper() {
    let http = crates("http");
    assert!(http.len() <= 20, "{} crates: {http:?}", http.len());
    for heavy in ["hyper", "hyper-util", "mio", "socket2"] {
        assert!(!http.contains(heavy), "{heavy} in {http:?}");
    }
    assert!(crates("hyper").contains("hyper-util"));
}

#[test]
fn the_poller_is_built_only_with_poll() {
    assert!(!crates("").contains("tower-backoff-poll"));
    assert!(!crates("http,grpc,tracing,metrics").contains("tower-backoff-poll"));
    assert!(crates("poll").contains("tower-backoff-poll"));
}

#[test]
fn the_readme_states_what_each_feature_builds() {
    let stated = stated_counts();
    assert!(stated.len() >= 8, "{stated:?}");
    for (feature, count) in stated {
        let built = crates(&feature);
        assert_eq!(
            built.len(),
            count,
            "feature `{feature}`: the README says {count}, cargo tree finds {built:?}"
        );
    }
}
