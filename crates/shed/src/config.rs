//! The limiter's settings, read by the limiter (admission, rejections) and by
//! its window (the limit's arithmetic): in a module of their own so that
//! neither reads the other's.

use std::time::Duration;

/// What a [`LimiterBuilder`](crate::limiter::LimiterBuilder) was given,
/// checked.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) min_limit: usize,
    pub(crate) max_limit: usize,
    pub(crate) window: Duration,
    pub(crate) min_samples: u32,
    pub(crate) tolerance: f64,
    pub(crate) smoothing: f64,
    pub(crate) shares: [f64; 4],
    pub(crate) max_drain: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) max_retry_after: Duration,
}
