//! gRPC hedging from a service config's `hedgingPolicy` (gRFC A6), against a
//! real tonic server on 127.0.0.1 through a real tonic `Channel`.
//!
//! On real time, with delays of tens of milliseconds: tokio's paused clock
//! advances whenever the runtime waits on sockets, so a hedge delay would
//! fire before the server had a chance to answer the copy before it.
#![cfg(feature = "grpc")]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::Message;
use tokio::net::TcpListener;
use tokio::time::{timeout, Instant};
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower::{Layer, Service};
use tower_backoff::grpc::{
    parse_grpc_timeout, GrpcRetryLayer, ServiceConfig, PREVIOUS_RPC_ATTEMPTS, RETRY_PUSHBACK_MS,
};

/// What the server does with one copy, in the order copies arrive.
#[derive(Clone, Copy)]
enum Copy {
    /// Never answers; counted as cancelled when the client drops it.
    Hang,
    /// Answers OK with `"copy {n}"` after this long.
    Ok(Duration),
    /// A trailers-only status at once, with this pushback if any.
    Fail(Code, Option<&'static str>),
}

/// What the server saw of one copy.
#[derive(Debug, Clone)]
struct Seen {
    previous_attempts: Option<String>,
    /// The `grpc-timeout` the copy carried.
    timeout: Option<Duration>,
    at: Instant,
}

/// `test.Hedge`: `Warm` answers OK at once; `Call` answers each copy as the
/// plan says.
#[derive(Clone, Default)]
struct Server {
    plan: Arc<Mutex<VecDeque<Copy>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Handlers dropped before they answered: copies the client cancelled.
    cancelled: Arc<AtomicU32>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn marks(&self) -> Vec<Option<String>> {
        self.seen()
            .into_iter()
            .map(|s| s.previous_attempts)
            .collect()
    }

    /// Waits up to a second for `n` copies to have been cancelled.
    async fn cancelled(&self, n: u32) -> u32 {
        let _ = timeout(Duration::from_secs(1), async {
            while self.cancelled.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// Counts a handler dropped before it answered.
struct Cancelled(Arc<AtomicU32>);

impl Drop for Cancelled {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl tonic::server::NamedService for Server {
    const NAME: &'static str = "test.Hedge";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<http::Request<Body>> for Server {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let server = self.clone();
        Box::pin(async move {
            if request.uri().path().ends_with("/Warm") {
                return Ok(answer("warm"));
            }
            let previous_attempts = request
                .headers()
                .get(PREVIOUS_RPC_ATTEMPTS)
                .map(|v| v.to_str().unwrap().to_owned());
            let timeout = parse_grpc_timeout(request.headers());
            let _ = request.into_body().collect().await;
            let n = {
                let mut seen = server.seen.lock().unwrap();
                seen.push(Seen {
                    previous_attempts,
                    timeout,
                    at: Instant::now(),
                });
                seen.len()
            };
            let copy = server.plan.lock().unwrap().pop_front();
            match copy.unwrap_or(Copy::Hang) {
                Copy::Hang => {
                    let _guard = Cancelled(Arc::clone(&server.cancelled));
                    std::future::pending::<()>().await;
                    unreachable!()
                }
                Copy::Ok(after) => {
                    let guard = Cancelled(Arc::clone(&server.cancelled));
                    tokio::time::sleep(after).await;
                    std::mem::forget(guard);
                    Ok(answer(&format!("copy {n}")))
                }
                Copy::Fail(code, pushback) => {
                    let mut response = Status::new(code, "scripted").into_http::<Body>();
                    if let Some(pushback) = pushback {
                        response
                            .headers_mut()
                            .insert(RETRY_PUSHBACK_MS, pushback.parse().unwrap());
                    }
                    Ok(response)
                }
            }
        })
    }
}

/// An OK response carrying `message`.
fn answer(message: &str) -> http::Response<Body> {
    let encoded = message.to_owned().encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + encoded.len());
    framed.put_u8(0);
    framed.put_u32(encoded.len() as u32);
    framed.put_slice(&encoded);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    let frames = vec![
        Ok::<_, Infallible>(Frame::data(Bytes::from(framed))),
        Ok(Frame::trailers(trailers)),
    ];
    http::Response::builder()
        .header("content-type", "application/grpc")
        .body(Body::new(StreamBody::new(futures::stream::iter(frames))))
        .unwrap()
}

/// Starts the server on 127.0.0.1, port 0, answering copies as `plan` says
/// (copies past it hang).
async fn serve(plan: Vec<Copy>) -> (SocketAddr, Server) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::default();
    server.plan.lock().unwrap().extend(plan);
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let router = tonic::transport::Server::builder().add_service(server.clone());
    tokio::spawn(async move { router.serve_with_incoming(incoming).await.unwrap() });
    (addr, server)
}

/// Hedges every method of `test.Hedge` with `policy` (a `hedgingPolicy`'s
/// fields), with `extra` added to the document.
fn config(policy: &str, extra: &str) -> ServiceConfig {
    ServiceConfig::from_json(&format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "test.Hedge"}}],
            "hedgingPolicy": {{{policy}}}}}]{extra}}}"#
    ))
    .unwrap()
}

