//! Where hedging meets the other pieces (issue 40): the replay limit, a
//! server-named delay, the inner service's readiness, and the requests a
//! time limit or pacing tracks from their call. Each is a behaviour the
//! caller sees, checked with the real parts a user would have: a hyper
//! server and client on 127.0.0.1, tower's `ConcurrencyLimit`, and tokio's
//! paused clock where time is all that matters.

#[cfg(feature = "hyper")]
use crate::http_server;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower::limit::ConcurrencyLimit;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_backoff::{
    AdaptivePacing, BackoffBuilder, BackoffLayer, Decision, Hedging, Policy, Stats, TokenBucket,
};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A service whose request `n` takes `n` milliseconds; 0 answers at its
/// first poll. Counts its calls.
fn taking_n_ms(
    calls: Arc<AtomicU32>,
) -> impl Service<u64, Response = u64, Error = io::Error, Future = BoxFuture<io::Result<u64>>> + Clone
{
    service_fn(move |ms: u64| {
        calls.fetch_add(1, Ordering::SeqCst);
        let answer: BoxFuture<io::Result<u64>> = if ms == 0 {
            Box::pin(std::future::ready(Ok(0)))
        } else {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(ms)
            })
        };
        answer
    })
}

// --- 4. readiness: a refused hedge holds no permit ------------------------------------

/// Retries errors and copies requests, but lets no hedge out: what the HTTP
/// policy does with a POST.
#[derive(Clone, Copy)]
struct NoHedges;

impl Policy<u64, u64, io::Error> for NoHedges {
    fn classify(&self, _: &u64, result: &io::Result<u64>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) => Decision::retry(),
        }
    }

    fn clone_request(&self, request: &u64) -> Option<u64> {
        Some(*request)
    }

    fn prepare_hedge(&self, _: &mut u64, _: u32) -> bool {
        false
    }
}

/// How long a second caller waits for `ConcurrencyLimit(2)` while one slow
/// call of `layer`'s is in flight and its hedge has been refused; `warm`
/// quick calls first give the load cap traffic to grant from.
async fn second_callers_wait<P>(layer: BackoffLayer<P>, warm: u32) -> Duration
where
    P: Policy<u64, u64, io::Error> + Send + Sync + 'static,
{
    let calls = Arc::new(AtomicU32::new(0));
    let limited = ConcurrencyLimit::new(taking_n_ms(calls.clone()), 2);
    let svc = layer.layer(limited);
    for _ in 0..warm {
        svc.clone().oneshot(1).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let slow = tokio::spawn(svc.clone().oneshot(1_000));
    // Past the hedge delay: the hedge was due and refused.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = calls.load(Ordering::SeqCst);
    let start = Instant::now();
    svc.clone().oneshot(2).await.unwrap();
    let waited = start.elapsed();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before + 1,
        "no hedge went out"
    );
    slow.await.unwrap().unwrap();
    waited
}

fn hedging_after_10_ms() -> Hedging {
    Hedging::after(Duration::from_millis(10)).max_extra_load(1.0)
}

