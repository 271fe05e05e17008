//! What a storm simulation measured, and the tables it prints.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use super::server::ServerSample;
use super::workload::ClientSample;

/// Goodput counts as recovered once its mean over this window stays at or
/// above [`RECOVERED_SHARE`] of the pre-outage level: one interval alone is too
/// noisy, and the burst of answers when the backlog drains must not count.
pub const RECOVERY_WINDOW: Duration = Duration::from_secs(10);

/// The share of pre-outage goodput that counts as recovered.
pub const RECOVERED_SHARE: f64 = 0.9;

/// Everything one storm run measured, per statistics interval.
#[derive(Debug, Clone, PartialEq)]
pub struct StormReport {
    /// The length of each interval.
    pub interval: Duration,
    /// When the server was down, from the start of the run.
    pub outage: Range<Duration>,
    /// What the server saw, one entry per interval.
    pub server: Vec<ServerSample>,
    /// What the clients saw, one entry per interval.
    pub clients: Vec<ClientSample>,
}

/// The numbers the storm tables show for one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Logical requests issued.
    pub requests: u64,
    /// Attempts that reached the server.
    pub attempts: u64,
    /// The most requests the server held at once.
    pub peak_in_flight: u64,
    /// Attempts per logical request issued while the server was down.
    pub amplification_during: f64,
    /// Attempts per logical request issued after the outage.
    pub amplification_after: f64,
    /// Successful logical requests per second before the outage.
    pub goodput_before: f64,
    /// Successful logical requests per second after the outage.
    pub goodput_after: f64,
    /// Time from the end of the outage until goodput is back to 90 % of its
    /// pre-outage level and stays there; `None` if it never is within the run.
    pub recovery: Option<Duration>,
    /// Logical requests whose caller got an error.
    pub failed: u64,
    /// Logical requests still unanswered when the run ended.
    pub unfinished: u64,
}

impl StormReport {
    /// Successful logical requests per second, for each interval.
    pub fn goodput(&self) -> impl Iterator<Item = f64> + '_ {
        let secs = self.interval.as_secs_f64();
        self.clients.iter().map(move |c| c.succeeded as f64 / secs)
    }

    /// The most requests the server held in each interval.
    pub fn in_flight(&self) -> impl Iterator<Item = u64> + '_ {
        self.server.iter().map(|s| s.peak_outstanding)
    }

    /// When each interval starts, from the start of the run.
    pub fn times(&self) -> impl Iterator<Item = Duration> + '_ {
        (0..self.server.len()).map(|i| self.interval.saturating_mul(i as u32))
    }

    /// The run boiled down to the numbers of the tables.
    pub fn summary(&self) -> Summary {
        let during = self.intervals(self.outage.clone());
        let after = self.intervals(self.outage.end..Duration::MAX);
        // The first interval holds the ramp-up of a run that starts empty.
        let before = self.intervals(self.interval..self.outage.start);
        let clients = |r: &Range<usize>| &self.clients[r.clone()];
        let sum = |r: &Range<usize>, f: fn(&ClientSample) -> u64| -> u64 {
            clients(r).iter().map(f).sum()
        };
        let attempts =
            |r: &Range<usize>| -> u64 { self.server[r.clone()].iter().map(|s| s.arrivals).sum() };
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let per_sec = |r: &Range<usize>| {
            sum(r, |c| c.succeeded) as f64 / (r.len().max(1) as f64 * self.interval.as_secs_f64())
        };
        let all = 0..self.clients.len();
        let requests = sum(&all, |c| c.started);
        let failed = sum(&all, |c| c.failed);
        let succeeded = sum(&all, |c| c.succeeded);
        let goodput_before = per_sec(&before);
        Summary {
            requests,
            attempts: attempts(&all),
            peak_in_flight: self.in_flight().max().unwrap_or(0),
            amplification_during: ratio(attempts(&during), sum(&during, |c| c.started)),
            amplification_after: ratio(attempts(&after), sum(&after, |c| c.started)),
            goodput_before,
            goodput_after: per_sec(&after),
            recovery: self.recovery(after, goodput_before),
            failed,
            unfinished: requests - failed - succeeded,
        }
    }

    /// The interval indices whose start falls within `window`.
    fn intervals(&self, window: Range<Duration>) -> Range<usize> {
        let index = |d: Duration| {
            let i = d.as_nanos().div_ceil(self.interval.as_nanos());
            (i.min(self.clients.len() as u128)) as usize
        };
        let start = index(window.start);
        start..index(window.end).max(start)
    }

    fn recovery(&self, after: Range<usize>, level: f64) -> Option<Duration> {
        let width = (RECOVERY_WINDOW
            .as_nanos()
            .div_ceil(self.interval.as_nanos()) as usize)
            .max(1);
        let goodput: Vec<f64> = self.goodput().collect();
        let target = level * RECOVERED_SHARE;
        let window_ok = |start: usize| {
            let w = &goodput[start..start + width];
            w.iter().sum::<f64>() / width as f64 >= target
        };
        let last_start = after.end.checked_sub(width)?;
        // The earliest start from which every later window stays up.
        let mut recovered = None;
        for start in (after.start..=last_start).rev() {
            if !window_ok(start) {
                break;
            }
            recovered = Some(start);
        }
        recovered.map(|i| self.interval.saturating_mul((i - after.start) as u32))
    }
}

