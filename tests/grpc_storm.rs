//! gRFC A6's retry throttling against the layer's default budget in the
//! retry-storm simulation: the same clients, schedule and attempts, only the
//! budget differs. Run with `--nocapture` to see the tables.
#![cfg(all(feature = "grpc", feature = "sim"))]

use std::sync::Arc;
use std::time::Duration;

use tower_backoff::budget::{Budget, TokenBucket};
use tower_backoff::grpc::RetryThrottle;
use tower_backoff::sim::{
    storm_table, RetryErrors, Storm, Summary, FIRST_DELAY, MAX_ATTEMPTS, MAX_DELAY,
};
use tower_backoff::{BackoffLayer, Cause, Exponential, Jitter};

fn run(storm: &Storm, budget: Arc<dyn Budget>) -> Summary {
    let layer = BackoffLayer::builder()
        .policy(RetryErrors::new(Cause::Timeout))
        .schedule(Exponential::new(FIRST_DELAY).max_delay(MAX_DELAY))
        .jitter(Jitter::Full)
        .max_attempts(MAX_ATTEMPTS)
        .budget(budget)
        .seed(1)
        .build()
        .unwrap();
    storm
        .run(|connection| tower_layer::Layer::layer(&layer, connection))
        .unwrap()
        .summary()
}

/// The default budget and A6's example throttling (`maxTokens` 10,
/// `tokenRatio` 0.1), each shared by every client.
fn compare(storm: &Storm) -> (Summary, Summary) {
    let bucket = run(storm, Arc::new(TokenBucket::default()));
    let throttle = run(storm, Arc::new(RetryThrottle::new(10.0, 0.1).unwrap()));
    println!("{storm}");
    println!(
        "{}",
        storm_table([("default budget", &bucket), ("A6 throttling", &throttle)])
    );
    (bucket, throttle)
}

#[test]
fn in_a_full_outage_both_keep_load_near_1x_and_throttling_adds_less() {
    let (bucket, throttle) = compare(&Storm::new());

    for summary in [&bucket, &throttle] {
        assert!(summary.amplification_during <= 1.05, "{summary:?}");
        assert!(
            summary
                .recovery
                .is_some_and(|r| r <= Duration::from_secs(5)),
            "{summary:?}"
        );
    }
    // A6 counts every failure and stops at half of 10 tokens: 5 retries in
    // all; the bucket pays 10 of its 500 tokens per timed-out retry: 50.
    assert!(throttle.amplification_during < bucket.amplification_during);
    assert!(throttle.attempts < bucket.attempts);
}

#[test]
fn in_a_short_blip_throttling_sheds_more_load_and_fails_more_calls() {
    let blip = Storm::new()
        .outage(Duration::from_secs(20), Duration::from_millis(1500))
        .horizon(Duration::from_secs(60));
    let (bucket, throttle) = compare(&blip);

    assert!(throttle.peak_in_flight < bucket.peak_in_flight);
    assert!(throttle.amplification_during < bucket.amplification_during);
    // The retries it did not send were the ones that would have ridden the
    // blip out.
    assert!(throttle.failed > bucket.failed);
}
