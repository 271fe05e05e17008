//! The README's Rust snippets are doc tests (`ReadmeDoctests` in `src/lib.rs`);
//! this keeps any of them from opting out with `ignore`, which would let it
//! drift from the API unnoticed. `no_run` still compiles, so it is allowed.

/// The info strings of the README's fenced code blocks that rustdoc treats as
/// Rust (no language, `rust`, or only rustdoc's own attributes), with their
/// line numbers.
fn rust_fences(markdown: &str) -> Vec<(usize, &str)> {
    let mut fences = Vec::new();
    // The fence character and length of the open block, if any.
    let mut open: Option<(char, usize)> = None;
    for (number, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let Some(fence) = trimmed.chars().next().filter(|c| *c == '`' || *c == '~') else {
            continue;
        };
        let length = trimmed.chars().take_while(|c| *c == fence).count();
        if length < 3 {
            continue;
        }
        let info = trimmed[length..].trim();
        match open {
            Some((c, l)) if c == fence && length >= l && info.is_empty() => open = None,
            Some(_) => {}
            None => {
                open = Some((fence, length));
                let attributes: Vec<_> = info
                    .split([',', ' ', '\t'])
                    .filter(|a| !a.is_empty())
                    .collect();
                let is_rust = attributes
                    .iter()
                    .all(|a| *a == "rust" || RUSTDOC_ATTRIBUTES.contains(a))
                    || attributes.contains(&"rust");
                if is_rust {
                    fences.push((number + 1, info));
                }
            }
        }
    }
    fences
}

/// Attributes rustdoc reads on a code block that is Rust without saying so.
const RUSTDOC_ATTRIBUTES: &[&str] = &[
    "ignore",
    "should_panic",
    "no_run",
    "compile_fail",
    "edition2015",
    "edition2018",
    "edition2021",
    "edition2024",
];

/// The markdown files whose Rust snippets are doc tests (`src/lib.rs`).
const DOCUMENTS: [(&str, &str); 3] = [
    ("README.md", include_str!("../README.md")),
    ("docs/GUIDE.md", include_str!("../docs/GUIDE.md")),
    ("docs/RESULTS.md", include_str!("../docs/RESULTS.md")),
];

#[test]
fn no_readme_snippet_is_ignored_by_the_doc_tests() {
    let readme = include_str!("../README.md");
    assert!(
        !rust_fences(readme).is_empty(),
        "the README has Rust snippets to test"
    );
    for (name, markdown) in DOCUMENTS {
        let ignored: Vec<_> = rust_fences(markdown)
            .into_iter()
            .filter(|(_, info)| info.split([',', ' ']).any(|a| a.starts_with("ignore")))
            .collect();
        assert!(
            ignored.is_empty(),
            "{name} snippets marked `ignore` (line, info): {ignored:?}; make them compile \
             (hidden `# ` lines for set-up, `no_run` if they need a network)"
        );
    }
}

#[test]
fn the_readme_is_short_and_shows_the_four_jobs_first() {
    let readme = include_str!("../README.md");
    let lines: Vec<&str> = readme.lines().collect();
    assert!(lines.len() <= 300, "{} lines", lines.len());
    let line_of = |needle: &str| {
        lines
            .iter()
            .position(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} is in the README"))
    };
    for needle in [
        "reqwest::Client::new()",
        "GrpcRetryLayer::new(&config)",
        "retry(|| fetch())",
    ] {
        assert!(
            line_of(needle) < 150,
            "{needle:?} at line {}",
            line_of(needle) + 1
        );
    }
    for section in [
        "## What a layer with no options does",
        "**Runtime.**",
        "## Stacking it",
    ] {
        line_of(section);
    }
}

#[test]
fn the_fence_reader_finds_rust_and_skips_other_languages() {
    let markdown = "```sh\ncargo test\n```\n\
                    ```rust\nlet a = 1;\n```\n\
                    ```\nlet b = 2;\n```\n\
                    ```rust,ignore\nnope\n```\n\
                    ```no_run\nlet c = 3;\n```\n\
                    ````text\n```rust,ignore\n```\n````\n\
                    ```rust,edition2021\nlet d = 4;\n```\n";
    let fences = rust_fences(markdown);
    assert_eq!(
        fences,
        [
            (4, "rust"),
            (7, ""),
            (10, "rust,ignore"),
            (13, "no_run"),
            (20, "rust,edition2021")
        ]
    );
}
