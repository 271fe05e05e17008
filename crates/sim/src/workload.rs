//! The clients' side of a simulation: logical requests arriving at random, as
//! independent users do, each sent through a client service and its retries.

use std::cell::RefCell;
use std::future::poll_fn;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;
use tower_service::Service;

use super::connection::Request;
use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::Rng;

/// Checks an open workload: `clones` clients sending `rate` logical requests
/// per second in all for `duration`, small enough to finish. Each error names
/// the setting.
pub(crate) fn check_open_load(
    clones: usize,
    rate: f64,
    duration: Duration,
) -> Result<(), ConfigError> {
    if !(1..=1_000_000).contains(&clones) {
        return Err(ConfigError::new(
            "clones",
            format!("must be within 1..=1000000, got {clones}"),
        ));
    }
    if !rate.is_finite() || rate <= 0.0 {
        return Err(ConfigError::new(
            "rate",
            format!("must be a positive number, got {rate}"),
        ));
    }
    if duration.is_zero() {
        return Err(ConfigError::new("duration", "must be longer than zero"));
    }
    check_duration("duration", duration)?;
    let expected = rate * duration.as_secs_f64();
    if expected > 100_000_000.0 {
        return Err(ConfigError::new(
            "rate",
            format!("the run would issue about {expected:.0} requests; at most 100000000"),
        ));
    }
    Ok(())
}

/// What the clients saw during one statistics interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientSample {
    /// Logical requests issued.
    pub started: u64,
    /// Logical requests that ended in success (goodput), whenever they started.
    pub succeeded: u64,
    /// Logical requests that ended in failure: the caller got an error.
    pub failed: u64,
}

/// Per-interval client statistics, shared by the request tasks.
#[derive(Debug)]
pub(crate) struct ClientLog {
    started: Instant,
    interval: Duration,
    series: Vec<ClientSample>,
}

impl ClientLog {
    pub(crate) fn new(started: Instant, interval: Duration, horizon: Duration) -> Self {
        let buckets = horizon.as_nanos().div_ceil(interval.as_nanos()).max(1) as usize;
        Self {
            started,
            interval,
            series: vec![ClientSample::default(); buckets],
        }
    }

    fn sample(&mut self, at: Instant) -> &mut ClientSample {
        let since = at.saturating_duration_since(self.started);
        let index = (since.as_nanos() / self.interval.as_nanos()) as usize;
        let last = self.series.len() - 1;
        &mut self.series[index.min(last)]
    }

    pub(crate) fn samples(&self) -> Vec<ClientSample> {
        self.series.clone()
    }
}

/// Issues logical requests until `stop`, each through one of `clients` picked
/// at random, as independent Poisson processes of `rate_per_client` requests
/// per second: merged, they are one Poisson process of `clients.len()` times
/// that rate, which is cheaper to draw. Each request runs in its own task, so
/// a slow one never holds the next one back (an open workload, as users are).
///
/// Must run inside a [`tokio::task::LocalSet`].
pub(crate) async fn issue<S>(
    clients: Rc<[S]>,
    rate_per_client: f64,
    stop: Instant,
    seed: u64,
    log: Rc<RefCell<ClientLog>>,
) where
    S: Service<Request> + Clone + 'static,
{
    let total_rate = rate_per_client * clients.len() as f64;
    if clients.is_empty() || total_rate.is_nan() || total_rate <= 0.0 {
        return;
    }
    let mut rng = Rng::stream(seed, 0xC11E47);
    let mut next = Instant::now();
    let mut id = 0;
    loop {
        // Exponential gaps: -ln(U) / rate, with U in (0, 1].
        let gap = -(1.0 - rng.next_f64()).ln() / total_rate;
        next += Duration::from_secs_f64(gap);
        if next >= stop {
            return;
        }
        tokio::time::sleep_until(next).await;
        let index = (rng.next_u64() % clients.len() as u64) as usize;
        let mut client = clients[index].clone();
        let request = Request { id };
        id += 1;
        log.borrow_mut().sample(next).started += 1;
        let log = log.clone();
        tokio::task::spawn_local(async move {
            let outcome = match poll_fn(|cx| client.poll_ready(cx)).await {
                Ok(()) => client.call(request).await.is_ok(),
                Err(_) => false,
            };
            let mut log = log.borrow_mut();
            let sample = log.sample(Instant::now());
            if outcome {
                sample.succeeded += 1;
            } else {
                sample.failed += 1;
            }
        });
    }
}
