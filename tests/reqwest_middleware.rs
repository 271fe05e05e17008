//! `BackoffMiddleware` in a `reqwest_middleware` client: the scenarios of
//! `tests/reqwest.rs`, through `.send()`, against a real hyper server on
//! 127.0.0.1, on tokio's paused clock.
#![cfg(feature = "reqwest-middleware")]

use crate::http_server;
use crate::reqwest_cases;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream;
use http::{Extensions, StatusCode};
use http_body_util::StreamBody;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use tokio::time::Instant;
use tower_backoff::breaker::{BreakerOpen, BreakerState, CircuitBreaker};
use tower_backoff::http::{BackoffMiddleware, HttpPolicy, HttpRetryLayer, RetryInfo};
use tower_backoff::{AdaptivePacing, BackoffLayer, Budget, Cause, Constant, Jitter, RetryLimits};

use http_server::{layer, layer_with, status, unused_addr, Reply, Server, STEP};
use reqwest_cases as cases;
use reqwest_cases::{busy_once, info, upload_bytes, upload_chunks, Through};

fn client<T>(layer: BackoffLayer<HttpPolicy, T>) -> ClientWithMiddleware
where
    BackoffMiddleware<HttpPolicy, T>: Middleware,
{
    ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::new(layer))
        .build()
}

/// The layer in a `reqwest_middleware` chain, through `execute` (what
/// `.send()` calls).
struct Chain;

impl Through for Chain {
    async fn send_all(
        layer: BackoffLayer<HttpPolicy>,
        requests: Vec<reqwest::Request>,
    ) -> Vec<reqwest::Response> {
        let client = client(layer);
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            responses.push(client.execute(request).await.unwrap());
        }
        responses
    }

    async fn send_without_info(
        layer: BackoffLayer<HttpPolicy>,
        request: reqwest::Request,
    ) -> reqwest::Response {
        let client = ClientBuilder::new(cases::client())
            .with(BackoffMiddleware::new(layer).without_retry_info())
            .build();
        client.execute(request).await.unwrap()
    }
}

/// Counts the attempts that reach it: a middleware added after the retries.
#[derive(Clone, Default)]
struct CountAttempts(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl Middleware for CountAttempts {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(request, extensions).await
    }
}

fn counted(layer: BackoffLayer<HttpPolicy>) -> (ClientWithMiddleware, Arc<AtomicUsize>) {
    let count = CountAttempts::default();
    let attempts = count.0.clone();
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::new(layer))
        .with(count)
        .build();
    (client, attempts)
}