type Client = tonic::client::Grpc<tower_backoff::grpc::GrpcRetry<Channel>>;

/// A client of `addr` through `config`'s layer, warmed up.
///
/// The core's load cap lets a method hedge at most a share of its calls of
/// the last full second (a tenth of a second's slots), and none without
/// calls: `hedge_load_cap(1.0)` allows one hedge per such call, and four
/// warm-up calls of the same method config, a slot in the past, allow the
/// two hedges a test call may need. A6 has no cap; this keeps the tests to
/// A6's behaviour.
async fn client(addr: SocketAddr, config: &ServiceConfig) -> Client {
    let layer = GrpcRetryLayer::builder(config)
        .hedge_load_cap(1.0)
        .build()
        .unwrap();
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(layer.layer(channel));
    for _ in 0..4 {
        unary(&mut grpc, "/test.Hedge/Warm").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(120)).await;
    grpc
}

async fn unary(grpc: &mut Client, path: &'static str) -> Result<String, Status> {
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new("hello".to_owned()),
        PathAndQuery::from_static(path),
        ProstCodec::<String, String>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

async fn call(grpc: &mut Client) -> Result<String, Status> {
    unary(grpc, "/test.Hedge/Call").await
}

const HEDGED: &str =
    r#""maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]"#;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test]
async fn a_hanging_copy_is_hedged_and_the_hedge_answers_and_cancels_it() {
    let (addr, server) = serve(vec![Copy::Hang, Copy::Ok(Duration::ZERO)]).await;
    let mut grpc = client(addr, &config(HEDGED, "")).await;

    let started = Instant::now();
    assert_eq!(call(&mut grpc).await.unwrap(), "copy 2");

    assert!(started.elapsed() >= ms(50), "{:?}", started.elapsed());
    assert_eq!(server.marks(), [None, Some("1".to_owned())]);
    assert_eq!(server.cancelled(1).await, 1, "the first copy is cancelled");
    tokio::time::sleep(ms(100)).await;
    assert_eq!(server.seen().len(), 2, "no third copy once one answered");
}

#[tokio::test]
async fn every_copy_carries_the_number_of_copies_before_it() {
    let (addr, server) = serve(vec![Copy::Hang, Copy::Hang, Copy::Ok(Duration::ZERO)]).await;
    let mut grpc = client(addr, &config(HEDGED, "")).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 3");

    let marks = server.marks();
    assert_eq!(marks, [None, Some("1".to_owned()), Some("2".to_owned())]);
    assert_eq!(server.cancelled(2).await, 2, "both losers are cancelled");
}

#[tokio::test]
async fn a_non_fatal_status_sends_the_next_hedge_at_once() {
    // A long delay: the third copy comes at once after the second fails,
    // not a delay later.
    let policy =
        r#""maxAttempts": 3, "hedgingDelay": "0.3s", "nonFatalStatusCodes": ["UNAVAILABLE"]"#;
    let plan = vec![
        Copy::Hang,
        Copy::Fail(Code::Unavailable, None),
        Copy::Ok(Duration::ZERO),
    ];
    let (addr, server) = serve(plan).await;
    let mut grpc = client(addr, &config(policy, "")).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 3");

    let seen = server.seen();
    let gap = seen[2].at - seen[1].at;
    assert!(gap < ms(150), "the next hedge waited {gap:?}");
    assert_eq!(server.cancelled(1).await, 1);
}

#[tokio::test]
async fn a_fatal_status_commits_at_once_and_cancels_the_others() {
    let plan = vec![Copy::Hang, Copy::Fail(Code::InvalidArgument, None)];
    let (addr, server) = serve(plan).await;
    let mut grpc = client(addr, &config(HEDGED, "")).await;

    let status = call(&mut grpc).await.unwrap_err();

    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(server.cancelled(1).await, 1);
    tokio::time::sleep(ms(120)).await;
    assert_eq!(server.seen().len(), 2, "no copy after a fatal status");
}

#[tokio::test]
async fn a_valid_pushback_stops_further_hedges() {
    // The first copy answers late; without the pushback a third copy would
    // go out as soon as the second failed.
    let plan = vec![Copy::Ok(ms(300)), Copy::Fail(Code::Unavailable, Some("10"))];
    let (addr, server) = serve(plan).await;
    let mut grpc = client(addr, &config(HEDGED, "")).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 1");

    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn an_invalid_pushback_ends_the_call_with_its_status() {
    let plan = vec![Copy::Hang, Copy::Fail(Code::Unavailable, Some("-1"))];
    let (addr, server) = serve(plan).await;
    let mut grpc = client(addr, &config(HEDGED, "")).await;

    let status = call(&mut grpc).await.unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.cancelled(1).await, 1);
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn no_more_than_max_attempts_copies_when_every_one_fails() {
    let failed = Copy::Fail(Code::Unavailable, None);
    let (addr, server) = serve(vec![failed; 5]).await;
    let mut grpc = client(addr, &config(HEDGED, "")).await;

    let status = call(&mut grpc).await.unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    tokio::time::sleep(ms(120)).await;
    assert_eq!(
        server.marks(),
        [None, Some("1".to_owned()), Some("2".to_owned())]
    );
}

#[tokio::test]
async fn throttling_at_half_stops_hedges_but_lets_pending_copies_answer() {
    // Two tokens: one failure leaves 1, not above half.
    let throttling = r#", "retryThrottling": {"maxTokens": 2, "tokenRatio": 0.1}"#;
    let plan = vec![Copy::Ok(ms(200)), Copy::Fail(Code::Unavailable, None)];
    let (addr, server) = serve(plan).await;
    let mut grpc = client(addr, &config(HEDGED, throttling)).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 1");

    assert_eq!(server.seen().len(), 2, "no hedge while throttled");
}

/// Copies sent together share one `ReplayBody`: a hedge's copy is marked
/// concurrent, so it neither ends the older copies still reading the
/// request from its source (as a retry's copy does) nor is ended by them.
#[tokio::test]
async fn a_zero_delay_sends_every_copy_at_once() {
    // Two copies: when every call hedges at once, as the warm-up calls do
    // here, a cap of `1.0` leaves room for one hedge per call in any second.
    let policy = r#""maxAttempts": 2, "nonFatalStatusCodes": []"#;
    let plan = vec![Copy::Hang, Copy::Ok(Duration::ZERO)];
    let (addr, server) = serve(plan).await;
    let mut grpc = client(addr, &config(policy, "")).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 2");

    let seen = server.seen();
    assert!(seen[1].at - seen[0].at < ms(40), "{seen:?}");
    assert_eq!(server.cancelled(1).await, 1);
}

#[test]
fn a_method_with_both_policies_is_rejected() {
    let json = r#"{"methodConfig": [{"name": [{"service": "s"}],
        "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s",
                        "backoffMultiplier": 2, "retryableStatusCodes": [14]},
        "hedgingPolicy": {"maxAttempts": 2}}]}"#;
    let error = ServiceConfig::from_json(json).unwrap_err();
    assert_eq!(error.field(), "hedgingPolicy");
    assert!(error.to_string().contains("methodConfig[0]"), "{error}");
}

