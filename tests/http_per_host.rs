//! Per-host retry budgets ([`PerHostLayer`]) against two real hyper servers on
//! 127.0.0.1, through hyper-util's client and reqwest, on tokio's paused
//! clock: one host's outage cannot spend the other's retries.
#![cfg(feature = "hyper")]

use crate::http_server;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backoff::http::{HttpPolicy, PerHostLayer};
use tower_backoff::{BackoffLayer, Constant, Jitter, TokenBucket};

use http_server::{status, Server, STEP};

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A bucket with room for 4 retries (cost 5 each).
fn small_bucket() -> Arc<TokenBucket> {
    Arc::new(TokenBucket::builder().capacity(20).build().unwrap())
}

fn retry_layer(budget: Arc<TokenBucket>) -> BackoffLayer<HttpPolicy> {
    BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .max_attempts(3)
        .budget(budget)
        .build()
        .unwrap()
}

/// Host A is down (always 503); host B is busy once, then fine.
async fn two_hosts() -> (Server, Server) {
    let down = Server::start(|_, _| status(503)).await;
    let flaky = Server::start(|n, _| if n == 0 { status(503) } else { status(200) }).await;
    (down, flaky)
}

fn get(server: &Server) -> Request<Full<Bytes>> {
    Request::get(server.url("/")).body(Full::default()).unwrap()
}

/// Three requests to the host that is down, then one to the flaky one: the
/// status the flaky host's request ends with.
async fn flaky_after_outage<S, B>(mut svc: S, down: &Server, flaky: &Server) -> StatusCode
where
    S: Service<Request<Full<Bytes>>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..3 {
        let response = svc.ready().await.unwrap().call(get(down)).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    svc.ready()
        .await
        .unwrap()
        .call(get(flaky))
        .await
        .unwrap()
        .status()
}

#[tokio::test(start_paused = true)]
async fn one_shared_budget_lets_one_hosts_outage_spend_the_others_retries() {
    // The contrast: what per-host budgets prevent.
    let (down, flaky) = two_hosts().await;
    let bucket = small_bucket();
    let svc = ServiceBuilder::new()
        .layer(retry_layer(bucket.clone()))
        .service(client());
    let status = flaky_after_outage(svc, &down, &flaky).await;
    assert_eq!(down.requests(), 3 + 4, "4 retries emptied the bucket");
    assert_eq!(bucket.available(), 0);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(flaky.requests(), 1, "its retry was refused");
}

#[tokio::test(start_paused = true)]
async fn per_host_budgets_keep_the_other_hosts_retries() {
    let (down, flaky) = two_hosts().await;
    let buckets = Arc::new(Mutex::new(Vec::new()));
    let made = buckets.clone();
    let svc = ServiceBuilder::new()
        .layer(PerHostLayer::new(move || {
            let bucket = small_bucket();
            made.lock().unwrap().push(bucket.clone());
            retry_layer(bucket)
        }))
        .service(client());
    let status = flaky_after_outage(svc, &down, &flaky).await;
    assert_eq!(status, StatusCode::OK, "the flaky host's retry went out");
    assert_eq!(flaky.requests(), 2);
    assert_eq!(down.requests(), 3 + 4, "the down host spent only its own");
    let buckets = buckets.lock().unwrap();
    assert_eq!(buckets.len(), 2, "one budget per host, made on first use");
    assert_eq!(buckets[0].available(), 0);
    assert_eq!(buckets[1].available(), 20, "the retry's cost came back");
}