#[tokio::test(start_paused = true)]
async fn get_is_retried_on_503_and_returns_200() {
    cases::get_is_retried_on_503_and_returns_200::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn get_is_retried_on_429_and_returns_200() {
    cases::get_is_retried_on_429_and_returns_200::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn post_on_503_is_sent_once_and_its_response_returned() {
    cases::post_on_503_is_sent_once_and_its_response_returned::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn post_with_idempotency_key_is_retried_with_the_same_key_and_body() {
    cases::post_with_idempotency_key_is_retried_with_the_same_key_and_body::<Chain>().await;
}

// --- Retry-After -----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn retry_after_two_seconds_waits_two_seconds() {
    cases::retry_after_two_seconds_waits_two_seconds::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn retry_after_an_http_date_two_seconds_ahead_waits_about_two_seconds() {
    cases::retry_after_an_http_date_two_seconds_ahead_waits_about_two_seconds::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn hostile_retry_after_values_fall_back_to_the_schedule() {
    cases::hostile_retry_after_values_fall_back_to_the_schedule::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn retry_after_longer_than_the_time_left_returns_the_response_at_once() {
    cases::retry_after_longer_than_the_time_left_returns_the_response_at_once::<Chain>().await;
}

// --- errors ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn connection_refused_is_retried_until_the_server_starts() {
    let addr = unused_addr();
    let starting = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Server::start_on(addr, |_, _| status(200)).await
    });
    let (client, attempts) = counted(layer_with(
        HttpPolicy::new(),
        Constant::new(Duration::from_secs(1)),
        3,
        None,
    ));
    let response = client.get(format!("http://{addr}/")).send().await.unwrap();
    let server = starting.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(info(&response).attempts, 2);
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn connection_refused_every_time_returns_the_connect_error_after_every_attempt() {
    let addr = unused_addr();
    let (client, attempts) = counted(layer(HttpPolicy::new()));
    let error = client
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn reqwest_own_timeout_is_retried() {
    let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
    let client = ClientBuilder::new(
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
    .with(BackoffMiddleware::new(layer(HttpPolicy::new())))
    .build();
    let response = client.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(info(&response).attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_per_request_timeout_is_kept_on_every_attempt() {
    let server = Server::start(|n, _| if n < 2 { Reply::Hang } else { status(200) }).await;
    let client = client(layer(HttpPolicy::new()));
    let started = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        client
            .get(server.url("/"))
            .timeout(Duration::from_secs(1))
            .send(),
    )
    .await
    .expect("every attempt timed out after a second")
    .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 3);
    assert_eq!(started.elapsed(), 2 * Duration::from_secs(1) + 2 * STEP);
}

/// The HTTP policy with a constant short delay, no budget, and each attempt
/// cut at one second.
fn timed_layer() -> BackoffLayer<HttpPolicy, tower_backoff::deadline::Guarded> {
    BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .attempt_timeout(Duration::from_secs(1))
        .no_budget()
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_layer_attempt_timeout_retries_a_hung_attempt() {
    let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
    let layer = timed_layer();
    let client = client(layer);
    let response = client.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(info(&response), RetryInfo::new(2, STEP));
}

#[tokio::test(start_paused = true)]
async fn the_layer_attempt_timeout_on_the_last_attempt_is_a_middleware_error() {
    let server = Server::start(|_, _| Reply::Hang).await;
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .max_attempts(2)
        .attempt_timeout(Duration::from_secs(1))
        .no_budget()
        .build()
        .unwrap();
    let client = client(layer);
    let error = client.get(server.url("/")).send().await.unwrap_err();
    assert!(error.is_middleware(), "{error:?}");
    assert!(error.to_string().contains("timed out"), "{error}");
    assert_eq!(server.requests(), 2);
}

// --- bodies and connections ---------------------------------------------------

fn upload() -> reqwest::Body {
    reqwest::Body::wrap(StreamBody::new(stream::iter(upload_chunks())))
}

#[tokio::test(start_paused = true)]
async fn streaming_body_is_retried_byte_identical() {
    let server = Server::start(busy_once(503)).await;
    let client = client(layer(HttpPolicy::new()));
    let response = client
        .put(server.url("/upload"))
        .body(upload())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response).attempts, 2);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.body == upload_bytes()));
}

#[tokio::test(start_paused = true)]
async fn streaming_body_over_the_replay_limit_is_sent_once_and_its_response_returned() {
    let server = Server::start(|_, _| status(503)).await;
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::new(layer(HttpPolicy::new())).replay_limit(2 * 1024))
        .build();
    let response = client
        .put(server.url("/upload"))
        .body(upload())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(info(&response).attempts, 1);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, upload_bytes());
}

#[tokio::test(start_paused = true)]
async fn a_kept_response_holds_its_connection_until_the_retry_goes_out_then_is_drained() {
    cases::a_kept_response_holds_its_connection_until_the_retry_goes_out_then_is_drained::<Chain>()
        .await;
}

