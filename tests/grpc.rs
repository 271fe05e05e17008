//! gRPC retries against a real tonic server on 127.0.0.1, through a real
//! tonic `Channel` and tonic's own clients, on tokio's paused clock.
#![cfg(feature = "grpc")]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use prost::Message;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_prost::ProstCodec;
use tower::{Layer, Service, ServiceBuilder};
use tower_backoff::grpc::{
    parse_grpc_timeout, GrpcPolicy, GrpcRetryLayer, ReplayLayer, ServiceConfig, TonicBodyLayer,
    GRPC_TIMEOUT, PREVIOUS_RPC_ATTEMPTS, RETRY_PUSHBACK_MS,
};
use tower_backoff::http::RetryInfo;
use tower_backoff::{BackoffLayer, Constant, Stats};

// ---------------------------------------------------------------------------
// The server: tonic's health service and a hand-written upload service, behind
// a tower layer that answers as the test's script says.
// ---------------------------------------------------------------------------

/// What the server saw of one call.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    previous_attempts: Option<String>,
    /// The `grpc-timeout` the attempt carried.
    timeout: Option<String>,
    body: Bytes,
    at: Instant,
}

/// A scripted answer: a trailers-only status, given instead of the service's.
#[derive(Clone)]
struct Reply {
    code: Code,
    message: &'static str,
    metadata: Vec<(&'static str, &'static str)>,
    pushback: Option<&'static str>,
    /// How long the server takes before it answers.
    after: Duration,
}

fn reply(code: Code) -> Reply {
    Reply {
        code,
        message: "scripted",
        metadata: Vec::new(),
        pushback: None,
        after: Duration::ZERO,
    }
}

fn after(mut reply: Reply, delay: Duration) -> Reply {
    reply.after = delay;
    reply
}

fn with_pushback(mut reply: Reply, pushback: &'static str) -> Reply {
    reply.pushback = Some(pushback);
    reply
}

#[derive(Clone, Default)]
struct Script {
    log: Arc<Mutex<Vec<Seen>>>,
    plan: Arc<Mutex<VecDeque<Reply>>>,
}

impl Script {
    fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

impl<S> Layer<S> for Script {
    type Service = Scripted<S>;

    fn layer(&self, inner: S) -> Scripted<S> {
        Scripted {
            inner,
            script: self.clone(),
        }
    }
}

/// Reads each call's whole body, logs it, then answers with the next
/// scripted status or passes the call on.
#[derive(Clone)]
struct Scripted<S> {
    inner: S,
    script: Script,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for Scripted<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let mut inner = self.inner.clone();
        let script = self.script.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            script.log.lock().unwrap().push(Seen {
                path: parts.uri.path().to_owned(),
                previous_attempts: parts
                    .headers
                    .get(PREVIOUS_RPC_ATTEMPTS)
                    .map(|v| v.to_str().unwrap().to_owned()),
                timeout: parts
                    .headers
                    .get("grpc-timeout")
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
                body: body.clone(),
                at: Instant::now(),
            });
            let next = script.plan.lock().unwrap().pop_front();
            if let Some(reply) = next {
                tokio::time::sleep(reply.after).await;
                let mut metadata = MetadataMap::new();
                for (key, value) in reply.metadata {
                    metadata.insert(key, value.parse().unwrap());
                }
                let status = Status::with_metadata(reply.code, reply.message, metadata);
                let mut response = status.into_http::<Body>();
                if let Some(pushback) = reply.pushback {
                    response
                        .headers_mut()
                        .insert(RETRY_PUSHBACK_MS, pushback.parse().unwrap());
                }
                return Ok(response);
            }
            let request = http::Request::from_parts(parts, Body::new(Full::new(body)));
            inner.call(request).await
        })
    }
}

/// A gRPC message frame: uncompressed flag, length, the protobuf bytes.
fn frame(message: &str) -> Bytes {
    let encoded = message.to_owned().encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + encoded.len());
    framed.put_u8(0);
    framed.put_u32(encoded.len() as u32);
    framed.put_slice(&encoded);
    framed.freeze()
}

/// `test.Upload`, written by hand (no codegen): `Send` is client-streaming and
/// answers how many bytes it read; `Watch` is server-streaming and fails
/// after its first message, with the response headers long sent.
#[derive(Clone)]
struct Upload;

impl tonic::server::NamedService for Upload {
    const NAME: &'static str = "test.Upload";
}

impl Service<http::Request<Body>> for Upload {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        Box::pin(async move {
            let path = request.uri().path().to_owned();
            let read = request
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .len();
            let mut trailers = http::HeaderMap::new();
            let message = if path.ends_with("/Watch") {
                trailers.insert("grpc-status", "14".parse().unwrap());
                trailers.insert("grpc-message", "gone".parse().unwrap());
                "first".to_owned()
            } else {
                trailers.insert("grpc-status", "0".parse().unwrap());
                format!("read {read} bytes")
            };
            let frames = vec![
                Ok::<_, Infallible>(Frame::data(frame(&message))),
                Ok(Frame::trailers(trailers)),
            ];
            let body = Body::new(StreamBody::new(futures::stream::iter(frames)));
            Ok(http::Response::builder()
                .header("content-type", "application/grpc")
                .body(body)
                .unwrap())
        })
    }
}