#[test]
fn hedging_policy_fields_are_read_with_defaults_and_a6s_limit() {
    let config = config(
        r#""max_attempts": 9, "non_fatal_status_codes": [14, "aborted"]"#,
        "",
    );
    let hedging = config.hedging_config("/test.Hedge/Call").unwrap();
    assert_eq!(hedging.max_attempts(), 5);
    assert_eq!(hedging.hedging_delay(), Duration::ZERO);
    assert!(hedging.non_fatal_codes().contains(Code::Unavailable));
    assert!(hedging.non_fatal_codes().contains(Code::Aborted));
    assert!(config.retry_config("/test.Hedge/Call").is_none());
    let bare = self::config(r#""maxAttempts": 2"#, "");
    let bare = bare.hedging_config("/test.Hedge/Call").unwrap();
    assert!(bare.non_fatal_codes().is_empty());
}

#[test]
fn invalid_hedging_policies_name_the_field() {
    let cases = [
        (r#""maxAttempts": 1"#, "maxAttempts"),
        (r#""maxAttempts": 2.5"#, "maxAttempts"),
        (r#""hedgingDelay": "1s""#, "maxAttempts"),
        (r#""maxAttempts": 2, "hedgingDelay": "-1s""#, "hedgingDelay"),
        (
            r#""maxAttempts": 2, "hedgingDelay": "50ms""#,
            "hedgingDelay",
        ),
        (r#""maxAttempts": 2, "hedgingDelay": 1"#, "hedgingDelay"),
        (
            r#""maxAttempts": 2, "hedgingDelay": "99999999999s""#,
            "hedgingDelay",
        ),
        (
            r#""maxAttempts": 2, "nonFatalStatusCodes": [17]"#,
            "nonFatalStatusCodes",
        ),
        (
            r#""maxAttempts": 2, "nonFatalStatusCodes": "UNAVAILABLE""#,
            "nonFatalStatusCodes",
        ),
    ];
    for (fields, field) in cases {
        let json = format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "s"}}], "hedgingPolicy": {{{fields}}}}}]}}"#
        );
        let error = ServiceConfig::from_json(&json).expect_err(&json);
        assert_eq!(error.field(), field, "{json}: {error}");
        assert!(
            error.to_string().contains("methodConfig[0].hedgingPolicy"),
            "{error}"
        );
    }
    let json = r#"{"methodConfig": [{"name": [{"service": "s"}], "hedgingPolicy": 3}]}"#;
    assert_eq!(
        ServiceConfig::from_json(json).unwrap_err().field(),
        "hedgingPolicy"
    );
}