// --- every server signal ------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn every_delay_header_is_waited() {
    cases::every_delay_header_is_waited::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn a_server_delay_past_max_server_delay_is_returned_at_once() {
    cases::a_server_delay_past_max_server_delay_is_returned_at_once::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn should_retry_overrides_the_status() {
    cases::should_retry_overrides_the_status::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn server_delays_are_jittered_upward() {
    cases::server_delays_are_jittered_upward::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn the_server_sees_the_attempt_number() {
    cases::the_server_sees_the_attempt_number::<Chain>().await;
}

#[tokio::test(start_paused = true)]
async fn without_retry_info_responses_carry_none() {
    cases::without_retry_info_responses_carry_none::<Chain>().await;
}

// --- what the middleware shares, and what it hands on ---------------------------

/// Pays for `left` retries in all, then refuses.
struct Retries {
    left: AtomicU32,
}

impl Budget for Retries {
    fn try_retry(&self, _: Cause) -> bool {
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[tokio::test(start_paused = true)]
async fn one_budget_pays_for_the_retries_of_every_request_through_the_middleware() {
    let server = Server::start(|_, _| status(503)).await;
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .max_attempts(3)
        .budget(Retries {
            left: AtomicU32::new(3),
        })
        .build()
        .unwrap();
    let client = client(layer);
    for _ in 0..4 {
        let response = client.get(server.url("/")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    // 4 first attempts, and the 3 retries the budget paid for (2 for the
    // first request, 1 for the second), not 2 for each.
    assert_eq!(server.requests(), 4 + 3);
}

#[tokio::test(start_paused = true)]
async fn a_retry_limits_extension_overrides_the_layer_for_one_request() {
    let server = Server::start(|_, _| status(503)).await;
    let client = client(layer(HttpPolicy::new()));
    let response = client
        .get(server.url("/"))
        .with_extension(RetryLimits::no_retries())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.requests(), 1);
    let response = client.get(server.url("/")).send().await.unwrap();
    assert_eq!(info(&response).attempts, 3);
    assert_eq!(server.requests(), 1 + 3);
}

#[tokio::test(start_paused = true)]
async fn throttled_answers_through_the_middleware_slow_the_layers_pacing() {
    let server = Server::start(|_, _| status(429)).await;
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        .pacing(AdaptivePacing::new())
        .build()
        .unwrap();
    let pacing = layer.pacing().unwrap().clone();
    let client = client(layer);
    // Ten requests of three throttled attempts: over two seconds, so over
    // more than one of the pacing's one-second rounds.
    for _ in 0..10 {
        let response = client.get(server.url("/")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let metrics = pacing.metrics();
    assert_eq!(metrics.invocations, 30);
    assert!(metrics.raised >= 1, "{metrics:?}");
    assert!(metrics.interval > Duration::ZERO, "{metrics:?}");
}

/// Counts its attempts in the request's extensions.
struct TallyInExtensions;

#[derive(Clone, Copy, Debug, PartialEq)]
struct Tally(u32);

#[async_trait::async_trait]
impl Middleware for TallyInExtensions {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let Tally(n) = extensions.get::<Tally>().copied().unwrap_or(Tally(0));
        extensions.insert(Tally(n + 1));
        next.run(request, extensions).await
    }
}

#[tokio::test(start_paused = true)]
async fn each_attempt_sees_the_extensions_the_last_one_left_and_the_caller_gets_them_back() {
    let server = Server::start(|n, _| if n < 2 { status(503) } else { status(200) }).await;
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::new(layer(HttpPolicy::new())))
        .with(TallyInExtensions)
        .build();
    let mut extensions = Extensions::new();
    extensions.insert(Tally(10));
    let request = client.get(server.url("/")).build().unwrap();
    let response = client
        .execute_with_extensions(request, &mut extensions)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(extensions.get::<Tally>(), Some(&Tally(13)));
}

/// An attempt cut short has no outcome: what it wrote goes with it, and the
/// next attempt starts from the extensions as they were.
#[tokio::test(start_paused = true)]
async fn an_attempt_cut_by_the_attempt_timeout_leaves_the_extensions_as_they_were() {
    let server = Server::start(|n, _| if n == 0 { Reply::Hang } else { status(200) }).await;
    let layer = timed_layer();
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::new(layer))
        .with(TallyInExtensions)
        .build();
    let mut extensions = Extensions::new();
    extensions.insert(Tally(10));
    let request = client.get(server.url("/")).build().unwrap();
    let response = client
        .execute_with_extensions(request, &mut extensions)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.requests(), 2);
    assert_eq!(extensions.get::<Tally>(), Some(&Tally(11)));
}

/// The caller's extensions are its own until an attempt ends: a request it
/// drops midway leaves them as they were.
#[tokio::test(start_paused = true)]
async fn a_request_the_caller_gives_up_on_leaves_its_extensions_as_they_were() {
    let server = Server::start(|_, _| Reply::Hang).await;
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::new(layer(HttpPolicy::new())))
        .with(TallyInExtensions)
        .build();
    let mut extensions = Extensions::new();
    extensions.insert(Tally(10));
    let request = client.get(server.url("/")).build().unwrap();
    let sending = client.execute_with_extensions(request, &mut extensions);
    assert!(tokio::time::timeout(Duration::from_secs(1), sending)
        .await
        .is_err());
    assert_eq!(extensions.get::<Tally>(), Some(&Tally(10)));
}

#[tokio::test(start_paused = true)]
async fn a_post_to_a_closed_port_is_retried_only_with_retry_unsent() {
    for (policy, sent) in [
        (HttpPolicy::new(), false),
        (HttpPolicy::new().retry_unsent(), true),
    ] {
        let addr = unused_addr();
        let starting = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            Server::start_on(addr, |_, _| status(200)).await
        });
        let (client, attempts) = counted(layer_with(
            policy,
            Constant::new(Duration::from_secs(1)),
            3,
            None,
        ));
        let result = client
            .post(format!("http://{addr}/orders"))
            .body("order=1")
            .send()
            .await;
        let server = starting.await.unwrap();
        if sent {
            assert_eq!(result.unwrap().status(), StatusCode::OK);
            // Refused twice (the second at once), then sent after a second.
            assert_eq!(attempts.load(Ordering::SeqCst), 3);
            assert_eq!(server.requests(), 1);
        } else {
            assert!(result.unwrap_err().is_connect());
            assert_eq!(attempts.load(Ordering::SeqCst), 1);
            assert_eq!(server.requests(), 0);
        }
    }
}

/// The middleware made from the same builder as the tower layer: its
/// `on_retry` closure takes the engine's `RetryArgs`, no annotation needed.
#[tokio::test(start_paused = true)]
async fn the_middleware_from_the_http_builder_takes_an_unannotated_on_retry() {
    let server = Server::start(busy_once(503)).await;
    let retried = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = retried.clone();
    let layer = HttpRetryLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .on_retry(move |retry, _| log.lock().unwrap().push((retry.attempt(), retry.delay())))
        .build()
        .unwrap();
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::from(layer))
        .build();
    let response = client.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response), RetryInfo::new(2, STEP));
    assert_eq!(*retried.lock().unwrap(), [(1, STEP)]);
    assert_eq!(server.requests(), 2);
}

