//! Runs a number of deposit + withdraw pairs on one budget, from one thread,
//! so that `benches/callgrind_budget.sh` can count the instructions of a pair
//! (the same pairs as `benches/budget.rs`).
//!
//! Not a criterion bench: `cargo bench --bench budget_instructions -- <budget> <pairs>`.

use std::hint::black_box;

use tower::retry::budget::{Budget as _, TpsBudget};
use tower_backoff::budget::{Budget, TokenBucket};
use tower_backoff::Cause;

/// The budgets, by the names the script passes.
const BUDGETS: [&str; 4] = [
    "TpsBudget",
    "TokenBucket",
    "TokenBucket-successes",
    "TokenBucket-requests",
];

/// `pairs` pairs on a budget built here, so building it is part of the fixed
/// cost the script subtracts. Each pair as `benches/budget.rs` defines it.
fn run(budget: &str, pairs: u64) {
    match budget {
        "TpsBudget" => {
            let budget = TpsBudget::default();
            for _ in 0..pairs {
                budget.deposit();
                black_box(budget.withdraw());
            }
        }
        // The AWS SDKs: a retry, and the success that refunds it.
        "TokenBucket" => {
            let budget = black_box(TokenBucket::new());
            for _ in 0..pairs {
                black_box(budget.try_retry(Cause::Transient));
                budget.on_success(Some(Cause::Transient));
            }
        }
        // tower's semantics: earn on first-try successes, a token each, a
        // token a retry.
        "TokenBucket-successes" => {
            let budget = black_box(
                TokenBucket::builder()
                    .retry_cost(1)
                    .timeout_cost(1)
                    .build()
                    .unwrap(),
            );
            for _ in 0..pairs {
                budget.on_success(None);
                black_box(budget.try_retry(Cause::Transient));
            }
        }
        // Finagle's: earn on first attempts, whatever their outcome.
        "TokenBucket-requests" => {
            let budget = black_box(
                TokenBucket::builder()
                    .retry_cost(1)
                    .timeout_cost(1)
                    .request_deposit(1)
                    .success_refund(0)
                    .build()
                    .unwrap(),
            );
            for _ in 0..pairs {
                budget.on_first_attempt();
                black_box(budget.try_retry(Cause::Transient));
            }
        }
        other => panic!("unknown budget {other:?}: one of {BUDGETS:?}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args.as_slice() {
        [flag] if flag == "--list" => {
            for budget in BUDGETS {
                println!("{budget}");
            }
        }
        [budget, pairs] => run(budget, pairs.parse().expect("a number of pairs")),
        // `cargo bench` runs every bench target with no arguments: nothing to do.
        [] => {}
        _ => eprintln!("usage: budget_instructions --list | <budget> <pairs>"),
    }
}
