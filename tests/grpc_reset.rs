//! The gRPC reset table, code by code (issue 44): a real HTTP/2 server on
//! 127.0.0.1 resets every call with one `RST_STREAM` code, and a tonic
//! `Channel` behind `GrpcRetryLayer` calls it. Each code must give the
//! status gRPC's HTTP/2 protocol gives it, and the call must be sent again
//! only when that status is retryable, or when the server provably never
//! processed it (`REFUSED_STREAM`, a `GOAWAY` before it). Every gRPC call is
//! a POST: the codes are the only statement of what is safe to run twice.
//!
//! The status the caller sees is tonic's reading of the error; the number of
//! calls the server got is this crate's.
#![cfg(feature = "grpc")]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::Reason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::{Layer, Service};
use tower_backoff::grpc::{CodeSet, GrpcRetryLayer, ServiceConfig};
use tower_backoff::Stats;

/// How many calls a server got.
type Calls = Arc<AtomicU32>;

fn count(calls: &Calls) -> u32 {
    calls.load(Ordering::SeqCst)
}

/// A config retrying every method up to 3 attempts, 10 ms apart, on `codes`
/// (a JSON list).
fn retry_config(codes: &str) -> ServiceConfig {
    ServiceConfig::from_json(&format!(
        r#"{{"methodConfig": [{{"name": [{{}}], "retryPolicy": {{
            "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
            "backoffMultiplier": 1, "retryableStatusCodes": {codes}}}}}]}}"#
    ))
    .unwrap()
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// One health check through a `GrpcRetryLayer` built from `config`.
async fn check(
    addr: SocketAddr,
    config: &ServiceConfig,
    stats: &Stats,
) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, Status> {
    let layer = GrpcRetryLayer::builder(config)
        .stats(stats.clone())
        .build()
        .unwrap();
    let mut client = HealthClient::new(layer.layer(channel(addr).await));
    client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
}

/// Answers a call `SERVING`: `HealthCheckResponse { status: 1 }`, framed.
fn answer_serving(mut respond: h2::server::SendResponse<Bytes>) {
    let head = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut send = respond.send_response(head, false).unwrap();
    send.send_data(Bytes::from_static(&[0, 0, 0, 0, 2, 0x08, 0x01]), false)
        .unwrap();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    send.send_trailers(trailers).unwrap();
}

// ---------------------------------------------------------------------------
// RST_STREAM, code by code
// ---------------------------------------------------------------------------

/// A raw HTTP/2 server (h2, no gRPC library) that counts every call it gets
/// and resets its stream with `reason`, on every connection.
async fn resetting_server(reason: Reason) -> (SocketAddr, Calls) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Calls::default();
    let counted = Arc::clone(&calls);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut connection = h2::server::handshake(socket).await.unwrap();
                while let Some(Ok((_request, mut respond))) = connection.accept().await {
                    counted.fetch_add(1, Ordering::SeqCst);
                    respond.send_reset(reason);
                }
            });
        }
    });
    (addr, calls)
}

/// Calls a server that resets every stream with `reason`, retrying the
/// statuses `codes` lists, and checks the status the caller sees and the
/// calls the server got.
async fn assert_reset(reason: Reason, codes: &str, status: Code, calls: u32) {
    let (addr, got) = resetting_server(reason).await;
    let stats = Stats::default();
    let seen = check(addr, &retry_config(codes), &stats)
        .await
        .expect_err("every stream is reset");
    assert_eq!(
        seen.code(),
        status,
        "RST_STREAM({reason:?}), retryableStatusCodes {codes}: the caller's status ({seen:?})"
    );
    assert_eq!(
        count(&got),
        calls,
        "RST_STREAM({reason:?}), retryableStatusCodes {codes}: calls the server got ({:?})",
        stats.snapshot()
    );
}

/// One module per `RST_STREAM` code: the status it maps to, and the calls
/// the server gets with `retryableStatusCodes: ["UNAVAILABLE"]` and with
/// only that status retryable (3 attempts at most, plus a transparent one for
/// a stream never processed).
macro_rules! reset_table {
    ($(
        $name:ident: $reason:ident is $code:ident,
            calls $only_unavailable:literal when only UNAVAILABLE is retryable,
            $listed:literal when only it is;
    )*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(start_paused = true)]
            async fn when_only_unavailable_is_retryable() {
                let codes = r#"["UNAVAILABLE"]"#;
                assert_reset(Reason::$reason, codes, Code::$code, $only_unavailable).await;
            }

            /// Retried only if the policy saw exactly this status.
            #[tokio::test(start_paused = true)]
            async fn when_only_its_status_is_retryable() {
                let codes = format!(r#"["{}"]"#, CodeSet::name(Code::$code));
                assert_reset(Reason::$reason, &codes, Code::$code, $listed).await;
            }
        }
    )*};
}