#[tokio::test(start_paused = true)]
async fn a_hedge_the_load_cap_refuses_leaves_the_concurrency_permit_to_other_callers() {
    // No traffic before: the cap grants nothing.
    let layer = BackoffLayer::builder()
        .no_budget()
        .hedge(Hedging::after(Duration::from_millis(10)))
        .build()
        .unwrap();
    let waited = second_callers_wait(layer, 0).await;
    assert_eq!(waited, Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn a_hedge_the_budget_refuses_leaves_the_concurrency_permit_to_other_callers() {
    let empty = TokenBucket::builder()
        .initial_tokens(0)
        .success_refund(0)
        .build()
        .unwrap();
    let layer = BackoffLayer::builder()
        .budget(empty)
        .hedge(hedging_after_10_ms())
        .build()
        .unwrap();
    let waited = second_callers_wait(layer, 10).await;
    assert_eq!(waited, Duration::from_millis(2));
}

#[tokio::test(start_paused = true)]
async fn a_hedge_the_policy_refuses_leaves_the_concurrency_permit_to_other_callers() {
    let layer = BackoffLayer::builder()
        .policy(NoHedges)
        .no_budget()
        .hedge(hedging_after_10_ms())
        .build()
        .unwrap();
    let waited = second_callers_wait(layer, 10).await;
    assert_eq!(waited, Duration::from_millis(2));
}

// --- 5. first-poll answers of requests tracked from their call -----------------------

/// A layer that tracks every request from its call: a time limit, or
/// pacing.
fn tracked_from_call(builder: BackoffBuilder, pacing: bool) -> BackoffBuilder {
    if pacing {
        builder.pacing(AdaptivePacing::new())
    } else {
        builder.max_elapsed(Duration::from_secs(60))
    }
}

#[tokio::test(start_paused = true)]
async fn with_a_time_limit_or_pacing_answers_ready_at_their_first_poll_leave_the_percentile_alone()
{
    for pacing in [false, true] {
        let calls = Arc::new(AtomicU32::new(0));
        let stats = Stats::new();
        let builder = BackoffLayer::builder().no_budget().stats(stats.clone());
        let layer = tracked_from_call(builder, pacing)
            .hedge(
                Hedging::at_percentile(50.0)
                    .window(Duration::from_secs(1), 100)
                    .max_extra_load(1.0),
            )
            .build()
            .unwrap();
        let mut svc = layer.layer(taking_n_ms(calls.clone()));
        // 1.2 s of traffic: every 10 ms a call over the network, and three
        // a cache answers at once.
        for _ in 0..120 {
            svc.ready().await.unwrap().call(10).await.unwrap();
            for _ in 0..3 {
                svc.ready().await.unwrap().call(0).await.unwrap();
            }
        }
        assert_eq!(stats.snapshot().hedges, 0);
        // The median of the calls that waited is 10 ms: a 6 ms call is not
        // hedged.
        svc.ready().await.unwrap().call(6).await.unwrap();
        assert_eq!(stats.snapshot().hedges, 0, "pacing: {pacing}");
    }
}

#[tokio::test(start_paused = true)]
async fn with_a_time_limit_or_pacing_answers_ready_at_their_first_poll_grant_no_hedge() {
    for pacing in [false, true] {
        let calls = Arc::new(AtomicU32::new(0));
        let stats = Stats::new();
        let builder = BackoffLayer::builder().no_budget().stats(stats.clone());
        let layer = tracked_from_call(builder, pacing)
            .hedge(Hedging::after(Duration::from_millis(10)))
            .build()
            .unwrap();
        let mut svc = layer.layer(taking_n_ms(calls.clone()));
        // Ten answers at the first poll: no traffic the cap grants from.
        for _ in 0..10 {
            svc.ready().await.unwrap().call(0).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = Instant::now();
        svc.ready().await.unwrap().call(1_000).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(stats.snapshot().hedges, 0, "pacing: {pacing}");
    }
}

// --- 1. and 2. over HTTP ---------------------------------------------------------------

#[cfg(feature = "hyper")]
mod http {
    use std::time::Duration;

    use bytes::Bytes;
    use futures::channel::mpsc;
    use http::{HeaderName, Request, StatusCode};
    use http_body::Frame;
    use http_body_util::StreamBody;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower::{service_fn, Layer, ServiceExt};
    use tower_backoff::http::{HttpPolicy, ReplayBody};
    use tower_backoff::{BackoffLayer, Constant, Hedging, Jitter, Stats};

    use super::http_server::{status, status_with, Server};

    const PATIENCE: Duration = Duration::from_secs(5);

    type Chunk = Result<Frame<Bytes>, std::io::Error>;
    type Upload = ReplayBody<StreamBody<mpsc::UnboundedReceiver<Chunk>>>;

    fn chunk() -> Chunk {
        Ok(Frame::data(Bytes::from(vec![b'x'; 100])))
    }

    fn attempt_header() -> HeaderName {
        HeaderName::from_static("x-attempt")
    }

    /// An upload whose chunks the test sends, recorded up to 250 bytes.
    fn upload(url: &str) -> (Request<Upload>, mpsc::UnboundedSender<Chunk>) {
        let (source, frames) = mpsc::unbounded();
        let body = ReplayBody::with_limit(StreamBody::new(frames), 250);
        (Request::put(url).body(body).unwrap(), source)
    }

    /// The copy one chunk behind the other fails for want of a chunk the
    /// recording dropped: the crate's own failure. The copy sending the
    /// whole body is the one the caller must hear from.
    #[tokio::test]
    async fn a_hedged_upload_past_the_replay_limit_returns_the_servers_answer() {
        let server = Server::start(|_, _| status(200)).await;
        let stats = Stats::new();
        let layer = BackoffLayer::builder()
            .policy(HttpPolicy::new().attempt_header(attempt_header()))
            .no_budget()
            .stats(stats.clone())
            .hedge(Hedging::after(Duration::from_millis(50)).max_extra_load(1.0))
            .build()
            .unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http::<Upload>();
        let svc = layer.layer(client);
        // Traffic for the load cap: one request, in an earlier slot.
        let (warm, source) = upload(&server.url("/warm"));
        drop(source);
        let warmed = svc.clone().oneshot(warm).await.unwrap();
        assert_eq!(warmed.status(), StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(120)).await;

        let (request, source) = upload(&server.url("/upload"));
        source.unbounded_send(chunk()).unwrap();
        let call = tokio::spawn(svc.clone().oneshot(request));
        tokio::time::timeout(PATIENCE, async {
            while stats.snapshot().hedges == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the upload is hedged");
        // Both copies sent the first chunk and wait for the next.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..3 {
            source.unbounded_send(chunk()).unwrap();
        }
        drop(source);

        let response = tokio::time::timeout(PATIENCE, call)
            .await
            .expect("the upload ends")
            .unwrap();
        let response = response.unwrap_or_else(|e| panic!("the caller got {e:?}, not the 200"));
        assert_eq!(response.status(), StatusCode::OK);
        let whole = server.seen().iter().filter(|s| s.body.len() == 400).count();
        assert_eq!(whole, 1, "one copy sent the whole body");
    }

    /// The hedge fails first, with `Retry-After: 5`; the first copy, held
    /// back on its way out, fails after it with a plain 503. The retry
    /// after both waits the 5 s the server asked for.
    #[tokio::test]
    async fn a_retry_after_on_one_copy_holds_when_another_fails_without_one() {
        let server = Server::start(|n, _| match n {
            0 => status(200),
            1 => status_with(503, &[("retry-after", "5")]),
            2 => status(503),
            _ => status(200),
        })
        .await;
        let layer = BackoffLayer::builder()
            .policy(HttpPolicy::new().attempt_header(attempt_header()))
            .schedule(Constant::new(Duration::from_millis(100)))
            .jitter(Jitter::None)
            .no_budget()
            .hedge(Hedging::after(Duration::from_millis(50)).max_extra_load(1.0))
            .build()
            .unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http::<String>();
        // First copies reach the client 200 ms late; hedges and retries
        // (stamped with their attempt) at once.
        let late_first = service_fn(move |request: Request<String>| {
            let client = client.clone();
            async move {
                if !request.headers().contains_key("x-attempt") {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                client.request(request).await
            }
        });
        let svc = layer.layer(late_first);
        let get = |path| Request::get(server.url(path)).body(String::new()).unwrap();
        assert_eq!(
            svc.clone().oneshot(get("/warm")).await.unwrap().status(),
            200
        );
        tokio::time::sleep(Duration::from_millis(120)).await;

        let start = tokio::time::Instant::now();
        let call = svc.clone().oneshot(get("/call"));
        let outcome = tokio::time::timeout(Duration::from_secs(1), call).await;
        let sent: Vec<_> = server.seen()[1..].iter().map(|s| s.at - start).collect();
        assert!(
            outcome.is_err(),
            "answered within a second of a Retry-After: 5; requests at {sent:?}"
        );
        assert_eq!(sent.len(), 2, "the hedge and the first copy: {sent:?}");
    }
}
