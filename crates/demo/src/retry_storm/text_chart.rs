//! The headline in the terminal: each strategy's goodput over time as a row
//! of block characters, the outage marked under them, so the result reads at
//! a glance without opening the SVG.

use std::fmt::Write;

use tower_backoff_sim::StormReport;

const BLOCKS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
const COLUMNS: usize = 60;

/// Goodput over time, one row per strategy (name, report), all on one scale.
pub fn goodput(runs: &[(&str, &StormReport)]) -> String {
    let Some((_, first)) = runs.first() else {
        return String::new();
    };
    let intervals = runs.iter().map(|(_, r)| r.clients.len()).max().unwrap_or(0);
    if intervals == 0 {
        return String::new();
    }
    // Each column is the mean of the intervals it covers.
    let per_column = intervals.div_ceil(COLUMNS);
    let columns = intervals.div_ceil(per_column);
    let rows: Vec<Vec<f64>> = runs
        .iter()
        .map(|(_, report)| {
            let goodput: Vec<f64> = report.goodput().collect();
            goodput
                .chunks(per_column)
                .map(|chunk| chunk.iter().sum::<f64>() / chunk.len() as f64)
                .collect()
        })
        .collect();
    let top = rows.iter().flatten().copied().fold(0.0, f64::max).max(1e-9);
    let name_width = runs
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(0);
    let seconds = first.interval.as_secs_f64() * intervals as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Goodput over time (successful requests/s; full block = {top:.0}/s; {seconds:.0} s):\n"
    );
    for ((name, _), row) in runs.iter().zip(&rows) {
        let line: String = row
            .iter()
            .map(|v| BLOCKS[((v / top) * 8.0).round().clamp(0.0, 8.0) as usize])
            .collect();
        let _ = writeln!(out, "{name:>name_width$} │{line}│");
    }
    let column_time = first.interval.as_secs_f64() * per_column as f64;
    let outage: String = (0..columns)
        .map(|c| {
            let (start, end) = (c as f64 * column_time, (c + 1) as f64 * column_time);
            let down =
                first.outage.start.as_secs_f64() < end && start < first.outage.end.as_secs_f64();
            if down {
                '▔'
            } else {
                ' '
            }
        })
        .collect();
    let _ = writeln!(out, "{:>name_width$} │{outage}│", "server down");
    out
}