/// Requests to each host in [`interleave_hosts`], one to one.
const HOST_REQUESTS: usize = 361;

/// What each host saw of [`HOST_REQUESTS`] requests each, sent alternately
/// through `client` 100 ms apart (36 s: the dead host's breaker, open 4 to
/// 5 s at a time, probes several times).
#[derive(Debug, Default)]
struct HostTally {
    dead_rejected: usize,
    healthy_rejected: usize,
    /// Calls the dead host got once its breaker had first rejected a
    /// request.
    dead_calls_after_open: usize,
    healthy_calls: usize,
}

async fn interleave_hosts(
    client: &ClientWithMiddleware,
    dead: &Server,
    healthy: &Server,
) -> HostTally {
    // `Ok(status)`, or `Err(())` when the breaker rejected the request.
    async fn send(client: &ClientWithMiddleware, server: &Server) -> Result<StatusCode, ()> {
        match client.get(server.url("/")).send().await {
            Ok(response) => Ok(response.status()),
            Err(reqwest_middleware::Error::Middleware(error))
                if error.downcast_ref::<BreakerOpen>().is_some() =>
            {
                Err(())
            }
            Err(error) => panic!("{error:?}"),
        }
    }
    let mut tally = HostTally::default();
    let mut dead_calls_at_open = None;
    for _ in 0..HOST_REQUESTS {
        match send(client, dead).await {
            Ok(status) => assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE),
            Err(()) => {
                tally.dead_rejected += 1;
                dead_calls_at_open.get_or_insert(dead.requests());
            }
        }
        match send(client, healthy).await {
            Ok(status) => assert_eq!(status, StatusCode::OK),
            Err(()) => tally.healthy_rejected += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tally.dead_calls_after_open = dead_calls_at_open.map_or(0, |at| dead.requests() - at);
    tally.healthy_calls = healthy.requests();
    eprintln!("{tally:?}");
    tally
}

/// The middleware made from a layer with a circuit breaker keeps it per
/// host, as the layer does: the dead host's breaker opens and stops its
/// calls, and the healthy host is never rejected.
#[tokio::test(start_paused = true)]
async fn the_middleware_keeps_the_breaker_per_host_so_a_dead_host_never_rejects_a_healthy_one() {
    let dead = Server::start(|_, _| status(503)).await;
    let healthy = Server::start(|_, _| status(200)).await;
    let breaker = CircuitBreaker::new();
    let layer = HttpRetryLayer::builder()
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap();
    assert!(layer.breaker_per_host());
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::from(layer))
        .build();
    let tally = interleave_hosts(&client, &dead, &healthy).await;
    assert_eq!(tally.healthy_rejected, 0, "{tally:?}");
    assert_eq!(tally.healthy_calls, HOST_REQUESTS, "{tally:?}");
    assert!(tally.dead_rejected > HOST_REQUESTS * 9 / 10, "{tally:?}");
    assert!(
        tally.dead_calls_after_open * 20 <= HOST_REQUESTS,
        "calls after opening: {tally:?}"
    );
    assert_ne!(
        breaker.state(),
        BreakerState::Closed,
        "the handle given is the first host's: the dead one's"
    );
}

