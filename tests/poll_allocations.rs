//! A healthy poll allocates nothing in steady state, and a board a reader
//! holds across polls costs one allocation per new value, whatever the number
//! of providers. Counted, not timed: a regression fails CI.

use crate::common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;
use tower::service_fn;
use tower_backoff::poll::{Board, Poller};

use common::allocations;

const PROVIDERS: u64 = 100;
const INTERVAL: Duration = Duration::from_secs(1);
const ROUNDS: u64 = 10;

/// A ranked poller over [`PROVIDERS`] providers under `String` keys, whose
/// values (and so whose ranks) change on every poll; `polls` counts the calls.
/// Returns half an interval after a few rounds, so that a read every interval
/// from then on falls between rounds.
async fn warmed_up() -> (Poller<String, (), u64, Infallible>, Arc<AtomicU64>) {
    let poller = Poller::builder(|_: &String| ())
        .interval(INTERVAL)
        .rank_by(|value: &u64| *value)
        .build()
        .unwrap();
    let polls = Arc::new(AtomicU64::new(0));
    for provider in 0..PROVIDERS {
        let polls = Arc::clone(&polls);
        let service = service_fn(move |()| {
            let n = polls.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Ok::<u64, Infallible>((provider * 7 + n * 13) % 97))
        });
        assert!(poller.add(format!("provider-{provider:04}"), service));
    }
    sleep(INTERVAL * 3 + INTERVAL / 2).await;
    (poller, polls)
}

/// Allocations and polls over [`ROUNDS`] rounds, reading the board after each
/// round; with `held`, a reader keeps each board there until its next read.
async fn count_rounds(
    poller: &Poller<String, (), u64, Infallible>,
    polls: &AtomicU64,
    mut held: Option<&mut Option<Board<String, u64>>>,
) -> (u64, u64) {
    let allocations_before = allocations();
    let polls_before = polls.load(Ordering::Relaxed);
    for _ in 0..ROUNDS {
        sleep(INTERVAL).await;
        let board = poller.board();
        assert_eq!(board.leaders().len(), PROVIDERS as usize);
        if let Some(held) = held.as_deref_mut() {
            *held = Some(board);
        }
    }
    let allocations = allocations() - allocations_before;
    (allocations, polls.load(Ordering::Relaxed) - polls_before)
}

#[tokio::test(start_paused = true)]
async fn healthy_polls_allocate_nothing_in_steady_state() {
    let (poller, polls) = warmed_up().await;
    let (allocations, polled) = count_rounds(&poller, &polls, None).await;
    assert_eq!(polled, ROUNDS * PROVIDERS);
    assert_eq!(allocations, 0, "over {polled} polls");
    poller.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_board_held_across_polls_costs_one_allocation_per_new_value() {
    let (poller, polls) = warmed_up().await;
    // The first board held makes the poller copy the board once into new
    // buffers; from then on the copy goes into those.
    let mut held = None;
    count_rounds(&poller, &polls, Some(&mut held)).await;
    let (allocations, polled) = count_rounds(&poller, &polls, Some(&mut held)).await;
    assert_eq!(polled, ROUNDS * PROVIDERS);
    assert_eq!(allocations, polled, "one per new value");
    poller.shutdown().await;
}
