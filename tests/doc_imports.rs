//! Users depend on `tower-backoff` alone, so an example that names one of the
//! crates it re-exports (`tower_backoff_http::HttpPolicy` for
//! `tower_backoff::http::HttpPolicy`) fails with E0432 when pasted. This scans
//! every fenced code block a reader sees (the doc comments of the published
//! crates, the README, `docs/*.md`) for those names on lines the reader sees;
//! rustdoc's hidden `# ` lines may name them, which is how a sibling crate's
//! doc test, built without the facade, aliases it.

use std::fs;
use std::path::{Path, PathBuf};

/// The crates behind the facade; none is a dependency a user adds.
const INTERNAL: [&str; 6] = [
    "tower_backoff_core",
    "tower_backoff_http",
    "tower_backoff_grpc",
    "tower_backoff_poll",
    "tower_backoff_shed",
    "tower_backoff_sim",
];

/// Where a visible line of a code block names an internal crate.
#[derive(Debug, PartialEq)]
struct Hit {
    line: usize,
    text: String,
}

/// The text of a doc comment line (`///` or `//!`), without its marker and
/// the one space after it; `None` for any other line.
fn doc_text(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    let rest = trimmed
        .strip_prefix("///")
        .filter(|r| !r.starts_with('/'))
        .or_else(|| trimmed.strip_prefix("//!"))?;
    Some(rest.strip_prefix(' ').unwrap_or(rest))
}

/// A line rustdoc hides in a Rust block: `#` alone or followed by a space or
/// a tab (`##` is an escaped `#`, shown).
fn is_hidden(line: &str) -> bool {
    let trimmed = line.trim_start();
    trimmed == "#" || trimmed.starts_with("# ") || trimmed.starts_with("#\t")
}

/// Whether an info string makes rustdoc treat a block as Rust: no language,
/// `rust`, or rustdoc's attributes only.
fn is_rust(info: &str) -> bool {
    info.split([',', ' ', '\t'])
        .filter(|a| !a.is_empty())
        .all(|a| {
            a == "rust"
                || a.starts_with("edition")
                || [
                    "ignore",
                    "no_run",
                    "compile_fail",
                    "should_panic",
                    "test_harness",
                    "standalone_crate",
                ]
                .contains(&a)
        })
}

/// The visible lines of fenced code blocks in `lines` (1-based numbers) that
/// name an internal crate. Every block counts, Rust or not (a `diff` or a
/// `toml` block is pasted too); only a Rust block hides `# ` lines. A run
/// of doc comment lines is one text: a line that is not part of `lines`
/// (`None`) closes any open block.
fn hits<'a>(lines: impl Iterator<Item = (usize, Option<&'a str>)>) -> Vec<Hit> {
    let mut found = Vec::new();
    // The open block's fence (character, length) and whether it is Rust.
    let mut open: Option<(char, usize, bool)> = None;
    for (number, line) in lines {
        let Some(line) = line else {
            open = None;
            continue;
        };
        let trimmed = line.trim_start();
        let fence = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let length = fence.map_or(0, |f| trimmed.chars().take_while(|c| *c == f).count());
        if let Some(f) = fence.filter(|_| length >= 3) {
            let info = trimmed[length..].trim();
            match open {
                Some((c, l, _)) if c == f && length >= l && info.is_empty() => open = None,
                Some(_) => {}
                None => open = Some((f, length, is_rust(info))),
            }
            continue;
        }
        let Some((_, _, rust)) = open else { continue };
        if rust && is_hidden(line) {
            continue;
        }
        if INTERNAL.iter().any(|name| names(line, name)) {
            found.push(Hit {
                line: number,
                text: line.trim().to_owned(),
            });
        }
    }
    found
}

/// Whether `line` names the crate `name` as a whole identifier (not
/// `tower_backoff_core_extra`, not the package's `tower-backoff-core`).
fn names(line: &str, name: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices(name).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The hits of one file: its doc comments for Rust sources, all of it for
/// Markdown.
fn file_hits(path: &Path) -> Vec<Hit> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().is_some_and(|e| e == "rs") {
        hits(text.lines().enumerate().map(|(n, l)| (n + 1, doc_text(l))))
    } else {
        hits(text.lines().enumerate().map(|(n, l)| (n + 1, Some(l))))
    }
}

