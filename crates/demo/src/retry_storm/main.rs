//! The retry-storm demo: a thousand clients, a server that goes down for ten
//! seconds, and what each retry strategy does to its recovery.
//!
//! ```text
//! cargo run --release -p demo --bin retry-storm
//! cargo run --release -p demo --bin retry-storm -- --clients 2000 --outage 20
//! cargo run --release -p demo --bin retry-storm -- --retransmit
//! cargo run --release -p demo --bin retry-storm -- --live
//! ```
//!
//! It simulates every strategy on tokio's paused clock (seeded: the same flags
//! give the same numbers), prints a table per scenario, and writes an SVG
//! chart of the server's load and the clients' goodput over time. `--live`
//! runs the same model as real hyper servers on 127.0.0.1 with real hyper-util
//! clients, in real time, every strategy side by side, for 30 s.

mod chart;
mod live;
mod text_chart;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tower_backoff::Jitter;
use tower_backoff_sim::{
    shed_storm_with, storm_table, Amplification, AmplificationReport, BudgetKind, BudgetSharing,
    Contention, Gate, PartialFailure, PartialFailureReport, ServerModel, Storm, StormReport,
    Strategy, Table, RECOVERY_WINDOW,
};

const USAGE: &str = "\
usage: retry-storm [--clients N] [--capacity C] [--outage SECS] [--seed S] [--seeds K]
                   [--horizon SECS] [--rate REQ_PER_SEC] [--backlog B] [--retransmit]
                   [--storm-only] [--svg PATH] [--live]

  --clients N      clients sending requests (default 1000; live 300)
  --capacity C     requests the server works on at full speed (default 30; live 10)
  --backlog B      requests kept while the server is down (default 512; live 170)
  --outage SECS    how long the server is down (default 10; live 5)
  --seed S         seed of the workload, the server and the jitter (default 1)
  --seeds K        also count recoveries over K seeds from S (default 10)
  --horizon SECS   length of the run (default 120; live 30)
  --rate R         requests per second each client sends (default 0.25)
  --retransmit     arrivals during the outage are delivered when it ends (those whose
                   client still waits) instead of going to the backlog
  --storm-only     only the storm table (for the sensitivity runs)
  --svg PATH       where to write the chart (default target/retry_storm.svg)
  --live           a real hyper server and clients over 127.0.0.1, in real time";

/// When the server goes down, from the start of the run.
const OUTAGE_START: Duration = Duration::from_secs(20);

/// Clients racing in the contention scenario.
const CONTENDERS: [usize; 5] = [10, 25, 50, 100, 200];

/// Clones of the client in the amplification scenario.
const CLONES: [usize; 3] = [10, 100, 1000];

/// Settings from the command line; `None` keeps the mode's default.
#[derive(Debug, Default)]
pub struct Options {
    clients: Option<usize>,
    capacity: Option<usize>,
    backlog: Option<usize>,
    outage: Option<Duration>,
    seed: u64,
    seeds: u64,
    horizon: Option<Duration>,
    rate: Option<f64>,
    retransmit: bool,
    storm_only: bool,
    svg: Option<PathBuf>,
    live: bool,
    help: bool,
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut options = Options {
            seed: 1,
            seeds: 10,
            ..Options::default()
        };
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or(format!("{flag} needs a value"));
            match flag.as_str() {
                "--clients" => options.clients = Some(number(&flag, &value()?)?),
                "--capacity" => options.capacity = Some(number(&flag, &value()?)?),
                "--backlog" => options.backlog = Some(number(&flag, &value()?)?),
                "--outage" => options.outage = Some(seconds(&flag, &value()?)?),
                "--seed" => options.seed = number(&flag, &value()?)?,
                "--seeds" => options.seeds = number::<u64>(&flag, &value()?)?.max(1),
                "--horizon" => options.horizon = Some(seconds(&flag, &value()?)?),
                "--rate" => options.rate = Some(number(&flag, &value()?)?),
                "--retransmit" => options.retransmit = true,
                "--storm-only" => options.storm_only = true,
                "--svg" => options.svg = Some(PathBuf::from(value()?)),
                "--live" => options.live = true,
                "--help" | "-h" => options.help = true,
                other => return Err(format!("unknown flag {other}")),
            }
        }
        Ok(options)
    }

    /// The storm these options describe, from the mode's defaults.
    pub fn storm(&self, defaults: Storm, model: ServerModel, outage_start: Duration) -> Storm {
        let window = defaults.model().outage_window();
        let outage = self.outage.unwrap_or(window.end - window.start);
        let model = match self.capacity {
            Some(c) => model.capacity(c),
            None => model,
        };
        let model = match self.backlog {
            Some(b) => model.backlog(b),
            None => model,
        };
        let model = model.retransmit(self.retransmit);
        let mut storm = defaults.server(model).seed(self.seed);
        if let Some(n) = self.clients {
            storm = storm.clients(n);
        }
        if let Some(r) = self.rate {
            storm = storm.rate_per_client(r);
        }
        if let Some(h) = self.horizon {
            storm = storm.horizon(h);
        }
        storm.outage(outage_start, outage)
    }
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag}: {value:?} is not a valid number"))
}