/// A small text table, in Markdown so it reads the same in a terminal and in
/// a README.
///
/// ```
/// use tower_backoff_sim::Table;
///
/// let mut table = Table::new(["strategy", "attempts"]);
/// table.row(["fixed", "12"]);
/// assert_eq!(table.to_string(), "| strategy | attempts |\n|----------|---------:|\n| fixed    |       12 |\n");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles. The first column is left-aligned,
    /// the others (numbers) right-aligned.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(header: I) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) -> &mut Self {
        self.rows.push(cells.into_iter().map(Into::into).collect());
        self
    }

    /// Adds a column on the right, one cell per existing row, in order; rows
    /// without a cell stay empty there.
    pub fn column<I: IntoIterator<Item = S>, S: Into<String>>(
        &mut self,
        title: impl Into<String>,
        cells: I,
    ) -> &mut Self {
        let columns = self.header.len();
        self.header.push(title.into());
        let mut cells = cells.into_iter();
        for row in &mut self.rows {
            row.resize(columns, String::new());
            row.push(cells.next().map(Into::into).unwrap_or_default());
        }
        self
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self.header.len();
        let width = |c: usize| {
            std::iter::once(&self.header)
                .chain(&self.rows)
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
                .max(3)
        };
        let widths: Vec<usize> = (0..columns).map(width).collect();
        let line = |f: &mut fmt::Formatter<'_>, row: &[String]| -> fmt::Result {
            for (c, w) in widths.iter().enumerate() {
                let cell = row.get(c).map(String::as_str).unwrap_or("");
                if c == 0 {
                    write!(f, "| {cell:<w$} ")?;
                } else {
                    write!(f, "| {cell:>w$} ")?;
                }
            }
            writeln!(f, "|")
        };
        line(f, &self.header)?;
        for (c, w) in widths.iter().enumerate() {
            let dashes = "-".repeat(if c == 0 { w + 2 } else { w + 1 });
            if c == 0 {
                write!(f, "|{dashes}")?;
            } else {
                write!(f, "|{dashes}:")?;
            }
        }
        writeln!(f, "|")?;
        for row in &self.rows {
            line(f, row)?;
        }
        Ok(())
    }
}

/// The storm table: one row per strategy.
pub fn storm_table<'a>(runs: impl IntoIterator<Item = (&'a str, &'a Summary)>) -> Table {
    let mut table = Table::new([
        "strategy",
        "peak in flight",
        "attempts/request during outage",
        "attempts/request after",
        "goodput before (req/s)",
        "goodput after (req/s)",
        "recovered after",
        "failed requests",
    ]);
    for (name, s) in runs {
        table.row([
            name.to_string(),
            s.peak_in_flight.to_string(),
            format!("{:.2}", s.amplification_during),
            format!("{:.2}", s.amplification_after),
            format!("{:.0}", s.goodput_before),
            format!("{:.0}", s.goodput_after),
            match s.recovery {
                Some(d) => format!("{:.0} s", d.as_secs_f64()),
                None => "never".to_string(),
            },
            s.failed.to_string(),
        ]);
    }
    table
}
