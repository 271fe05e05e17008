//! The interaction matrix (`docs/MATRIX.md`) cannot go stale: every pair of
//! the eleven capabilities has exactly one row, and every test a row names
//! still exists under that name.

use std::collections::BTreeMap;
use std::path::Path;

const MATRIX: &str = include_str!("../docs/MATRIX.md");

const CAPABILITIES: [&str; 11] = [
    "retry",
    "hedge",
    "breaker",
    "budget",
    "pacing",
    "deadline",
    "attempt timeout",
    "replay",
    "buffering",
    "server delay",
    "readiness",
];

/// One row of the table: its pair, in the order of `CAPABILITIES`, and its
/// tests cell.
struct Row<'a> {
    pair: (usize, usize),
    tests: &'a str,
}

fn capability(name: &str) -> usize {
    CAPABILITIES
        .iter()
        .position(|c| *c == name)
        .unwrap_or_else(|| panic!("`{name}` is not one of the eleven capabilities"))
}

fn rows() -> Vec<Row<'static>> {
    MATRIX
        .lines()
        .filter(|line| line.starts_with("| ") && line.contains(" × "))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 3, "a row has three cells: {line}");
            let (a, b) = cells[0]
                .trim()
                .split_once(" × ")
                .unwrap_or_else(|| panic!("a pair reads `a × b`: {line}"));
            let (a, b) = (capability(a), capability(b));
            assert_ne!(a, b, "a pair of one capability: {line}");
            Row {
                pair: (a.min(b), a.max(b)),
                tests: cells[2].trim(),
            }
        })
        .collect()
}

/// The tests a cell names, as `(file, test name)`.
fn named_tests(cell: &str) -> Vec<(&str, &str)> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(|named| {
            named
                .rsplit_once("::")
                .unwrap_or_else(|| panic!("a test is named `path::test_name`: {named}"))
        })
        .collect()
}

#[test]
fn every_pair_of_the_eleven_capabilities_has_exactly_one_row() {
    let mut seen = BTreeMap::new();
    for row in rows() {
        *seen.entry(row.pair).or_insert(0) += 1;
    }
    let mut missing = Vec::new();
    for (a, first) in CAPABILITIES.iter().enumerate() {
        for (b, second) in CAPABILITIES.iter().enumerate().skip(a + 1) {
            match seen.get(&(a, b)) {
                Some(1) => {}
                Some(n) => panic!("{first} × {second} has {n} rows"),
                None => missing.push(format!("{first} × {second}")),
            }
        }
    }
    assert!(missing.is_empty(), "pairs without a row: {missing:?}");
    assert_eq!(seen.len(), 55);
}

#[test]
fn every_test_the_matrix_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut gone = Vec::new();
    for row in rows() {
        for (file, name) in named_tests(row.tests) {
            let source = std::fs::read_to_string(root.join(file))
                .unwrap_or_else(|e| panic!("{file}, named in the matrix: {e}"));
            if !source.contains(&format!("fn {name}(")) {
                gone.push(format!("{file}::{name}"));
            }
        }
    }
    assert!(
        gone.is_empty(),
        "tests the matrix names but nobody has: {gone:?}"
    );
}

#[test]
fn every_cell_names_a_test_or_says_missing_or_defect_and_the_status_line_counts_them() {
    let (mut covered, mut missing, mut defects) = (0, 0, 0);
    for row in rows() {
        let named = named_tests(row.tests).len();
        match row.tests {
            "MISSING" => missing += 1,
            cell if cell.starts_with("DEFECT") => {
                assert!(named > 0, "a DEFECT row names its ignored test: {cell}");
                defects += 1;
            }
            cell => {
                assert!(named > 0, "a cell names a test, or says MISSING: {cell}");
                covered += 1;
            }
        }
    }
    println!("interaction matrix: {covered} covered, {missing} MISSING, {defects} DEFECT");
    let status =
        format!("Status: 55 pairs, {covered} covered, {missing} MISSING, {defects} DEFECT.");
    let head: String = MATRIX.lines().take(4).collect::<Vec<_>>().join(" ");
    assert!(
        head.contains(&status),
        "the first lines of docs/MATRIX.md should say `{status}`"
    );
}
