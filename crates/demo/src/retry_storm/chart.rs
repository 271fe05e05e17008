//! The SVG chart: the server's load and the clients' goodput over time, one
//! line per strategy, the outage shaded.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use tower_backoff_sim::StormReport;

const COLORS: [RGBColor; 7] = [
    RGBColor(140, 140, 140), // no retries
    RGBColor(214, 39, 40),   // fixed interval
    RGBColor(255, 127, 14),  // exponential
    RGBColor(31, 119, 180),  // exponential + jitter
    RGBColor(44, 160, 44),   // + budget
    RGBColor(148, 103, 189), // defaults + pacing
    RGBColor(0, 0, 0),       // defaults
];

const OUTAGE: RGBColor = RGBColor(250, 215, 215);

/// Writes the chart of `runs` (name, report) to `path`.
pub fn draw(path: &Path, runs: &[(&str, &StormReport)]) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Retry storm: a server down for a while, and what each retry strategy does to it",
        ("sans-serif", 20),
    )?;
    let (top, bottom) = root.split_vertically(370);
    in_flight(&top, runs)?;
    goodput(&bottom, runs)?;
    root.present()?;
    Ok(())
}

/// Lines drawn first are drawn wider, so that strategies whose curves are
/// the same (they all collapse alike) still show under one another.
fn line_style(index: usize, lines: usize) -> ShapeStyle {
    let width = 2 + (lines - 1 - index.min(lines - 1)) as u32;
    COLORS[index % COLORS.len()].stroke_width(width)
}

/// Each interval's value is plotted at its middle.
fn midpoints(report: &StormReport) -> impl Iterator<Item = f64> + '_ {
    let half = report.interval.as_secs_f64() / 2.0;
    report.times().map(move |t| t.as_secs_f64() + half)
}

fn horizon(runs: &[(&str, &StormReport)]) -> f64 {
    runs.iter()
        .map(|(_, r)| r.interval.as_secs_f64() * r.server.len() as f64)
        .fold(1.0, f64::max)
}

/// In-flight requests on a log scale: the recovering strategies stay in the
/// hundreds while the others climb to hundreds of thousands.
fn in_flight(
    area: &DrawingArea<SVGBackend, Shift>,
    runs: &[(&str, &StormReport)],
) -> Result<(), Box<dyn std::error::Error>> {
    let end = horizon(runs);
    let peak = runs
        .iter()
        .flat_map(|(_, r)| r.in_flight())
        .max()
        .unwrap_or(1)
        .max(10) as f64;
    let top = 10f64.powf(peak.log10().ceil());
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .caption(
            "requests held by the server (log scale)",
            ("sans-serif", 16),
        )
        .build_cartesian_2d(0f64..end, (1f64..top).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("in flight")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let outage = runs[0].1.outage.clone();
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [
                (outage.start.as_secs_f64(), 1.0),
                (outage.end.as_secs_f64(), top),
            ],
            OUTAGE.filled(),
        )))?
        .label("server down")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], OUTAGE.filled()));
    for (i, (name, report)) in runs.iter().enumerate() {
        let style = line_style(i, runs.len());
        let points = midpoints(report)
            .zip(report.in_flight())
            .map(|(t, n)| (t, (n as f64).max(1.0)));
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Successful logical requests per second.
fn goodput(
    area: &DrawingArea<SVGBackend, Shift>,
    runs: &[(&str, &StormReport)],
) -> Result<(), Box<dyn std::error::Error>> {
    let end = horizon(runs);
    let peak = runs
        .iter()
        .flat_map(|(_, r)| r.goodput())
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .caption(
            "goodput: requests that succeeded, per second",
            ("sans-serif", 16),
        )
        .build_cartesian_2d(0f64..end, 0f64..peak * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("successes / s")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let outage = runs[0].1.outage.clone();
    chart.draw_series(std::iter::once(Rectangle::new(
        [
            (outage.start.as_secs_f64(), 0.0),
            (outage.end.as_secs_f64(), peak * 1.1),
        ],
        OUTAGE.filled(),
    )))?;
    for (i, (_, report)) in runs.iter().enumerate() {
        let points = midpoints(report).zip(report.goodput());
        chart.draw_series(LineSeries::new(points, line_style(i, runs.len())))?;
    }
    Ok(())
}
