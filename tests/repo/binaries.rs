//! The tests are grouped into a few binaries with `autotests = false`, so a
//! file in `tests/` that no binary names would silently never run. This checks
//! that each one is a module of `tests/suite`, of `tests/repo`, or a `[[test]]`
//! of its own in Cargo.toml.

use std::path::Path;

#[test]
fn every_test_file_belongs_to_a_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    let named = [
        read("tests/suite/main.rs"),
        read("tests/repo/main.rs"),
        read("Cargo.toml"),
    ]
    .concat();
    let mut orphans = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(root.join("tests")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        files += 1;
        let as_module = format!("#[path = \"../{name}\"]\nmod {stem};");
        let as_binary = format!("path = \"tests/{name}\"");
        if !named.contains(&as_module) && !named.contains(&as_binary) {
            orphans.push(name);
        }
    }
    assert!(
        files > 60,
        "found only {files} test files: wrong directory?"
    );
    assert!(orphans.is_empty(), "test files no binary runs: {orphans:?}");
}