/// Files under `dir` whose name ends with `extension`, recursively.
fn files(dir: &Path, extension: &str, into: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, extension, into);
        } else if path.extension().is_some_and(|e| e == extension) {
            into.push(path);
        }
    }
}

/// What a reader of the published docs sees: the facade's sources, every
/// published crate's (the simulator is not published, and its docs are for
/// this repository's developers), the README and the documents.
fn scanned() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    files(&root.join("src"), "rs", &mut paths);
    let crates = fs::read_dir(root.join("crates")).map_or_else(
        |_| Vec::new(),
        |dirs| {
            dirs.map(|d| d.expect("a crate directory").path())
                .filter(|d| !d.ends_with("sim"))
                .collect()
        },
    );
    for dir in crates {
        files(&dir.join("src"), "rs", &mut paths);
    }
    files(&root.join("docs"), "md", &mut paths);
    paths.push(root.join("README.md"));
    paths.retain(|p| p.exists());
    paths.sort();
    paths
}

#[test]
fn no_doc_example_names_an_internal_crate() {
    let paths = scanned();
    // The facade's own sources and the README at least; a wrong root would
    // scan nothing and pass.
    assert!(paths.len() > 10, "scanned only {paths:?}");
    let mut report = String::new();
    for path in &paths {
        for hit in file_hits(path) {
            report += &format!("{}:{}: {}\n", path.display(), hit.line, hit.text);
        }
    }
    assert!(
        report.is_empty(),
        "doc examples that a user cannot paste (name `tower_backoff::..`, and alias it \
         on a hidden `# ` line in a sibling crate):\n{report}"
    );
}

#[test]
fn a_visible_import_of_an_internal_crate_is_found() {
    let source = "\
/// ```
/// use tower_backoff_http::HttpPolicy;
/// ```
fn f() {}
";
    let found = hits(
        source
            .lines()
            .enumerate()
            .map(|(n, l)| (n + 1, doc_text(l))),
    );
    assert_eq!(
        found,
        [Hit {
            line: 2,
            text: "use tower_backoff_http::HttpPolicy;".into()
        }]
    );
}

#[test]
fn hidden_lines_prose_and_other_names_are_not_hits() {
    let source = "\
//! Prose may name tower_backoff_core; so may a `tower-backoff-core` package.
//! ```
//! # extern crate tower_backoff_core as tower_backoff;
//! #\tuse tower_backoff_http::HttpPolicy;
//! use tower_backoff::BackoffLayer;
//! let core = \"tower-backoff-core\"; let _ = tower_backoff_core_extra;
//! ```
//! ```text
//! not Rust: # tower_backoff_grpc is shown
//! ```
";
    let found = hits(
        source
            .lines()
            .enumerate()
            .map(|(n, l)| (n + 1, doc_text(l))),
    );
    assert_eq!(
        found,
        [Hit {
            line: 9,
            text: "not Rust: # tower_backoff_grpc is shown".into()
        }]
    );
}

#[test]
fn a_block_closes_where_the_doc_comment_ends() {
    // An unclosed fence in one item's docs must not swallow the next item's
    // prose, nor turn code outside doc comments into a block.
    let source = "\
/// ```
/// let x = 1;
fn f() {}
/// tower_backoff_http in prose
fn g() { tower_backoff_http::f(); }
";
    let found = hits(
        source
            .lines()
            .enumerate()
            .map(|(n, l)| (n + 1, doc_text(l))),
    );
    assert_eq!(found, []);
}

#[test]
fn markdown_rust_blocks_hide_lines_and_diff_blocks_do_not() {
    let markdown = "\
```rust,no_run
# use tower_backoff_core::Policy;
```
```diff
+use tower_backoff_http::HttpRetryLayer;
```
";
    let found = hits(markdown.lines().enumerate().map(|(n, l)| (n + 1, Some(l))));
    assert_eq!(
        found,
        [Hit {
            line: 5,
            text: "+use tower_backoff_http::HttpRetryLayer;".into()
        }]
    );
}