reset_table! {
    no_error_is_internal: NO_ERROR is Internal,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    protocol_error_is_internal: PROTOCOL_ERROR is Internal,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    internal_error_is_internal: INTERNAL_ERROR is Internal,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    flow_control_error_is_internal: FLOW_CONTROL_ERROR is Internal,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    settings_timeout_is_internal: SETTINGS_TIMEOUT is Internal,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    frame_size_error_is_internal: FRAME_SIZE_ERROR is Internal,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    // Never processed: one transparent retry, then the 3 attempts
    // UNAVAILABLE allows.
    refused_stream_is_unavailable_and_never_processed: REFUSED_STREAM is Unavailable,
        calls 4 when only UNAVAILABLE is retryable, 4 when only it is;
    cancel_is_cancelled: CANCEL is Cancelled,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    compression_error_is_internal: COMPRESSION_ERROR is Internal,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    connect_error_is_internal: CONNECT_ERROR is Internal,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    enhance_your_calm_is_resource_exhausted: ENHANCE_YOUR_CALM is ResourceExhausted,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    inadequate_security_is_permission_denied: INADEQUATE_SECURITY is PermissionDenied,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    // Codes gRPC's table does not map: UNKNOWN, as tonic reports them.
    stream_closed_is_unknown: STREAM_CLOSED is Unknown,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
    http_1_1_required_is_unknown: HTTP_1_1_REQUIRED is Unknown,
        calls 1 when only UNAVAILABLE is retryable, 3 when only it is;
}

// ---------------------------------------------------------------------------
// GOAWAY
// ---------------------------------------------------------------------------

const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;

/// An HTTP/2 frame: length, type, flags, stream 0 (all this server sends).
fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = vec![length[1], length[2], length[3], kind, flags, 0, 0, 0, 0];
    frame.extend_from_slice(payload);
    frame
}

/// Speaks just enough HTTP/2 by hand to read the client's first request
/// (h2's server cannot send a GOAWAY below a stream it has read), then
/// sends GOAWAY with last-stream-id 0: the server processed nothing.
async fn go_away_before_processing(mut socket: TcpStream) {
    let mut preface = [0; 24];
    socket.read_exact(&mut preface).await.unwrap();
    socket.write_all(&frame(SETTINGS, 0, &[])).await.unwrap();
    loop {
        let mut head = [0; 9];
        socket.read_exact(&mut head).await.unwrap();
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0; length];
        socket.read_exact(&mut payload).await.unwrap();
        match (head[3], head[4]) {
            (SETTINGS, flags) if flags & ACK == 0 => {
                socket.write_all(&frame(SETTINGS, ACK, &[])).await.unwrap();
            }
            (HEADERS, _) => break,
            _ => {}
        }
    }
    // Last stream id 0, NO_ERROR.
    socket.write_all(&frame(GOAWAY, 0, &[0; 8])).await.unwrap();
    // Read until the client closes: closing first, with its frames unread,
    // could reset the connection before the client reads the GOAWAY.
    let mut sink = [0; 1024];
    while socket.read(&mut sink).await.is_ok_and(|read| read > 0) {}
}

/// A server whose first connection sends GOAWAY before processing the call
/// it got; later connections answer every call `SERVING`. The calls the
/// first connection got, and the calls served.
async fn going_away_server() -> (SocketAddr, Calls, Calls) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (refused, served) = (Calls::default(), Calls::default());
    let (first, counted) = (Arc::clone(&refused), Arc::clone(&served));
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        first.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(go_away_before_processing(socket));
        while let Ok((socket, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut connection = h2::server::handshake(socket).await.unwrap();
                while let Some(Ok((_request, respond))) = connection.accept().await {
                    counted.fetch_add(1, Ordering::SeqCst);
                    answer_serving(respond);
                }
            });
        }
    });
    (addr, refused, served)
}

#[tokio::test(start_paused = true)]
async fn a_call_sent_before_a_goaway_below_it_is_retried_transparently() {
    let (addr, went_away, served) = going_away_server().await;
    let stats = Stats::default();
    // No retry policy: only a call that never left may go again.
    let response = check(addr, &ServiceConfig::default(), &stats)
        .await
        .expect("the call goes again at once, on a new connection");

    assert_eq!(response.get_ref().status, 1);
    assert_eq!(count(&went_away), 1, "the first connection got the call");
    assert_eq!(count(&served), 1, "and only the second processed it");
    let counts = stats.snapshot();
    assert_eq!(
        (counts.attempts, counts.slept),
        (2, Duration::ZERO),
        "{counts:?}"
    );
}