#[tokio::test(start_paused = true)]
async fn per_host_stacks_are_shared_by_every_clone_of_the_service() {
    let (down, _) = two_hosts().await;
    let made = Arc::new(Mutex::new(0));
    let counter = made.clone();
    let svc = ServiceBuilder::new()
        .layer(PerHostLayer::new(move || {
            *counter.lock().unwrap() += 1;
            retry_layer(small_bucket())
        }))
        .service(client());
    for _ in 0..3 {
        let response = svc.clone().oneshot(get(&down)).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(*made.lock().unwrap(), 1);
    assert_eq!(down.requests(), 3 + 4, "the clones drew on one bucket");
}

#[tokio::test(start_paused = true)]
async fn the_host_table_stays_bounded() {
    let servers: Vec<Server> =
        futures::future::join_all((0..20).map(|_| Server::start(|_, _| status(200)))).await;
    let svc = ServiceBuilder::new()
        .layer(PerHostLayer::new(|| retry_layer(small_bucket())).max_hosts(8))
        .service(client());
    for server in &servers {
        let response = svc.clone().oneshot(get(server)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert!(svc.hosts() <= 8, "{}", svc.hosts());
}

/// The same bound on `HttpRetryLayer`'s own table of hosts.
#[tokio::test(start_paused = true)]
async fn the_http_layers_table_of_hosts_stays_bounded() {
    let servers: Vec<Server> =
        futures::future::join_all((0..20).map(|_| Server::start(|_, _| status(200)))).await;
    let layer = tower_backoff::http::HttpRetryLayer::new().max_hosts(8);
    assert!(
        layer.is_per_host(),
        "a bound on hosts makes the layer per host"
    );
    let svc = ServiceBuilder::new().layer(layer).service(client());
    for server in &servers {
        let response = svc.clone().oneshot(get(server)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert!((1..=8).contains(&svc.hosts()), "{}", svc.hosts());
    // Without the bound every host keeps its layer.
    let svc = ServiceBuilder::new()
        .layer(tower_backoff::http::HttpRetryLayer::new().per_host())
        .service(client());
    for server in &servers {
        svc.clone().oneshot(get(server)).await.unwrap();
    }
    assert_eq!(svc.hosts(), 20);
}

/// `fresh()` keeps the bound set with `max_hosts`, in a table of its own
/// with no host called yet.
#[tokio::test(start_paused = true)]
async fn a_fresh_http_layer_keeps_its_bound_in_a_table_of_its_own() {
    let servers: Vec<Server> =
        futures::future::join_all((0..20).map(|_| Server::start(|_, _| status(200)))).await;
    // 160 hosts is 20 a shard of the table: however the 20 servers hash,
    // none is evicted. Any bound up to 8 would be one a shard, and 20
    // servers on 8 shards would evict some.
    let layer = tower_backoff::http::HttpRetryLayer::new().max_hosts(160);
    let svc = ServiceBuilder::new().layer(layer.clone()).service(client());
    for server in &servers[..3] {
        svc.clone().oneshot(get(server)).await.unwrap();
    }
    assert_eq!(svc.hosts(), 3);
    let fresh = layer.fresh();
    assert!(fresh.is_per_host());
    let fresh_svc = ServiceBuilder::new().layer(fresh).service(client());
    assert_eq!(fresh_svc.hosts(), 0, "no host called through the copy yet");
    for server in &servers {
        let response = fresh_svc.clone().oneshot(get(server)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(fresh_svc.hosts(), 20, "the bound of 160 hosts was kept");
    assert_eq!(svc.hosts(), 3, "the original's table is its own");
}

#[cfg(feature = "reqwest")]
#[tokio::test(start_paused = true)]
async fn per_host_budgets_keep_the_other_hosts_retries_through_reqwest() {
    let (down, flaky) = two_hosts().await;
    let mut svc = ServiceBuilder::new()
        .layer(PerHostLayer::new(|| retry_layer(small_bucket())))
        .service(reqwest::Client::builder().no_proxy().build().unwrap());
    let get = |server: &Server| {
        reqwest::Request::new(http::Method::GET, server.url("/").parse().unwrap())
    };
    for _ in 0..3 {
        let response = svc.ready().await.unwrap().call(get(&down)).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let response = svc.ready().await.unwrap().call(get(&flaky)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(down.requests(), 3 + 4);
    assert_eq!(flaky.requests(), 2);
}

/// `HttpRetryLayer` under `PerHostLayer`: each host gets a layer of its own
/// from the same builder, so its own budget, and one host's outage leaves the
/// other host its retries.
#[tokio::test(start_paused = true)]
async fn per_host_http_retry_layers_keep_the_other_hosts_retries() {
    let (down, flaky) = two_hosts().await;
    let svc = ServiceBuilder::new()
        .layer(PerHostLayer::new(|| {
            tower_backoff::http::HttpRetryLayer::builder()
                .schedule(Constant::new(STEP))
                .jitter(Jitter::None)
                .budget(TokenBucket::builder().capacity(20).build().unwrap())
                .build()
                .unwrap()
        }))
        .service(client());
    let mut svc = svc;
    for _ in 0..3 {
        let response = svc.ready().await.unwrap().call(get(&down)).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let response = svc.ready().await.unwrap().call(get(&flaky)).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "the flaky host kept its retries"
    );
    let info = *response
        .extensions()
        .get::<tower_backoff::http::RetryInfo>()
        .unwrap();
    assert_eq!(info.attempts, 2);
}

/// The builder's own option: `build_per_host()` gives each host a fresh
/// copy of the layer, the default budget included, where one layer for all
/// hosts lets the host that is down spend the flaky one's retries.
#[tokio::test(start_paused = true)]
async fn build_per_host_gives_each_host_its_own_default_budget() {
    let (down, flaky) = two_hosts().await;
    let stats = tower_backoff::Stats::new();
    let builder = || {
        tower_backoff::http::HttpRetryLayer::builder()
            .schedule(Constant::new(STEP))
            .jitter(Jitter::None)
            .stats(stats.clone())
    };
    let shared = ServiceBuilder::new()
        .layer(builder().build().unwrap())
        .service(client());
    let status = flaky_after_outage(shared, &down, &flaky).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "its retry was spent"
    );

    let (down, flaky) = two_hosts().await;
    let per_host = ServiceBuilder::new()
        .layer(builder().build_per_host().unwrap())
        .service(client());
    assert_eq!(per_host.hosts(), 0);
    let status = flaky_after_outage(per_host, &down, &flaky).await;
    assert_eq!(status, StatusCode::OK, "the flaky host kept its own retry");
    // One `Stats` adds both runs and every host up: 4 requests each, and
    // each run's down host made one request's retries (two), the flaky host
    // one in the second.
    let counted = stats.snapshot();
    assert_eq!((counted.requests, counted.retries), (8, 5));
}

/// A circuit breaker per host: the host that is down gets its breaker
/// opened and its requests rejected without a call, while the healthy host
/// behind the same per-host stack is never rejected.
#[tokio::test(start_paused = true)]
async fn build_per_host_gives_each_host_its_own_breaker() {
    use tower_backoff::breaker::CircuitBreaker;
    let down = Server::start(|_, _| status(503)).await;
    let healthy = Server::start(|_, _| status(200)).await;
    let breaker = CircuitBreaker::builder().min_throughput(4).build().unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(
            tower_backoff::http::HttpRetryLayer::builder()
                .schedule(Constant::new(STEP))
                .jitter(Jitter::None)
                .no_budget()
                .circuit_breaker(breaker)
                .build_per_host()
                .unwrap(),
        )
        .service(client());
    let mut rejected = 0;
    for _ in 0..10 {
        match svc.ready().await.unwrap().call(get(&down)).await {
            Ok(response) => assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE),
            Err(error) => {
                assert!(error.is::<tower_backoff::error::BreakerOpen>(), "{error:?}");
                rejected += 1;
            }
        }
        let response = svc
            .ready()
            .await
            .unwrap()
            .call(get(&healthy))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // Four failed attempts open it: the first request's three and the
    // second's first, whose retry the open breaker stops (the caller gets
    // that 503). Every later request is rejected without a call.
    assert_eq!(rejected, 8, "of 10");
    assert_eq!(down.requests(), 4);
    assert_eq!(healthy.requests(), 10);
}

/// A breaker that does not open here (it needs 100 attempts): with it the
/// layer from `build()` keeps per host its budget too, as `build_per_host()`
/// does, so the host that is down spends only its own retries.
#[tokio::test(start_paused = true)]
async fn a_breaker_kept_per_host_keeps_each_hosts_budget_too() {
    use tower_backoff::breaker::CircuitBreaker;
    let (down, flaky) = two_hosts().await;
    let layer = tower_backoff::http::HttpRetryLayer::builder()
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .budget(TokenBucket::builder().capacity(20).build().unwrap())
        .circuit_breaker(
            CircuitBreaker::builder()
                .min_throughput(100)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    assert!(layer.breaker_per_host());
    let svc = ServiceBuilder::new().layer(layer).service(client());
    let status = flaky_after_outage(svc, &down, &flaky).await;
    assert_eq!(status, StatusCode::OK, "the flaky host kept its own retry");
    assert_eq!(down.requests(), 3 + 4, "the bucket's 4 retries, no more");
}

/// A caller's `RetryLimits` still hold when the request goes through its
/// host's layer.
#[tokio::test(start_paused = true)]
async fn per_request_limits_hold_with_a_breaker_per_host() {
    use tower_backoff::breaker::CircuitBreaker;
    use tower_backoff::RetryLimits;
    let (down, _) = two_hosts().await;
    let svc = ServiceBuilder::new()
        .layer(
            tower_backoff::http::HttpRetryLayer::builder()
                .schedule(Constant::new(STEP))
                .no_budget()
                .circuit_breaker(CircuitBreaker::new())
                .build()
                .unwrap(),
        )
        .service(client());
    let mut request = get(&down);
    request.extensions_mut().insert(RetryLimits::no_retries());
    let response = svc.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(down.requests(), 1);
    let response = svc.oneshot(get(&down)).await.unwrap();
    let info = *response
        .extensions()
        .get::<tower_backoff::http::RetryInfo>()
        .unwrap();
    assert_eq!((info.attempts, down.requests()), (3, 4));
}

/// Which layers keep their breaker per host: those given one, through the
/// builder or `From`, unless it is for all hosts.
#[test]
fn a_layer_keeps_its_breaker_per_host_unless_told_otherwise() {
    use tower_backoff::breaker::CircuitBreaker;
    use tower_backoff::http::HttpRetryLayer;
    let builder = HttpRetryLayer::builder;
    assert!(!builder().build().unwrap().breaker_per_host());
    let per_host = builder().circuit_breaker(CircuitBreaker::new()).build();
    assert!(per_host.unwrap().breaker_per_host());
    let shared = builder().circuit_breaker_for_all_hosts(CircuitBreaker::new());
    assert!(!shared.build().unwrap().breaker_per_host());
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .circuit_breaker(CircuitBreaker::new())
        .build()
        .unwrap();
    assert!(HttpRetryLayer::from(layer).breaker_per_host());
}
