//! Our jitter generator (`tower_backoff::Rng`, SplitMix64) beside rand's
//! `SmallRng`, for what the retry path does with one: make a stream for a
//! request that retries, and draw a full-jitter delay per retry (issue 27).
//!
//! `cargo bench --bench jitter_rng` times each operation with criterion;
//! `bash benches/callgrind_jitter.sh` counts its instructions, through the modes
//! below:
//!
//! - `-- --list`: the operations, by name, with what each does;
//! - `-- --sizes`: the generators' sizes in bytes;
//! - `-- --count <operation> <ours|rand> <n>`: `n` operations, for callgrind.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use rand::rngs::SmallRng;
use rand::{Rng as _, RngExt as _, SeedableRng as _};
use tower_backoff::engine::Session;
use tower_backoff::Rng;

/// A layer's seed, for the seeded streams.
const SEED: u64 = 0x5EED_CAFE;

/// The default schedule's first two delays: what a request that fails twice
/// sleeps before full jitter.
const DELAYS: [Duration; 2] = [Duration::from_millis(100), Duration::from_millis(200)];

/// What the retry path does with a generator.
#[derive(Clone, Copy)]
enum Op {
    /// A stream for one request, from a per-thread source of entropy: what an
    /// unseeded layer does.
    CreateFromEntropy,
    /// Stream `i` of a seeded family: what a seeded layer does.
    CreateSeeded,
    /// One full-jitter delay, uniform in `[0, d]`, each generator its own way.
    Draw,
    /// The same, with rand's 64 bits mapped onto `[0, d]` as ours are: the
    /// generator alone.
    DrawMultiplyShift,
    /// A request that fails twice: a stream from entropy and two draws.
    Request,
}

impl Op {
    const ALL: [Op; 5] = [
        Op::CreateFromEntropy,
        Op::CreateSeeded,
        Op::Draw,
        Op::DrawMultiplyShift,
        Op::Request,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::CreateFromEntropy => "create_from_entropy",
            Op::CreateSeeded => "create_seeded",
            Op::Draw => "draw",
            Op::DrawMultiplyShift => "draw_multiply_shift",
            Op::Request => "request",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Op::CreateFromEntropy => {
                "stream from entropy: `Rng::from_entropy()` vs `rand::make_rng::<SmallRng>()`"
            }
            Op::CreateSeeded => {
                "seeded stream i: `Rng::stream(seed, i)` vs `SmallRng::seed_from_u64(seed + i)`"
            }
            Op::Draw => "full-jitter draw: `duration_up_to(d)` vs `random_range(0..=d as nanos)`",
            Op::DrawMultiplyShift => {
                "full-jitter draw, both through our multiply-shift (the generators alone)"
            }
            Op::Request => "a request failing twice: stream from entropy + 2 draws",
        }
    }

    fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

/// Whose generator.
#[derive(Clone, Copy)]
enum Side {
    Ours,
    Rand,
}

impl Side {
    fn parse(name: &str) -> Option<Side> {
        match name {
            "ours" => Some(Side::Ours),
            "rand" => Some(Side::Rand),
            _ => None,
        }
    }
}

/// A full-jitter delay from rand as a switch would write it: rand's own
/// unbiased range sampling, and the same fallback as ours past `u64` nanoseconds.
fn rand_duration_up_to(rng: &mut SmallRng, max: Duration) -> Duration {
    match u64::try_from(max.as_nanos()) {
        Ok(nanos) => Duration::from_nanos(rng.random_range(0..=nanos)),
        Err(_) => {
            let secs = max.as_secs_f64() * rng.random::<f64>();
            Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max))
        }
    }
}

/// `[0, max]` from 64 random bits, as `Rng::duration_up_to` maps them (for
/// delays below 584 years, which these are).
fn multiply_shift(bits: u64, max: Duration) -> Duration {
    let span = max.as_nanos() + 1;
    Duration::from_nanos(((bits as u128 * span) >> 64) as u64)
}