/// Starts the server on 127.0.0.1, port 0; it answers `plan` first.
async fn serve(plan: Vec<Reply>) -> (SocketAddr, Script) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let script = Script::default();
    script.plan.lock().unwrap().extend(plan);
    let (_reporter, health) = tonic_health::server::health_reporter();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let router = tonic::transport::Server::builder()
        .layer(script.clone())
        .add_service(health)
        .add_service(Upload);
    tokio::spawn(async move {
        let _reporter = _reporter;
        router.serve_with_incoming(incoming).await.unwrap();
    });
    (addr, script)
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn config(json: &str) -> ServiceConfig {
    ServiceConfig::from_json(json).unwrap()
}

/// A config retrying every method with these settings.
fn retry_config(attempts: u32, initial: &str, codes: &str) -> ServiceConfig {
    config(&format!(
        r#"{{"methodConfig": [{{"name": [{{}}], "retryPolicy": {{
            "maxAttempts": {attempts}, "initialBackoff": "{initial}", "maxBackoff": "10s",
            "backoffMultiplier": 2, "retryableStatusCodes": {codes}}}}}]}}"#
    ))
}

fn health_check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

// ---------------------------------------------------------------------------
// Unary calls
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn unavailable_is_retried_then_ok_with_attempts_marked() {
    let (addr, script) = serve(vec![reply(Code::Unavailable), reply(Code::Unavailable)]).await;
    let layer = GrpcRetryLayer::new(&retry_config(4, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    let response = client
        .check(health_check())
        .await
        .expect("the third attempt succeeds");

    assert_eq!(response.get_ref().status, 1, "SERVING");
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().attempts,
        3
    );
    let seen = script.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen
        .iter()
        .all(|s| s.path == "/grpc.health.v1.Health/Check"));
    let marks: Vec<_> = seen
        .iter()
        .map(|s| s.previous_attempts.as_deref())
        .collect();
    assert_eq!(marks, [None, Some("1"), Some("2")]);
    assert!(seen.windows(2).all(|w| w[0].body == w[1].body));
}