/// A raw HTTP/2 server that counts each call, then ends its connection:
/// with a GOAWAY that says it processed the call (`goaway`), or by closing
/// the socket without one. Every connection does the same.
async fn closing_server(goaway: bool) -> (SocketAddr, Calls) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Calls::default();
    let counted = Arc::clone(&calls);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut connection = h2::server::handshake(socket).await.unwrap();
                let Some(Ok((request, _respond))) = connection.accept().await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                // Read the whole request, so that the close is not a reset.
                let mut body = request.into_body();
                while let Some(Ok(_)) = body.data().await {}
                if goaway {
                    // GOAWAY with last-stream-id 1: this call was processed.
                    connection.abrupt_shutdown(Reason::NO_ERROR);
                    while connection.accept().await.is_some() {}
                }
            });
        }
    });
    (addr, calls)
}

/// Calls a server that ends each call's connection after processing it,
/// retrying `codes`: the calls the server got. The caller sees `UNKNOWN`:
/// tonic reads a broken connection so (gRPC says `UNAVAILABLE`, which is
/// what the policy decides on).
async fn calls_ended_by_their_connection(goaway: bool, codes: &str) -> u32 {
    let (addr, calls) = closing_server(goaway).await;
    let status = check(addr, &retry_config(codes), &Stats::default())
        .await
        .expect_err("no call is answered");
    assert_eq!(status.code(), Code::Unknown, "{status:?}");
    count(&calls)
}

#[tokio::test(start_paused = true)]
async fn a_goaway_after_processing_is_unavailable_and_retried_only_when_that_is_retryable() {
    let calls = calls_ended_by_their_connection(true, r#"["ABORTED"]"#).await;
    assert_eq!(calls, 1, "not retried when UNAVAILABLE is not retryable");
    let calls = calls_ended_by_their_connection(true, r#"["UNAVAILABLE"]"#).await;
    assert_eq!(calls, 3, "retried as UNAVAILABLE");
}

#[tokio::test(start_paused = true)]
async fn a_connection_closed_mid_call_is_unavailable_and_retried_only_when_that_is_retryable() {
    let calls = calls_ended_by_their_connection(false, r#"["ABORTED"]"#).await;
    assert_eq!(calls, 1, "not retried when UNAVAILABLE is not retryable");
    let calls = calls_ended_by_their_connection(false, r#"["UNAVAILABLE"]"#).await;
    assert_eq!(calls, 3, "retried as UNAVAILABLE");
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_retried_transparently_then_as_unavailable() {
    // A port nobody listens on.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let stats = Stats::default();
    let layer = GrpcRetryLayer::builder(&retry_config(r#"["UNAVAILABLE"]"#))
        .stats(stats.clone())
        .build()
        .unwrap();
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let mut client = HealthClient::new(layer.layer(channel));

    let status = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();

    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let counts = stats.snapshot();
    assert_eq!(
        counts.attempts, 4,
        "1, the transparent one, 2 retries: {counts:?}"
    );
}

// ---------------------------------------------------------------------------
// A tonic handler that fails after running
// ---------------------------------------------------------------------------

/// What the panicking handler panics with; the test binary does not print
/// it.
const HANDLER_PANIC: &str = "the handler failed after running";

/// Keeps the handler's expected panic out of the test output, leaving every
/// other panic to the default hook.
fn silence_handler_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&HANDLER_PANIC) {
                default(info);
            }
        }));
    });
}

/// `grpc.health.v1.Health` whose every call counts its run, then panics:
/// hyper resets the stream with `CANCEL`.
#[derive(Clone)]
struct Panicking(Calls);

impl tonic::server::NamedService for Panicking {
    const NAME: &'static str = "grpc.health.v1.Health";
}

impl Service<http::Request<Body>> for Panicking {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Body>) -> Self::Future {
        let runs = Arc::clone(&self.0);
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            std::panic::panic_any(HANDLER_PANIC)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_fails_after_running_is_run_once() {
    silence_handler_panics();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let runs = Calls::default();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let router = tonic::transport::Server::builder().add_service(Panicking(Arc::clone(&runs)));
    tokio::spawn(router.serve_with_incoming(incoming));

    let status = check(addr, &retry_config(r#"["UNAVAILABLE"]"#), &Stats::default())
        .await
        .expect_err("the handler panics");

    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    assert_eq!(
        count(&runs),
        1,
        "a handler that fails after running is run once"
    );
}