/// Runs `f` on `0..n`, keeping every result, and times the loop alone.
fn timed<T>(n: u64, mut f: impl FnMut(u64) -> T) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        black_box(f(i));
    }
    start.elapsed()
}

/// `n` times `op` with `side`'s generator; the time of those `n` alone, not of
/// the generator a draw is made from.
fn run(op: Op, side: Side, n: u64) -> Duration {
    let seed = black_box(SEED);
    let delay = |i: u64| black_box(DELAYS[(i & 1) as usize]);
    match (op, side) {
        (Op::CreateFromEntropy, Side::Ours) => timed(n, |_| Rng::from_entropy()),
        (Op::CreateFromEntropy, Side::Rand) => timed(n, |_| rand::make_rng::<SmallRng>()),
        (Op::CreateSeeded, Side::Ours) => timed(n, |i| Rng::stream(seed, i)),
        (Op::CreateSeeded, Side::Rand) => {
            timed(n, |i| SmallRng::seed_from_u64(seed.wrapping_add(i)))
        }
        (Op::Draw, Side::Ours) => {
            let mut rng = Rng::from_entropy();
            timed(n, |i| rng.duration_up_to(delay(i)))
        }
        (Op::Draw, Side::Rand) => {
            let mut rng = rand::make_rng::<SmallRng>();
            timed(n, |i| rand_duration_up_to(&mut rng, delay(i)))
        }
        (Op::DrawMultiplyShift, Side::Ours) => {
            let mut rng = Rng::from_entropy();
            timed(n, |i| multiply_shift(rng.next_u64(), delay(i)))
        }
        (Op::DrawMultiplyShift, Side::Rand) => {
            let mut rng = rand::make_rng::<SmallRng>();
            timed(n, |i| multiply_shift(rng.next_u64(), delay(i)))
        }
        // The generator is kept, as the request's session keeps it.
        (Op::Request, Side::Ours) => timed(n, |_| {
            let mut rng = Rng::from_entropy();
            let first = rng.duration_up_to(black_box(DELAYS[0]));
            let second = rng.duration_up_to(black_box(DELAYS[1]));
            (rng, first, second)
        }),
        (Op::Request, Side::Rand) => timed(n, |_| {
            let mut rng = rand::make_rng::<SmallRng>();
            let first = rand_duration_up_to(&mut rng, black_box(DELAYS[0]));
            let second = rand_duration_up_to(&mut rng, black_box(DELAYS[1]));
            (rng, first, second)
        }),
    }
}

/// Each operation with both generators, side by side in one criterion group.
fn criterion_benches(c: &mut Criterion) {
    for op in Op::ALL {
        let mut group = c.benchmark_group(format!("jitter_rng_{}", op.name()));
        group.bench_function("ours", |b| b.iter_custom(|n| run(op, Side::Ours, n)));
        group.bench_function("rand", |b| b.iter_custom(|n| run(op, Side::Rand, n)));
        group.finish();
    }
}

/// The generators' sizes; `Option` is how a request's session holds one.
fn print_sizes() {
    println!("generator\t{}\t{}", size_of::<Rng>(), size_of::<SmallRng>());
    println!(
        "`Option<generator>`, as a `Session` holds it\t{}\t{}",
        size_of::<Option<Rng>>(),
        size_of::<Option<SmallRng>>()
    );
    let session = size_of::<Session>();
    let grown = session - size_of::<Option<Rng>>() + size_of::<Option<SmallRng>>();
    println!("`Session` (rand's: estimated, not built)\t{session}\t{grown}");
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["--list"] => {
            for op in Op::ALL {
                println!("{}\t{}", op.name(), op.describe());
            }
        }
        ["--sizes"] => print_sizes(),
        ["--count", op, side, n] => {
            let op = Op::parse(op).expect("an operation from --list");
            let side = Side::parse(side).expect("ours or rand");
            run(op, side, n.parse().expect("a number of operations"));
        }
        _ => {
            let mut criterion = Criterion::default().configure_from_args();
            criterion_benches(&mut criterion);
            criterion.final_summary();
        }
    }
}
