//! Model checks of the budgets: every interleaving of a few threads, with
//! loom's atomics in place of std's. Run by `.ci/loom.sh`.

use loom::sync::Arc;
use loom::thread;

use crate::budget::{Budget, TokenBucket};
use crate::decision::Cause;

fn bucket(capacity: u64, refill_per_second: u64) -> TokenBucket {
    TokenBucket::builder()
        .capacity(capacity)
        .retry_cost(5)
        .timeout_cost(5)
        .success_refund(1)
        .refill_per_second(refill_per_second)
        .build()
        .unwrap()
}

#[test]
fn token_bucket_concurrent_withdrawals_never_overdraw() {
    loom::model(|| {
        let bucket = Arc::new(bucket(10, 0)); // room for exactly two retries
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let bucket = bucket.clone();
                thread::spawn(move || bucket.try_retry(Cause::Transient))
            })
            .collect();
        let granted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&granted| granted)
            .count();
        assert_eq!(granted, 2);
        assert_eq!(bucket.available(), 0);
    });
}

#[test]
fn token_bucket_refunds_and_withdrawals_are_not_lost() {
    loom::model(|| {
        let bucket = Arc::new(bucket(20, 0));
        assert!(bucket.try_retry(Cause::Transient));
        assert!(bucket.try_retry(Cause::Transient)); // 10 left
        let refund = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.on_success(Some(Cause::Transient)))
        };
        let small_refund = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.on_success(None))
        };
        assert!(bucket.try_retry(Cause::Transient));
        refund.join().unwrap();
        small_refund.join().unwrap();
        assert_eq!(bucket.available(), 10 + 5 + 1 - 5);
    });
}

#[test]
fn token_bucket_refill_is_paid_once_per_millisecond() {
    loom::model(|| {
        // One token per second. Emptied directly, not by retries: they read
        // the real clock, which would refill a token's fraction on some runs
        // and not others.
        let bucket = Arc::new(bucket(10, 1));
        bucket.empty();
        let early = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.refill_to(1000))
        };
        bucket.refill_to(2000);
        early.join().unwrap();
        assert_eq!(bucket.available(), 2);
    });
}

/// A refund that finds the bucket full writes nothing, racing a
/// withdrawal that makes room: whatever the order, the room that withdrawal
/// made is not lost, and a later refund fills it.
#[test]
fn token_bucket_room_made_while_a_refund_finds_it_full_is_not_lost() {
    loom::model(|| {
        let bucket = Arc::new(bucket(10, 0)); // full
        let withdrawal = {
            let bucket = bucket.clone();
            thread::spawn(move || assert!(bucket.try_retry(Cause::Transient)))
        };
        bucket.on_success(None);
        withdrawal.join().unwrap();
        bucket.on_success(Some(Cause::Transient));
        assert_eq!(bucket.available(), 10);
    });
}

/// A refund racing a retry and that retry's own refund, in a full bucket:
/// the retry's cost comes back whichever order they run in.
#[test]
fn token_bucket_refund_racing_a_refund_into_a_full_bucket_is_kept() {
    loom::model(|| {
        let bucket = Arc::new(bucket(10, 0)); // full
        let retry = {
            let bucket = bucket.clone();
            thread::spawn(move || {
                assert!(bucket.try_retry(Cause::Transient));
                bucket.on_success(Some(Cause::Transient)); // its cost back
            })
        };
        bucket.on_success(None);
        retry.join().unwrap();
        assert_eq!(bucket.available(), 10);
    });
}

/// A capacity that grows, racing a refund that finds the bucket full at
/// the old one: the room the new capacity makes is not lost.
#[test]
fn token_bucket_room_made_by_a_larger_capacity_is_not_lost() {
    loom::model(|| {
        let bucket = Arc::new(bucket(10, 0)); // full
        let grow = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.resize(20_000))
        };
        bucket.on_success(None);
        grow.join().unwrap();
        bucket.on_success(Some(Cause::Transient));
        bucket.on_success(Some(Cause::Transient));
        assert_eq!(bucket.available(), 20);
    });
}

/// A capacity falling (a grown capacity decaying), racing a refund that
/// read the old capacity: wherever the refund's write lands, before the
/// fall cuts the tokens or after, the bucket ends within the new capacity,
/// and nothing above it comes back when the capacity grows again.
#[test]
fn token_bucket_refund_racing_a_smaller_capacity_keeps_the_bound() {
    loom::model(|| {
        let bucket = Arc::new(bucket(20, 0));
        assert!(bucket.try_retry(Cause::Transient)); // 15 of 20
        let shrink = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.resize(6_000))
        };
        bucket.deposit(4_000);
        shrink.join().unwrap();
        assert_eq!(bucket.available(), 6);
        bucket.resize(20_000);
        assert_eq!(bucket.available(), 6, "what was above 6 is gone");
    });
}

/// A capacity falling, racing a withdrawal: the withdrawal is paid from
/// tokens that existed, the bucket ends within the smaller capacity, and no
/// token is made on the way.
#[test]
fn token_bucket_withdrawal_racing_a_smaller_capacity_never_overdraws() {
    loom::model(|| {
        let bucket = Arc::new(bucket(20, 0)); // full
        let shrink = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.resize(6_000))
        };
        let taken = bucket.try_retry(Cause::Transient);
        shrink.join().unwrap();
        let left = bucket.available();
        assert!(left <= 6, "{left}");
        assert!(left + if taken { 5 } else { 0 } <= 20, "{left}");
    });
}

#[test]
fn token_bucket_would_allow_charges_nothing_and_send_charges_once() {
    loom::model(|| {
        let bucket = Arc::new(bucket(5, 0)); // room for exactly one retry
        let other = {
            let bucket = bucket.clone();
            // Decided, then sent: the layer's order.
            thread::spawn(move || {
                bucket.would_allow(Cause::Transient) && bucket.try_retry(Cause::Transient)
            })
        };
        let mine = bucket.would_allow(Cause::Transient) && bucket.try_retry(Cause::Transient);
        let granted = usize::from(mine) + usize::from(other.join().unwrap());
        assert_eq!(granted, 1, "one retry's worth of tokens");
        assert_eq!(bucket.available(), 0);
    });
}

#[test]
fn token_bucket_refund_racing_a_send_lets_the_refunded_retry_out() {
    loom::model(|| {
        let bucket = Arc::new(bucket(5, 0));
        assert!(bucket.try_retry(Cause::Transient)); // empty
        let refund = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.on_success(Some(Cause::Transient)))
        };
        let sent = bucket.try_retry(Cause::Transient);
        refund.join().unwrap();
        // Either the send came first and was refused (the refund stays), or
        // it came after and spent the refund: tokens are never lost.
        assert_eq!(bucket.available(), if sent { 0 } else { 5 });
    });
}