/// Holds the first copy of each `Call` back for 200 ms before it reaches the
/// channel; hedges and retries (marked with the attempts before them) go
/// out at once.
#[derive(Clone)]
struct LateFirst(Channel);

impl Service<http::Request<Body>> for LateFirst {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<Result<http::Response<Body>, tonic::transport::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let late = request.uri().path().ends_with("/Call")
            && !request.headers().contains_key(PREVIOUS_RPC_ATTEMPTS);
        if !late {
            return Box::pin(self.0.call(request));
        }
        // Called only once the wait is over: the channel sends at `call`.
        let mut channel = self.0.clone();
        Box::pin(async move {
            tokio::time::sleep(ms(200)).await;
            tower::ServiceExt::ready(&mut channel)
                .await?
                .call(request)
                .await
        })
    }
}

/// The hedge fails first, with a pushback of 5 s; the first copy, held back
/// on its way, fails after it without one. A6: the pushback holds, so the
/// third copy waits 5 s rather than going out at once.
#[tokio::test]
async fn a_pushback_on_one_copy_holds_when_another_fails_without_one() {
    let plan = vec![
        Copy::Fail(Code::Unavailable, Some("5000")),
        Copy::Fail(Code::Unavailable, None),
        Copy::Ok(Duration::ZERO),
    ];
    let (addr, server) = serve(plan).await;
    let layer = GrpcRetryLayer::builder(&config(HEDGED, ""))
        .hedge_load_cap(1.0)
        .build()
        .unwrap();
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(layer.layer(LateFirst(channel)));
    for _ in 0..4 {
        grpc.ready().await.unwrap();
        grpc.unary(
            tonic::Request::new("hello".to_owned()),
            PathAndQuery::from_static("/test.Hedge/Warm"),
            ProstCodec::<String, String>::default(),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(ms(120)).await;

    grpc.ready().await.unwrap();
    let start = Instant::now();
    let call = grpc.unary(
        tonic::Request::new("hello".to_owned()),
        PathAndQuery::from_static("/test.Hedge/Call"),
        ProstCodec::<String, String>::default(),
    );
    let outcome = timeout(Duration::from_secs(1), call).await;
    let sent: Vec<_> = server.seen().iter().map(|s| s.at - start).collect();
    assert!(
        outcome.is_err(),
        "answered within a second of a 5 s pushback; copies at {sent:?}"
    );
    assert_eq!(sent.len(), 2, "the hedge and the first copy: {sent:?}");
}

#[tokio::test]
async fn every_hedge_carries_the_time_left_and_none_starts_past_the_calls_deadline() {
    // Copies every 50 ms, up to 5, that never answer; the call's deadline
    // is 120 ms: copies at 0, 50 and 100 ms, none at 150.
    let policy =
        r#""maxAttempts": 5, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]"#;
    let (addr, server) = serve(vec![Copy::Hang; 5]).await;
    let mut grpc = client(addr, &config(policy, "")).await;
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new("hello".to_owned());
    request.set_timeout(ms(120));

    let started = Instant::now();
    let status = grpc
        .unary(
            request,
            PathAndQuery::from_static("/test.Hedge/Call"),
            ProstCodec::<String, String>::default(),
        )
        .await
        .unwrap_err();

    // Cut at the deadline by the channel's own timer: tonic says CANCELLED.
    let elapsed = started.elapsed();
    assert!(elapsed >= ms(120) && elapsed < ms(200), "{elapsed:?}");
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{status:?}"
    );
    tokio::time::sleep(ms(100)).await;
    let seen = server.seen();
    assert_eq!(seen.len(), 3, "no copy after the deadline: {seen:?}");
    assert_eq!(seen[0].timeout, Some(ms(120)));
    for copy in &seen[1..] {
        let left = ms(120).saturating_sub(copy.at - started);
        let carried = copy.timeout.expect("each hedge carries grpc-timeout");
        // Stamped as the hedge is readied, a moment before the server sees it.
        assert!(
            carried >= left && carried <= left + ms(15),
            "{carried:?}, {left:?} left"
        );
    }
}

// ---------------------------------------------------------------------------
// The load cap, where A6 has none: the calls of a method of the last second,
// the hedged call itself included, are what it lets hedge. A full throttle
// stands in for the default budget, so that the cap alone says no.
// ---------------------------------------------------------------------------

const FULL_THROTTLE: &str = r#", "retryThrottling": {"maxTokens": 100, "tokenRatio": 1}"#;

/// A client of `addr` through `config`'s layer with `cap` (the layer's
/// default if `None`) and no warm-up: its first call is an isolated one.
async fn isolated(addr: SocketAddr, config: &ServiceConfig, cap: Option<f64>) -> Client {
    let mut builder = GrpcRetryLayer::builder(config);
    if let Some(cap) = cap {
        builder = builder.hedge_load_cap(cap);
    }
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(builder.build().unwrap().layer(channel))
}

#[tokio::test]
async fn at_cap_one_an_isolated_call_gets_one_hedge_never_its_third_copy() {
    let (addr, server) = serve(vec![Copy::Ok(ms(300)); 3]).await;
    let mut grpc = isolated(addr, &config(HEDGED, FULL_THROTTLE), Some(1.0)).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 1");

    // A6 sends a third copy 100 ms in; the call's own count allows one hedge.
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= ms(50) && gap < ms(100), "{gap:?}");
}

