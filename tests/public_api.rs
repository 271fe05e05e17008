//! The public surface as rustdoc shows it to users, with every feature on:
//! at most 120 names (types, traits, functions, constants) across the facade
//! and the client crates it re-exports, at most 20 in the server half
//! (`tower_backoff::shed`, a crate of its own with its own users), and every
//! public enum and struct with public
//! fields `#[non_exhaustive]`, so that a variant or a field can be added in a
//! minor release. Built from the HTML `cargo doc` writes (`all.html` lists a
//! crate's items, re-exports inlined; hidden items are left out), so what
//! counts is what a user reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The crates a user reaches through `tower-backoff`'s features.
const CRATES: [&str; 5] = [
    "tower_backoff",
    "tower_backoff_http",
    "tower_backoff_grpc",
    "tower_backoff_poll",
    SERVER_HALF,
];

/// The server half, counted on its own.
const SERVER_HALF: &str = "tower_backoff_shed";

const MAX_NAMES: usize = 120;
const MAX_SERVER_NAMES: usize = 20;

/// Enums and pub-field structs that may stay exhaustive, and why. Empty:
/// every one can grow.
const DELIBERATELY_EXHAUSTIVE: &[&str] = &[];

/// The `doc` directory of the target directory this test runs from, after
/// documenting the crates there (once for all tests).
fn docs() -> &'static Result<PathBuf, String> {
    static DOCS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DOCS.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        // target/<profile>/deps/<test> -> target
        let target = exe
            .ancestors()
            .nth(3)
            .ok_or("the test binary is not in target/<profile>/deps")?;
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["doc", "--quiet", "--no-deps", "--all-features"])
            .args(
                CRATES
                    .map(|c| ["-p".to_owned(), c.replace('_', "-")])
                    .concat(),
            )
            .arg("--target-dir")
            .arg(target);
        let output = cargo.output().map_err(|e| format!("{cargo:?}: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "{cargo:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(target.join("doc"))
    })
}

fn docs_dir() -> &'static Path {
    match docs() {
        Ok(dir) => dir,
        Err(error) => panic!("documenting the crates failed: {error}"),
    }
}

/// The item paths `all.html` of `krate` lists, e.g. `breaker::Probe`.
fn items(krate: &str) -> Vec<String> {
    let html = std::fs::read_to_string(docs_dir().join(krate).join("all.html"))
        .expect("cargo doc writes all.html");
    html.split("<li><a href=\"")
        .skip(1)
        // Links to the page's own sections ("Structs") are not items.
        .filter(|entry| !entry.starts_with('#'))
        .filter_map(|entry| {
            let text = entry.split_once("\">")?.1;
            Some(text.split_once("</a>")?.0.to_owned())
        })
        .collect()
}

/// One name per item a user can name: an item re-exported at the top and
/// in its module (`Hedging`, `hedge::Hedging`) counts once, and so does an
/// item of a sibling crate the facade renders inline (`http::HttpPolicy` in
/// `tower_backoff`'s list is `tower_backoff_http::HttpPolicy`).
fn public_names() -> BTreeSet<String> {
    CRATES
        .iter()
        .flat_map(|krate| {
            items(krate).into_iter().map(move |path| {
                let name = path.rsplit("::").next().unwrap_or(&path).to_owned();
                let module = path.split("::").next().unwrap_or_default();
                match module {
                    "http" | "grpc" | "poll" | "shed" if *krate == "tower_backoff" => {
                        format!("tower_backoff_{module}::{name}")
                    }
                    _ => format!("{krate}::{name}"),
                }
            })
        })
        .collect()
}

/// Every `enum.*.html` and `struct.*.html` page under `dir`.
fn type_pages(dir: &Path, pages: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a doc directory").flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            type_pages(&path, pages);
        } else if name.starts_with("enum.") || name.starts_with("struct.") {
            pages.push(path);
        }
    }
}

#[test]
fn at_most_120_public_names_and_20_in_the_server_half() {
    let (server, names): (BTreeSet<String>, BTreeSet<String>) = public_names()
        .into_iter()
        .partition(|name| name.starts_with(&format!("{SERVER_HALF}::")));
    assert!(
        server.len() <= MAX_SERVER_NAMES && server.contains("tower_backoff_shed::ShedLayer"),
        "{} public names in the server half: {server:#?}",
        server.len()
    );
    // The documentation is really there: the core's own names are.
    for expected in [
        "tower_backoff::BackoffLayer",
        "tower_backoff_http::HttpRetryLayer",
    ] {
        assert!(names.contains(expected), "{expected} missing: {names:#?}");
    }
    assert!(
        names.len() <= MAX_NAMES,
        "{} public names, more than {MAX_NAMES}: {names:#?}",
        names.len()
    );
    println!(
        "{} public names, {} in the server half",
        names.len(),
        server.len()
    );
}

#[test]
fn every_public_enum_and_pub_field_struct_can_grow() {
    let mut pages = Vec::new();
    for krate in CRATES {
        type_pages(&docs_dir().join(krate), &mut pages);
    }
    assert!(pages.len() > 20, "{pages:?}");
    let mut exhaustive = BTreeSet::new();
    for page in &pages {
        let html = std::fs::read_to_string(page).expect("a doc page");
        // An item of a private module has a page at its public path and a
        // redirect at the private one.
        if html.contains("http-equiv=\"refresh\"") {
            continue;
        }
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        let is_enum = name.starts_with("enum.");
        let has_pub_fields = html.contains("id=\"structfield.");
        let type_name = name.split('.').nth(1).unwrap_or_default().to_owned();
        if (is_enum || has_pub_fields)
            && !html.contains("non-exhaustive")
            && !DELIBERATELY_EXHAUSTIVE.contains(&type_name.as_str())
        {
            exhaustive.insert(page.strip_prefix(docs_dir()).unwrap().display().to_string());
        }
    }
    assert!(
        exhaustive.is_empty(),
        "not #[non_exhaustive]: {exhaustive:#?}"
    );
}