#[tokio::test(start_paused = true)]
async fn plain_backoff_layer_with_replay_layers_retries_a_channel() {
    let (addr, script) = serve(vec![reply(Code::Unavailable)]).await;
    let svc = ServiceBuilder::new()
        .layer(ReplayLayer::new())
        .layer(
            BackoffLayer::builder()
                .policy(GrpcPolicy::new())
                .schedule(Constant::new(Duration::from_millis(50)))
                .build()
                .unwrap(),
        )
        .layer(TonicBodyLayer)
        .service(channel(addr).await);
    let mut client = HealthClient::new(svc);

    let response = client.check(health_check()).await.unwrap();

    assert_eq!(response.get_ref().status, 1);
    assert_eq!(script.seen().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn non_retryable_code_returns_at_once_with_message_and_metadata() {
    let mut invalid = reply(Code::InvalidArgument);
    invalid.message = "bad service name";
    invalid.metadata = vec![("x-reason", "name too long")];
    let (addr, script) = serve(vec![invalid]).await;
    let layer = GrpcRetryLayer::new(&retry_config(5, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));
    let started = Instant::now();

    let status = client.check(health_check()).await.unwrap_err();

    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "bad service name");
    assert_eq!(status.metadata().get("x-reason").unwrap(), "name too long");
    assert_eq!(script.seen().len(), 1);
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_max_attempts_with_the_last_status() {
    let (addr, script) = serve(vec![reply(Code::Unavailable); 10]).await;
    let layer = GrpcRetryLayer::new(&retry_config(3, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    let status = client.check(health_check()).await.unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(script.seen().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn max_elapsed_bounds_the_whole_call() {
    let (addr, script) = serve(vec![reply(Code::Unavailable); 10]).await;
    // Backoffs of 0.8 to 1.2 s: a second retry would end past 1.5 s.
    let config = retry_config(5, "1s", r#"["UNAVAILABLE"]"#);
    let layer = GrpcRetryLayer::builder(&config)
        .max_elapsed(Duration::from_millis(1500))
        .build()
        .unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    let status = client.check(health_check()).await.unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(script.seen().len(), 2);
    assert_eq!(
        GrpcRetryLayer::builder(&config)
            .max_elapsed(Duration::ZERO)
            .build()
            .unwrap_err()
            .field(),
        "max_elapsed"
    );
}

// ---------------------------------------------------------------------------
// Pushback
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn pushback_delay_is_honoured_on_the_paused_clock() {
    let throttled = with_pushback(reply(Code::ResourceExhausted), "1500");
    let (addr, script) = serve(vec![throttled]).await;
    // The schedule alone would wait 8 to 12 seconds.
    let codes = r#"["UNAVAILABLE", "RESOURCE_EXHAUSTED"]"#;
    let layer = GrpcRetryLayer::new(&retry_config(3, "10s", codes)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    let response = client.check(health_check()).await.unwrap();

    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts, 2);
    assert_eq!(info.slept, Duration::from_millis(1500));
    let seen = script.seen();
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(1500) && gap < Duration::from_millis(1600),
        "{gap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_backoff_starts_over_after_a_pushback() {
    // Attempt 1: UNAVAILABLE, backoff ~1 s. Attempt 2: pushback 3 s.
    // Attempt 3: UNAVAILABLE: the schedule starts over at ~1 s (A6), where
    // going on would have waited its third step, ~4 s.
    let (addr, script) = serve(vec![
        reply(Code::Unavailable),
        with_pushback(reply(Code::Unavailable), "3000"),
        reply(Code::Unavailable),
    ])
    .await;
    let layer = GrpcRetryLayer::new(&retry_config(4, "1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    client.check(health_check()).await.unwrap();

    let seen = script.seen();
    assert_eq!(seen.len(), 4);
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].at - w[0].at).collect();
    let within = |gap: Duration, low: u64, high: u64| {
        gap >= Duration::from_millis(low) && gap < Duration::from_millis(high)
    };
    assert!(within(gaps[0], 800, 1300), "first backoff: {gaps:?}");
    assert!(within(gaps[1], 3000, 3100), "the pushback: {gaps:?}");
    assert!(within(gaps[2], 800, 1300), "started over: {gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn negative_pushback_stops_retries() {
    let (addr, script) = serve(vec![with_pushback(reply(Code::Unavailable), "-1")]).await;
    let layer = GrpcRetryLayer::new(&retry_config(5, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    let status = client.check(health_check()).await.unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(script.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn hostile_pushback_ends_the_call_at_once() {
    let plan = vec![
        with_pushback(reply(Code::Unavailable), "2147483647"),
        with_pushback(reply(Code::Unavailable), "99999999999999999999"),
        with_pushback(reply(Code::Unavailable), "12abc"),
    ];
    let (addr, script) = serve(plan).await;
    let layer = GrpcRetryLayer::new(&retry_config(5, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));
    let started = Instant::now();

    for _ in 0..3 {
        let status = client.check(health_check()).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
    }

    assert_eq!(script.seen().len(), 3, "each call made one attempt");
    assert_eq!(started.elapsed(), Duration::ZERO);
}

// ---------------------------------------------------------------------------
// The call's deadline (grpc-timeout, issue 51)
// ---------------------------------------------------------------------------

/// A health check whose deadline, sent as `grpc-timeout`, is `timeout` away.
fn check_within(timeout: Duration) -> tonic::Request<HealthCheckRequest> {
    let mut request = tonic::Request::new(health_check());
    request.set_timeout(timeout);
    request
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The time a `grpc-timeout` the server saw names.
fn carried(seen: &Seen) -> Duration {
    let mut headers = http::HeaderMap::new();
    let value = seen
        .timeout
        .as_deref()
        .expect("the attempt carries grpc-timeout");
    headers.insert(GRPC_TIMEOUT, value.parse().unwrap());
    parse_grpc_timeout(&headers).expect("a well-formed grpc-timeout")
}

#[tokio::test(start_paused = true)]
async fn a_retry_whose_backoff_would_end_past_the_calls_deadline_is_not_sent() {
    // Deadline 500 ms, backoff 1.6 to 2.4 s, a server always UNAVAILABLE.
    let (addr, script) = serve(vec![reply(Code::Unavailable); 5]).await;
    let layer = GrpcRetryLayer::new(&retry_config(5, "2s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));
    let started = Instant::now();

    let status = client.check(check_within(ms(500))).await.unwrap_err();

    // The last real outcome, at once: no sleep that could not end in time.
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "scripted");
    assert_eq!(script.seen().len(), 1);
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn each_retry_carries_the_time_left_and_the_call_ends_at_its_deadline() {
    // Deadline 500 ms; the server fails after 300 ms; backoff 80 to 120 ms.
    let slow = after(reply(Code::Unavailable), ms(300));
    let (addr, script) = serve(vec![slow; 5]).await;
    let layer = GrpcRetryLayer::new(&retry_config(5, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));
    let started = Instant::now();

    let status = client.check(check_within(ms(500))).await.unwrap_err();

    // The second attempt is cut at the deadline by the channel's own timer
    // (its grpc-timeout is the time left); no third goes out.
    let elapsed = started.elapsed();
    assert!(elapsed >= ms(500) && elapsed <= ms(502), "{elapsed:?}");
    assert_ne!(status.code(), Code::Ok);
    let seen = script.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(carried(&seen[0]), ms(500));
    let left = ms(500) - (seen[1].at - started);
    let second = carried(&seen[1]);
    assert!(
        second <= left && second + ms(1) >= left,
        "{second:?}, {left:?} left"
    );
    assert!(second < ms(150), "{second:?}");
}

#[tokio::test(start_paused = true)]
async fn a_slow_call_past_its_deadline_is_not_retried_even_with_deadline_exceeded_retryable() {
    // Deadline 300 ms; the server takes a second, then says DEADLINE_EXCEEDED.
    let slow = after(reply(Code::DeadlineExceeded), Duration::from_secs(1));
    let (addr, script) = serve(vec![slow; 5]).await;
    let codes = r#"["UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"]"#;
    let layer = GrpcRetryLayer::new(&retry_config(5, "0.01s", codes)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));
    let started = Instant::now();

    let status = client.check(check_within(ms(300))).await.unwrap_err();

    let elapsed = started.elapsed();
    assert!(elapsed >= ms(300) && elapsed <= ms(302), "{elapsed:?}");
    // The channel's timer cut the attempt at the deadline: tonic's own
    // status for it, the last real outcome.
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(script.seen().len(), 1, "an expired call is never retried");
}

#[tokio::test(start_paused = true)]
async fn a_pushback_over_max_pushback_is_waited_when_it_ends_before_the_calls_deadline() {
    // 90 s is past the default max_pushback (60 s), within the call's 120 s.
    let (addr, script) = serve(vec![with_pushback(reply(Code::Unavailable), "90000")]).await;
    let layer = GrpcRetryLayer::new(&retry_config(3, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    let response = client
        .check(check_within(Duration::from_secs(120)))
        .await
        .unwrap();

    assert_eq!(response.get_ref().status, 1);
    let seen = script.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_secs(90) && gap < ms(90_100),
        "{gap:?}"
    );
    let second = carried(&seen[1]);
    assert!(
        second <= Duration::from_secs(30) && second >= ms(29_900),
        "{second:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pushback_past_the_calls_deadline_ends_the_call_at_once_with_its_status() {
    let (addr, script) = serve(vec![with_pushback(reply(Code::Unavailable), "20000")]).await;
    let layer = GrpcRetryLayer::new(&retry_config(3, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));
    let started = Instant::now();

    let status = client
        .check(check_within(Duration::from_secs(10)))
        .await
        .unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(script.seen().len(), 1);
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn malformed_grpc_timeouts_are_ignored_and_passed_on_untouched() {
    let hostile: [&[u8]; 8] = [
        b"123456789m",
        b"-5m",
        b"5x",
        b"m",
        b"",
        b"1.5S",
        b"\xff5m",
        b"18446744073709551616n",
    ];
    let (addr, script) = serve(Vec::new()).await;
    let layer = GrpcRetryLayer::new(&retry_config(3, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let connected = channel(addr).await;

    for (n, value) in hostile.into_iter().enumerate() {
        // tonic strips grpc-timeout from metadata: set it below the client.
        let raw = http::HeaderValue::from_bytes(value).unwrap();
        let svc = ServiceBuilder::new()
            .map_request(move |mut request: http::Request<Body>| {
                request.headers_mut().insert(GRPC_TIMEOUT, raw.clone());
                request
            })
            .layer(layer.clone())
            .service(connected.clone());
        let mut client = HealthClient::new(svc);
        script
            .plan
            .lock()
            .unwrap()
            .push_back(reply(Code::Unavailable));
        client
            .check(health_check())
            .await
            .expect("retried as a call without a deadline");
        let seen = script.seen();
        assert_eq!(seen.len(), 2 * (n + 1), "{value:?}");
        for attempt in &seen[2 * n..] {
            let expected = String::from_utf8_lossy(value).into_owned();
            assert_eq!(attempt.timeout.as_deref(), Some(&*expected), "{value:?}");
        }
    }
    // The longest valid value (tonic's `set_timeout` panics on it) is a
    // deadline 11,400 years away, without overflow; the retry carries the
    // time left, in hours.
    let svc = ServiceBuilder::new()
        .map_request(|mut request: http::Request<Body>| {
            let longest = http::HeaderValue::from_static("99999999H");
            request.headers_mut().insert(GRPC_TIMEOUT, longest);
            request
        })
        .layer(layer.clone())
        .service(connected.clone());
    script
        .plan
        .lock()
        .unwrap()
        .push_back(reply(Code::Unavailable));
    HealthClient::new(svc).check(health_check()).await.unwrap();
    let seen = script.seen();
    let last = seen.last().unwrap();
    assert_eq!(last.previous_attempts.as_deref(), Some("1"));
    assert!(carried(last) > Duration::from_secs(99_999_990 * 3600));
}

// ---------------------------------------------------------------------------
// Streaming
// ---------------------------------------------------------------------------

fn codec() -> ProstCodec<String, String> {
    ProstCodec::default()
}

/// One call of the scripted `/test.Upload/Watch`: its headers and first
/// message come, then the status its trailers carry.
async fn watch(grpc: &mut tonic::client::Grpc<tower_backoff::grpc::GrpcRetry<Channel>>) -> Status {
    grpc.ready().await.unwrap();
    let response = grpc
        .server_streaming(
            tonic::Request::new("watch".to_owned()),
            PathAndQuery::from_static("/test.Upload/Watch"),
            codec(),
        )
        .await
        .expect("headers without a status commit the call");
    let mut stream = response.into_inner();
    assert_eq!(stream.message().await.unwrap().as_deref(), Some("first"));
    stream.message().await.unwrap_err()
}

#[tokio::test(start_paused = true)]
async fn committed_streaming_response_is_not_retried() {
    let (addr, script) = serve(Vec::new()).await;
    let layer = GrpcRetryLayer::new(&retry_config(5, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let mut grpc = tonic::client::Grpc::new(layer.layer(channel(addr).await));

    let status = watch(&mut grpc).await;

    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "gone");
    assert_eq!(script.seen().len(), 1);
}

fn messages(count: usize, size: usize) -> Vec<String> {
    (0..count)
        .map(|i| char::from(b'a' + i as u8).to_string().repeat(size))
        .collect()
}

async fn upload(
    layer: &GrpcRetryLayer,
    addr: SocketAddr,
    messages: Vec<String>,
) -> Result<String, Status> {
    let mut grpc = tonic::client::Grpc::new(layer.layer(channel(addr).await));
    grpc.ready().await.unwrap();
    grpc.client_streaming(
        tonic::Request::new(futures::stream::iter(messages)),
        PathAndQuery::from_static("/test.Upload/Send"),
        codec(),
    )
    .await
    .map(tonic::Response::into_inner)
}

#[tokio::test(start_paused = true)]
async fn client_streaming_body_is_replayed_byte_identical() {
    let (addr, script) = serve(vec![reply(Code::Unavailable)]).await;
    let layer = GrpcRetryLayer::new(&retry_config(3, "0.1s", r#"["UNAVAILABLE"]"#)).unwrap();
    let sent = messages(3, 1000);

    let answer = upload(&layer, addr, sent.clone()).await.unwrap();

    let expected: Vec<u8> = sent.iter().flat_map(|m| frame(m).to_vec()).collect();
    assert_eq!(answer, format!("read {} bytes", expected.len()));
    let seen = script.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, expected);
    assert_eq!(seen[1].body, expected, "the retry sends the same bytes");
    assert_eq!(seen[1].previous_attempts.as_deref(), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn body_over_the_replay_limit_commits_the_call() {
    let (addr, script) = serve(vec![reply(Code::Unavailable)]).await;
    let layer = GrpcRetryLayer::builder(&retry_config(3, "0.1s", r#"["UNAVAILABLE"]"#))
        .replay_limit(1024)
        .build()
        .unwrap();

    let status = upload(&layer, addr, messages(3, 1000)).await.unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        script.seen().len(),
        1,
        "past the limit, nothing is replayed"
    );
    // Within the limit, the same call is retried.
    script
        .plan
        .lock()
        .unwrap()
        .push_back(reply(Code::Unavailable));
    upload(&layer, addr, messages(1, 500)).await.unwrap();
    assert_eq!(script.seen().len(), 3);
}

// ---------------------------------------------------------------------------
// Throttling and transport failures
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn throttling_stops_retries_once_tokens_fall_to_half() {
    let (addr, script) = serve(vec![reply(Code::Unavailable); 4]).await;
    let config = config(
        r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
              "maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s",
              "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
            "retryThrottling": {"maxTokens": 4, "tokenRatio": 1}}"#,
    );
    let layer = GrpcRetryLayer::new(&config).unwrap();
    let throttle = Arc::clone(layer.throttle().expect("the config asks for throttling"));
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    // 4 tokens, threshold 2: the first failure leaves 3 (retried), the second
    // 2 (not above half: returned).
    client.check(health_check()).await.unwrap_err();
    assert_eq!(script.seen().len(), 2);
    assert_eq!(throttle.tokens(), 2.0);
    // Now every failure is returned at once.
    client.check(health_check()).await.unwrap_err();
    client.check(health_check()).await.unwrap_err();
    assert_eq!(script.seen().len(), 4);
    assert_eq!(throttle.tokens(), 0.0);
    // The server is back: each success adds tokenRatio.
    for expected in [1.0, 2.0, 3.0] {
        client.check(health_check()).await.unwrap();
        assert_eq!(throttle.tokens(), expected);
    }
    assert!(throttle.allows_retry());
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_stops_its_retry_takes_one_token_and_its_throttled_retry_none() {
    let (addr, script) = serve(vec![reply(Code::Unavailable); 4]).await;
    let config = config(
        r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
              "maxAttempts": 5, "initialBackoff": "2s", "maxBackoff": "2s",
              "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
            "retryThrottling": {"maxTokens": 4, "tokenRatio": 1}}"#,
    );
    let layer = GrpcRetryLayer::new(&config).unwrap();
    let throttle = Arc::clone(layer.throttle().unwrap());
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    // Backoff 1.6 to 2.4 s, deadline 500 ms: the failure counts (A6 counts
    // every failed call), the retry the deadline stops is never sent.
    let status = client.check(check_within(ms(500))).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(script.seen().len(), 1);
    assert_eq!(throttle.tokens(), 3.0);
    // At the threshold the throttle stops the retry first: at once, as the
    // deadline does, one token for the failure.
    client.check(check_within(ms(500))).await.unwrap_err();
    let started = Instant::now();
    client
        .check(check_within(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(script.seen().len(), 3);
    assert_eq!(throttle.tokens(), 1.0);
}

#[tokio::test(start_paused = true)]
async fn throttling_counts_every_retryable_failure_and_pushback_stop() {
    let mut invalid = with_pushback(reply(Code::InvalidArgument), "-1");
    let plan = vec![
        reply(Code::Unavailable),
        reply(Code::Unavailable),
        invalid.clone(),
        {
            invalid.pushback = None;
            invalid
        },
    ];
    let (addr, script) = serve(plan).await;
    let config = config(
        r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
              "maxAttempts": 2, "initialBackoff": "0.1s", "maxBackoff": "1s",
              "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
            "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#,
    );
    let layer = GrpcRetryLayer::new(&config).unwrap();
    let throttle = Arc::clone(layer.throttle().unwrap());
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    // Both attempts fail, the last one included: 2 tokens.
    client.check(health_check()).await.unwrap_err();
    assert_eq!(script.seen().len(), 2);
    assert_eq!(throttle.tokens(), 8.0);
    // A pushback saying not to retry counts, whatever the code.
    client.check(health_check()).await.unwrap_err();
    assert_eq!(throttle.tokens(), 7.0);
    // A final status without pushback is the caller's mistake, not the
    // server's failure: not counted.
    client.check(health_check()).await.unwrap_err();
    assert_eq!(throttle.tokens(), 7.0);
    client.check(health_check()).await.unwrap();
    assert_eq!(throttle.tokens(), 7.1);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_fails_after_its_headers_takes_a_token_and_never_counts_as_a_success() {
    let (addr, script) = serve(Vec::new()).await;
    let config = config(
        r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
              "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
              "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
            "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5}}"#,
    );
    let layer = GrpcRetryLayer::new(&config).unwrap();
    let throttle = Arc::clone(layer.throttle().unwrap());
    let mut grpc = tonic::client::Grpc::new(layer.layer(channel(addr).await));

    // Headers, a message, then UNAVAILABLE in the trailers: a failed call,
    // one token less (A6), where counting its headers added tokenRatio.
    for expected in [9.0, 8.0, 7.0] {
        assert_eq!(watch(&mut grpc).await.code(), Code::Unavailable);
        assert_eq!(throttle.tokens(), expected);
    }
    assert_eq!(script.seen().len(), 3, "committed: never retried");
    // A committed call that ends OK in its trailers adds tokenRatio.
    HealthClient::new(layer.layer(channel(addr).await))
        .check(health_check())
        .await
        .unwrap();
    assert_eq!(throttle.tokens(), 7.5);
}

#[tokio::test(start_paused = true)]
async fn refused_connection_is_retried_transparently_without_counting() {
    // A port nobody listens on.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let stats = Stats::default();
    // UNAVAILABLE is not retryable here, and only 2 attempts are allowed.
    let layer = GrpcRetryLayer::builder(&retry_config(2, "1s", r#"["ABORTED"]"#))
        .stats(stats.clone())
        .build()
        .unwrap();
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let mut client = HealthClient::new(layer.layer(channel));

    let status = client.check(health_check()).await.unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    let counts = stats.snapshot();
    // The transparent retry went out at once and did not count; past it the
    // retry policy decides (A6), and UNAVAILABLE is not retryable here: no
    // ordinary retry, no backoff (issue 28, defect 3).
    assert_eq!(counts.attempts, 2, "{counts:?}");
    assert_eq!(counts.retries, 1, "{counts:?}");
    assert_eq!(counts.slept, Duration::ZERO, "{counts:?}");
}

/// A bare HTTP/2 server (h2, no gRPC library) that refuses the first stream
/// with `REFUSED_STREAM`, then answers every health check `SERVING`.
async fn refusing_server() -> (SocketAddr, Arc<Mutex<u32>>) {
    refusing_server_for(1).await
}

/// As [`refusing_server`], refusing the first `refused` streams.
async fn refusing_server_for(refused: u32) -> (SocketAddr, Arc<Mutex<u32>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let streams = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&streams);
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut connection = h2::server::handshake(socket).await.unwrap();
        while let Some(Ok((_request, mut respond))) = connection.accept().await {
            let n = {
                let mut streams = counted.lock().unwrap();
                *streams += 1;
                *streams
            };
            if n <= refused {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
                continue;
            }
            let head = http::Response::builder()
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            let mut send = respond.send_response(head, false).unwrap();
            // HealthCheckResponse { status: SERVING }, framed.
            let message = [0u8, 0, 0, 0, 2, 0x08, 0x01];
            send.send_data(Bytes::copy_from_slice(&message), false)
                .unwrap();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            send.send_trailers(trailers).unwrap();
        }
    });
    (addr, streams)
}

#[tokio::test(start_paused = true)]
async fn refused_stream_is_retried_transparently_even_unconfigured() {
    let (addr, streams) = refusing_server().await;
    let stats = Stats::default();
    // No retry policy at all for the health service.
    let layer = GrpcRetryLayer::builder(&ServiceConfig::default())
        .stats(stats.clone())
        .build()
        .unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));

    let response = client.check(health_check()).await.unwrap();

    assert_eq!(response.get_ref().status, 1);
    assert_eq!(*streams.lock().unwrap(), 2);
    let counts = stats.snapshot();
    assert_eq!((counts.attempts, counts.slept), (2, Duration::ZERO));
}

/// Defect 3 of issue 28: A6 allows one transparent retry; past it, the
/// method's retry policy decides on the UNAVAILABLE a refused stream amounts
/// to. Streams a call makes when the server refuses every one.
async fn streams_when_every_stream_is_refused(config: &ServiceConfig) -> u32 {
    let (addr, streams) = refusing_server_for(u32::MAX).await;
    let layer = GrpcRetryLayer::new(config).unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));
    let status = client.check(health_check()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let made = *streams.lock().unwrap();
    made
}

#[tokio::test(start_paused = true)]
async fn a_second_refused_stream_is_not_retried_without_a_retry_policy() {
    let streams = streams_when_every_stream_is_refused(&ServiceConfig::default()).await;
    assert_eq!(streams, 2, "the call and its one transparent retry");
}

#[tokio::test(start_paused = true)]
async fn a_second_refused_stream_is_not_retried_when_unavailable_is_not_retryable() {
    let aborted_only = retry_config(5, "0.1s", r#"["ABORTED"]"#);
    let streams = streams_when_every_stream_is_refused(&aborted_only).await;
    assert_eq!(streams, 2, "the call and its one transparent retry");
}

#[tokio::test(start_paused = true)]
async fn past_the_transparent_retry_refused_streams_count_against_max_attempts() {
    let unavailable = retry_config(3, "0.1s", r#"["UNAVAILABLE"]"#);
    let streams = streams_when_every_stream_is_refused(&unavailable).await;
    assert_eq!(streams, 4, "3 attempts, and the free transparent one");
}

// ---------------------------------------------------------------------------
// Service config
// ---------------------------------------------------------------------------

#[test]
fn service_config_reads_every_retry_field() {
    let config = config(
        r#"{
          "loadBalancingConfig": [{"round_robin": {}}],
          "methodConfig": [
            {"name": [{"service": "pkg.Svc", "method": "Get"}, {"service": "pkg.Other"}],
             "timeout": "3s",
             "retryPolicy": {"maxAttempts": 9, "initialBackoff": ".25s", "maxBackoff": "2.5s",
                             "backoffMultiplier": 1.5,
                             "retryableStatusCodes": ["UNAVAILABLE", "aborted", 4]}},
            {"name": [{"service": "pkg.Svc"}]}
          ],
          "retryThrottling": {"maxTokens": 100, "tokenRatio": 0.5466}
        }"#,
    );
    let get = config.retry_config("/pkg.Svc/Get").unwrap();
    assert_eq!(get.max_attempts(), 5, "more than 5 counts as 5");
    assert_eq!(get.initial_backoff(), Duration::from_millis(250));
    assert_eq!(get.max_backoff(), Duration::from_millis(2500));
    assert_eq!(get.backoff_multiplier(), 1.5);
    let codes: Vec<_> = get.retryable_codes().iter().collect();
    assert_eq!(
        codes,
        [Code::DeadlineExceeded, Code::Aborted, Code::Unavailable]
    );
    assert_eq!(config.retry_config("/pkg.Other/Any"), Some(get));
    assert_eq!(
        config.retry_config("/pkg.Svc/Put"),
        None,
        "configured without retries"
    );
    assert_eq!(config.retry_config("/elsewhere.Svc/Get"), None);
    let throttling = config.retry_throttling().unwrap();
    assert_eq!(throttling.max_tokens(), 100.0);
    assert_eq!(throttling.token_ratio(), 0.546, "three decimal places");
}

#[test]
fn service_config_accepts_snake_case_and_an_empty_document() {
    let config = config(
        r#"{"method_config": [{"name": [{"service": ""}], "retry_policy": {
            "max_attempts": 2, "initial_backoff": "1s", "max_backoff": "1s",
            "backoff_multiplier": 1, "retryable_status_codes": [14]}}]}"#,
    );
    assert_eq!(
        config.retry_config("/any.Svc/Any").unwrap().max_attempts(),
        2
    );
    let empty = ServiceConfig::from_json("{}").unwrap();
    assert!(empty.retry_config("/any.Svc/Any").is_none());
    assert!(empty.retry_throttling().is_none());
}

#[test]
fn invalid_service_configs_name_the_field() {
    let policy = |fields: &str| {
        format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "s"}}], "retryPolicy": {{{fields}}}}}]}}"#
        )
    };
    let valid = r#""maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": [14]"#;
    assert!(ServiceConfig::from_json(&policy(valid)).is_ok());
    let cases: Vec<(String, &str)> = vec![
        ("not json".into(), "serviceConfig"),
        ("[]".into(), "serviceConfig"),
        (r#"{"methodConfig": {}}"#.into(), "methodConfig"),
        (
            policy(&valid.replace(r#""maxAttempts": 3"#, r#""maxAttempts": 1"#)),
            "maxAttempts",
        ),
        (
            policy(&valid.replace(r#""maxAttempts": 3"#, r#""maxAttempts": 2.5"#)),
            "maxAttempts",
        ),
        (
            policy(&valid.replace(r#""maxAttempts": 3"#, r#""maxAttempts": "3""#)),
            "maxAttempts",
        ),
        (
            policy(&valid.replace(r#""maxAttempts": 3, "#, "")),
            "maxAttempts",
        ),
        (
            policy(&valid.replace(r#""initialBackoff": "1s""#, r#""initialBackoff": "0s""#)),
            "initialBackoff",
        ),
        (
            policy(&valid.replace(r#""initialBackoff": "1s""#, r#""initialBackoff": "100ms""#)),
            "initialBackoff",
        ),
        (
            policy(&valid.replace(r#""initialBackoff": "1s""#, r#""initialBackoff": 1"#)),
            "initialBackoff",
        ),
        (
            policy(&valid.replace(r#""maxBackoff": "1s""#, r#""maxBackoff": "-1s""#)),
            "maxBackoff",
        ),
        (
            policy(&valid.replace(r#""maxBackoff": "1s""#, r#""maxBackoff": "99999999999s""#)),
            "maxBackoff",
        ),
        (
            policy(&valid.replace(r#""backoffMultiplier": 2"#, r#""backoffMultiplier": 0"#)),
            "backoffMultiplier",
        ),
        (
            policy(&valid.replace(r#""backoffMultiplier": 2"#, r#""backoffMultiplier": "2""#)),
            "backoffMultiplier",
        ),
        (policy(&valid.replace("[14]", "[]")), "retryableStatusCodes"),
        (
            policy(&valid.replace("[14]", "[17]")),
            "retryableStatusCodes",
        ),
        (
            policy(&valid.replace("[14]", r#"["NOT_A_CODE"]"#)),
            "retryableStatusCodes",
        ),
        (policy(&valid.replace("[14]", "14")), "retryableStatusCodes"),
        (
            format!(
                r#"{{"methodConfig": [{{"name": [{{"service": "s"}}], "retryPolicy": {{{valid}}},
                    "hedgingPolicy": {{"maxAttempts": 2}}}}]}}"#
            ),
            "hedgingPolicy",
        ),
        (
            r#"{"methodConfig": [{"name": [{"method": "M"}]}]}"#.into(),
            "method",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": 5}]}]}"#.into(),
            "service",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}]}, {"name": [{"service": "s"}]}]}"#
                .into(),
            "name",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#.into(),
            "maxTokens",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 1001, "tokenRatio": 0.1}}"#.into(),
            "maxTokens",
        ),
        (
            r#"{"retryThrottling": {"tokenRatio": 0.1}}"#.into(),
            "maxTokens",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0}}"#.into(),
            "tokenRatio",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": "0.1"}}"#.into(),
            "tokenRatio",
        ),
    ];
    for (json, field) in cases {
        let error = ServiceConfig::from_json(&json).expect_err(&json);
        assert_eq!(error.field(), field, "{json}: {error}");
    }
}

#[test]
fn errors_say_where_the_field_is() {
    let error = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "a"}]}, {"name": [{"service": "b"}],
            "retryPolicy": {"maxAttempts": 1}}]}"#,
    )
    .unwrap_err();
    assert_eq!(error.field(), "maxAttempts");
    assert!(
        error.to_string().contains("methodConfig[1].retryPolicy"),
        "{error}"
    );
}

#[test]
fn a_retrying_channel_and_its_futures_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<tower_backoff::grpc::GrpcRetry<Channel>>();
    send::<tower_backoff::grpc::GrpcResponseFuture<Channel, Body>>();
    send_sync::<GrpcRetryLayer>();
}