/// The middleware shares the host table of the layer it was made from: a
/// breaker the layer's own service opened for the dead host (a fresh one:
/// the healthy host was called first, and kept the breaker as built)
/// rejects the middleware's first request there, and not the healthy
/// host's.
#[tokio::test(start_paused = true)]
async fn the_middleware_shares_the_host_table_of_the_layer_it_was_made_from() {
    let dead = Server::start(|_, _| status(503)).await;
    let healthy = Server::start(|_, _| status(200)).await;
    let layer = HttpRetryLayer::builder()
        .circuit_breaker(CircuitBreaker::new())
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(cases::client());
    let first = reqwest::Request::new(http::Method::GET, healthy.url("/").parse().unwrap());
    let response = tower::ServiceExt::oneshot(svc.clone(), first)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut opened = false;
    for _ in 0..HOST_REQUESTS {
        let request = reqwest::Request::new(http::Method::GET, dead.url("/").parse().unwrap());
        match tower::ServiceExt::oneshot(svc.clone(), request).await {
            Err(error) if error.is_breaker_open() => {
                opened = true;
                break;
            }
            Err(error) => panic!("{error:?}"),
            Ok(response) => assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE),
        }
    }
    assert!(opened, "the dead host's breaker opened");
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::from(layer))
        .build();
    let dead_calls = dead.requests();
    let error = client.get(dead.url("/")).send().await.unwrap_err();
    assert!(
        matches!(&error, reqwest_middleware::Error::Middleware(e) if e.downcast_ref::<BreakerOpen>().is_some()),
        "{error:?}"
    );
    assert_eq!(dead.requests(), dead_calls);
    let response = client.get(healthy.url("/")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// The opt-in for one breaker: through the middleware too, the dead host's
/// failures open it for every host, the healthy one included.
#[tokio::test(start_paused = true)]
async fn the_middleware_with_a_breaker_for_all_hosts_rejects_the_healthy_host_too() {
    let dead = Server::start(|_, _| status(503)).await;
    let healthy = Server::start(|_, _| status(200)).await;
    let layer = HttpRetryLayer::builder()
        .circuit_breaker_for_all_hosts(CircuitBreaker::new())
        .build()
        .unwrap();
    assert!(!layer.breaker_per_host());
    let client = ClientBuilder::new(cases::client())
        .with(BackoffMiddleware::from(layer))
        .build();
    let tally = interleave_hosts(&client, &dead, &healthy).await;
    assert!(tally.healthy_rejected > HOST_REQUESTS / 2, "{tally:?}");
}