#[tokio::test]
async fn at_cap_one_a_non_fatal_failure_while_a_copy_is_pending_sends_no_third_copy() {
    // Warmed up, the third copy goes at once (a_non_fatal_status_sends_the_
    // next_hedge_at_once); isolated, the cap has no room for it.
    let plan = vec![
        Copy::Ok(ms(300)),
        Copy::Fail(Code::Unavailable, None),
        Copy::Ok(Duration::ZERO),
    ];
    let (addr, server) = serve(plan).await;
    let mut grpc = isolated(addr, &config(HEDGED, FULL_THROTTLE), Some(1.0)).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 1");

    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn once_no_copy_is_pending_the_next_goes_out_whatever_the_cap() {
    // Every copy fails before its hedging delay: each next copy is a retry
    // of the failed attempt, paid from the throttle, not a hedge.
    let failed = Copy::Fail(Code::Unavailable, None);
    let (addr, server) = serve(vec![failed, failed, Copy::Ok(Duration::ZERO)]).await;
    let mut grpc = isolated(addr, &config(HEDGED, FULL_THROTTLE), None).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 3");

    let seen = server.seen();
    assert!(seen[2].at - seen[0].at < ms(50), "{seen:?}");
}

#[tokio::test]
async fn at_the_default_cap_an_isolated_call_gets_no_hedge() {
    let (addr, server) = serve(vec![Copy::Ok(ms(200)); 3]).await;
    let mut grpc = isolated(addr, &config(HEDGED, FULL_THROTTLE), None).await;

    assert_eq!(call(&mut grpc).await.unwrap(), "copy 1");

    assert_eq!(server.seen().len(), 1, "a tenth of one call is no hedge");
}