fn seconds(flag: &str, value: &str) -> Result<Duration, String> {
    let secs: f64 = number(flag, value)?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| *d <= Duration::from_secs(86_400))
        .ok_or(format!(
            "{flag}: {value} is not a number of seconds up to a day"
        ))
}

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if options.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let outcome = if options.live {
        live::run(&options)
    } else {
        simulate(&options)
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(options: &Options) -> Result<(), String> {
    let storm = options.storm(Storm::new(), ServerModel::new(), OUTAGE_START);
    check(&storm)?;
    let retransmit = options.storm(
        Storm::new(),
        ServerModel::new().retransmit(true),
        OUTAGE_START,
    );
    let horizon_secs = storm.length().as_secs();
    let storm_runs =
        (Strategy::ALL.len() + 2 * BudgetKind::ALL.len() + Strategy::UNTIL_SUCCESS.len()) as u64
            * options.seeds;
    let steps = storm_runs * horizon_secs
        + (CONTENDERS.len() * JITTERS.len()
            + CLONES.len() * (BUDGETS.len() + 2)
            + BudgetKind::ALL.len() * (CLONES.len() + FAILURE_RATES.len() + 2)) as u64;
    let bar = ProgressBar::new(steps).with_style(
        ProgressStyle::with_template("{msg:<40} [{bar:40}] {percent:>3}% {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );

    let started = Instant::now();
    let storms = |storm: &Storm, strategies: &[Strategy]| -> Result<Vec<Run>, String> {
        strategies
            .iter()
            .map(|&strategy| run_seeds(storm, strategy, options, &bar))
            .collect()
    };
    let runs = storms(&storm, &Strategy::ALL)?;
    let storm_time = started.elapsed();
    if options.storm_only {
        bar.finish_and_clear();
        println!("Storm: {storm}.\n");
        print!("{}", runs_table(&runs, options));
        return Ok(());
    }
    let kinds = BudgetKind::ALL.map(Strategy::WithBudget);
    let budget_storms = storms(&storm, &kinds)?;
    let budget_retransmits = storms(&retransmit, &kinds)?;
    let until_success = storms(&storm, &Strategy::UNTIL_SUCCESS)?;

    bar.set_message("contention");
    let contention = contention(options.seed, || bar.inc(1))?;
    bar.set_message("amplification");
    let amplification = amplification(options.seed, || bar.inc(1))?;
    bar.set_message("budgets");
    let budgets = budgets(options.seed, || bar.inc(1))?;
    bar.finish_and_clear();

    let path = options
        .svg
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/retry_storm.svg"));
    let series: Vec<_> = runs
        .iter()
        .map(|r| (r.strategy.name(), r.report()))
        .collect();
    println!("Storm: {storm}.\n");
    println!("{}", text_chart::goodput(&series));
    println!(
        "(The same as an SVG with the server's load: {}.)\n",
        path.display()
    );
    print!("{}", runs_table(&runs, options));
    println!(
        "\"recovered after\": from the end of the outage until goodput's {} s mean is back to 90 % \
         of its pre-outage level for good (seed {}).",
        RECOVERY_WINDOW.as_secs(),
        options.seed,
    );
    println!(
        "Simulated {} runs in {:.1} s; one run each: {}.\n",
        runs.len() as u64 * options.seeds,
        storm_time.as_secs_f64(),
        runs.iter()
            .map(|r| format!("{} {:.2} s", r.strategy, r.time.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    print_contention(&contention);
    print_amplification(&amplification);
    print_budgets(&budgets, &budget_storms, &budget_retransmits, options);
    println!(
        "Seed-003 variant: retrying until success, fixed 1 s against exponential from 1 s \
         ×2.7 up to 10 min with ±10 % jitter, the same storm.\n"
    );
    print!("{}", runs_table(&until_success, options));
    println!();

    chart::draw(&path, &series).map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("Chart: {}", path.display());
    Ok(())
}

/// Runs `strategy` on `storm` for every seed of `options`.
fn run_seeds(
    storm: &Storm,
    strategy: Strategy,
    options: &Options,
    bar: &ProgressBar,
) -> Result<Run, String> {
    let horizon_secs = storm.length().as_secs();
    let mut run = Run {
        strategy,
        report: None,
        recovered: 0,
        shed_recovered: 0,
        time: Duration::ZERO,
    };
    for seed in options.seed..options.seed + options.seeds {
        bar.set_message(format!("storm: {strategy}, seed {seed}"));
        let offset = bar.position();
        let clock = Instant::now();
        let report = strategy
            .run_with_progress(&storm.clone().seed(seed), seed, |t| {
                bar.set_position(offset + t.as_secs())
            })
            .map_err(|e| e.to_string())?;
        bar.set_position(offset + horizon_secs);
        run.recovered += report.summary().recovery.is_some() as u64;
        // The same clients, with the server half in front of the server.
        let layer = strategy.layer(seed).map_err(|e| e.to_string())?;
        let shed = shed_storm_with(&storm.clone().seed(seed), Gate::Shed, seed, |front| {
            tower_layer::Layer::layer(&layer, front)
        })
        .map_err(|e| e.to_string())?;
        run.shed_recovered += shed.summary().recovery.is_some() as u64;
        // The first seed's run is the one shown in full and charted.
        if run.report.is_none() {
            run.time = clock.elapsed();
            run.report = Some(report);
        }
    }
    Ok(run)
}

/// The storm table of `runs`, with the recoveries over every seed.
fn runs_table(runs: &[Run], options: &Options) -> Table {
    let summaries: Vec<_> = runs
        .iter()
        .map(|r| (r.strategy.name(), r.summary()))
        .collect();
    let mut table = storm_table(summaries.iter().map(|(n, s)| (*n, s)));
    table.column(
        format!(
            "recovered, seeds {}..={}",
            options.seed,
            options.seed + options.seeds - 1
        ),
        runs.iter()
            .map(|r| format!("{}/{}", r.recovered, options.seeds)),
    );
    table.column(
        "recovered with the shed layer in front",
        runs.iter()
            .map(|r| format!("{}/{}", r.shed_recovered, options.seeds)),
    );
    table
}

/// One strategy's storm runs.
struct Run {
    strategy: Strategy,
    /// The run with the first seed.
    report: Option<StormReport>,
    /// Runs, over every seed, whose goodput recovered.
    recovered: u64,
    /// The same, with the server half's `ShedLayer` in front of the server.
    shed_recovered: u64,
    /// Real time the first seed's run took.
    time: Duration,
}

impl Run {
    fn report(&self) -> &StormReport {
        self.report
            .as_ref()
            .expect("every strategy runs at least one seed")
    }

    fn summary(&self) -> tower_backoff_sim::Summary {
        self.report().summary()
    }
}

/// Refuses a horizon too short to show anything.
pub fn check(storm: &Storm) -> Result<(), String> {
    storm.validate().map_err(|e| e.to_string())?;
    let needed = storm.model().outage_window().end + RECOVERY_WINDOW;
    if storm.length() < needed {
        return Err(format!(
            "--horizon must be at least {} s: the outage ends at {} s and recovery is judged over {} s",
            needed.as_secs_f64(),
            storm.model().outage_window().end.as_secs_f64(),
            RECOVERY_WINDOW.as_secs()
        ));
    }
    Ok(())
}

const JITTERS: [(Jitter, &str); 4] = [
    (Jitter::None, "no jitter"),
    (Jitter::Full, "full"),
    (Jitter::Equal, "equal"),
    (Jitter::Decorrelated, "decorrelated"),
];

type ContentionRows = Vec<(usize, Vec<tower_backoff_sim::ContentionReport>)>;

fn contention(seed: u64, mut tick: impl FnMut()) -> Result<ContentionRows, String> {
    CONTENDERS
        .iter()
        .map(|&n| {
            let reports = JITTERS
                .iter()
                .map(|(jitter, _)| {
                    let report = Contention::new().clients(n).seed(seed).run(*jitter);
                    tick();
                    report.map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((n, reports))
        })
        .collect()
}

fn print_contention(rows: &ContentionRows) {
    println!(
        "Contention: N clients each write one record once with optimistic concurrency; \
         backoff from 5 ms doubling to 2 s.\n"
    );
    let header = || std::iter::once("clients").chain(JITTERS.iter().map(|(_, name)| *name));
    let mut calls = Table::new(header());
    let mut time = Table::new(header());
    for (n, reports) in rows {
        calls.row(
            std::iter::once(n.to_string()).chain(reports.iter().map(|r| {
                let missing = r.clients - r.succeeded;
                if missing == 0 {
                    r.write_calls.to_string()
                } else {
                    format!("{} ({missing} never succeeded)", r.write_calls)
                }
            })),
        );
        time.row(
            std::iter::once(n.to_string())
                .chain(reports.iter().map(|r| format_secs(r.last_success))),
        );
    }
    println!("Write calls until every client succeeded:\n\n{calls}");
    println!("Time until the last client succeeded:\n\n{time}");
}

fn format_secs(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 10.0 {
        format!("{secs:.2} s")
    } else {
        format!("{secs:.0} s")
    }
}

const BUDGETS: [BudgetSharing; 3] = BudgetSharing::ALL;

fn amplification(
    seed: u64,
    mut tick: impl FnMut(),
) -> Result<Vec<(usize, Vec<AmplificationReport>)>, String> {
    CLONES
        .iter()
        .map(|&clones| {
            let scenario = Amplification::new().clones(clones).seed(seed);
            let mut reports = BUDGETS
                .iter()
                .map(|&sharing| {
                    let report = scenario.run_with_budget(sharing, seed);
                    tick();
                    report.map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, _>>()?;
            reports.push(
                scenario
                    .run_with(BudgetKind::Default, seed)
                    .map_err(|e| e.to_string())?,
            );
            tick();
            reports.push(
                scenario
                    .run_independent(BudgetKind::Default, seed)
                    .map_err(|e| e.to_string())?,
            );
            tick();
            Ok((clones, reports))
        })
        .collect()
}

fn print_amplification(rows: &[(usize, Vec<AmplificationReport>)]) {
    println!(
        "Amplification: the server is down for good; 1,000 requests/s in all for 30 s, \
         the layer's defaults (3 attempts, 100 ms doubling, full jitter); the budget columns \
         a budget of 10 % of requests (+ 10 retries a second), \"defaults\" the layer as built with no option: \
         one layer for all clones, or a layer per clone (independent processes).\n"
    );
    let mut table = Table::new(
        std::iter::once("clones")
            .chain(BUDGETS.map(BudgetSharing::name))
            .chain(["defaults, one layer", "defaults, a layer per clone"]),
    );
    for (clones, reports) in rows {
        table.row(
            std::iter::once(clones.to_string()).chain(
                reports
                    .iter()
                    .map(|r| format!("{:.3}", r.attempts_per_request())),
            ),
        );
    }
    println!("Attempts per logical request:\n\n{table}");
}

/// The failure rates of the partial-failure scenario.
const FAILURE_RATES: [f64; 2] = [0.1, 0.3];

/// One budget kind's amplification (per clone count) and partial-failure
/// (per failure rate) reports.
struct BudgetRow {
    kind: BudgetKind,
    amplification: Vec<AmplificationReport>,
    partial: Vec<PartialFailureReport>,
    /// A full outage and p = 0.1 with a layer per clone: 1,000
    /// independent processes.
    fleet: (AmplificationReport, PartialFailureReport),
}

/// Independent processes in the budget table: a layer each.
const PROCESSES: usize = 1000;

fn budgets(seed: u64, mut tick: impl FnMut()) -> Result<Vec<BudgetRow>, String> {
    BudgetKind::ALL
        .iter()
        .map(|&kind| {
            let mut amplification = Vec::new();
            for clones in CLONES {
                let scenario = Amplification::new().clones(clones).seed(seed);
                amplification.push(scenario.run_with(kind, seed).map_err(|e| e.to_string())?);
                tick();
            }
            let mut partial = Vec::new();
            for p in FAILURE_RATES {
                let scenario = PartialFailure::new().failure_rate(p).seed(seed);
                partial.push(scenario.run_with(kind, seed).map_err(|e| e.to_string())?);
                tick();
            }
            let outage = Amplification::new()
                .clones(PROCESSES)
                .duration(Duration::from_secs(60))
                .seed(seed);
            let outage = outage
                .run_independent(kind, seed)
                .map_err(|e| e.to_string())?;
            tick();
            let flaky = PartialFailure::new().clones(PROCESSES).seed(seed);
            let flaky = flaky
                .run_independent(kind, seed)
                .map_err(|e| e.to_string())?;
            tick();
            Ok(BudgetRow {
                kind,
                amplification,
                partial,
                fleet: (outage, flaky),
            })
        })
        .collect()
}

fn print_budgets(rows: &[BudgetRow], storms: &[Run], retransmits: &[Run], options: &Options) {
    println!(
        "Budgets compared, each with its type's defaults, on the layer's defaults otherwise \
         (one layer, so one budget, for all clients, except in the \"processes\" columns: a layer each).\n\
         Full outage: attempts per request at 10 / 100 / 1000 clones. Partial failure: each attempt \
         fails with probability p; requests that succeeded and attempts per request. \
         Storm and retransmit: recovered seeds and, for seed {}, the time to recover.\n",
        options.seed
    );
    let mut header: Vec<String> = vec!["budget".into()];
    header.extend(CLONES.map(|c| format!("outage, {c} clones")));
    for p in FAILURE_RATES {
        header.push(format!("p = {p}: succeeded"));
        header.push(format!("p = {p}: load"));
    }
    header.push(format!("outage 60 s, {PROCESSES} processes"));
    header.push(format!("p = 0.1, {PROCESSES} processes: succeeded"));
    header.push("storm: recovered".into());
    header.push("retransmit: recovered".into());
    header.push("retransmit: after".into());
    let mut table = Table::new(header);
    for ((row, storm), retransmit) in rows.iter().zip(storms).zip(retransmits) {
        let mut cells: Vec<String> = vec![row.kind.name().into()];
        cells.extend(
            row.amplification
                .iter()
                .map(|r| format!("{:.3}", r.attempts_per_request())),
        );
        for r in &row.partial {
            cells.push(format!("{:.2} %", 100.0 * r.success_share()));
            cells.push(format!("{:.3}x", r.attempts_per_request()));
        }
        let (outage, flaky) = &row.fleet;
        cells.push(format!("{:.3}", outage.attempts_per_request()));
        cells.push(format!("{:.2} %", 100.0 * flaky.success_share()));
        cells.push(format!("{}/{}", storm.recovered, options.seeds));
        cells.push(format!("{}/{}", retransmit.recovered, options.seeds));
        cells.push(match retransmit.summary().recovery {
            Some(d) => format!("{:.0} s", d.as_secs_f64()),
            None => "never".into(),
        });
        table.row(cells);
    }
    println!("{table}");
}
