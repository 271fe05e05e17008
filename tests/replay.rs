//! `ReplayBody` through hyper-util's client: what happens to the connection of
//! an attempt whose upload is abandoned when the retry takes over.
//!
//! The server is a raw TCP listener, not hyper: it has to answer 503 after
//! the first chunk, then neither read nor close, which is exactly what leaves
//! the client's connection waiting on the request body.
#![cfg(feature = "hyper")]

use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Request, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::http::{HttpPolicy, ReplayBody};
use tower_backoff::{BackoffLayer, Constant, Jitter};

/// Long enough for anything that happens promptly on a loaded 2-core machine.
const PROMPTLY: Duration = Duration::from_secs(5);

/// Reads from `stream` into `seen` until it contains `needle`.
async fn read_until(stream: &mut TcpStream, seen: &mut Vec<u8>, needle: &[u8]) {
    let mut buf = [0; 4096];
    while !seen.windows(needle.len()).any(|w| w == needle) {
        let n = tokio::time::timeout(PROMPTLY, stream.read(&mut buf))
            .await
            .expect("the client stopped sending")
            .unwrap();
        assert!(n > 0, "the connection closed before {needle:?} arrived");
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Whether the client closes `stream` within [`PROMPTLY`].
async fn closed_promptly(stream: &mut TcpStream) -> bool {
    let mut buf = [0; 4096];
    tokio::time::timeout(PROMPTLY, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

type Chunk = Result<Frame<Bytes>, std::io::Error>;

fn chunk(data: &'static str) -> Chunk {
    Ok(Frame::data(Bytes::from_static(data.as_bytes())))
}

#[tokio::test]
async fn an_abandoned_upload_closes_its_connection_as_soon_as_the_retry_takes_over() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/upload", listener.local_addr().unwrap());
    let (source, frames) = mpsc::unbounded::<Chunk>();
    source.unbounded_send(chunk("first-chunk")).unwrap();

    let client = Client::builder(TokioExecutor::new()).build_http();
    let layer = BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .schedule(Constant::new(Duration::from_millis(10)))
        .jitter(Jitter::None)
        .no_budget()
        .build()
        .unwrap();
    let request = Request::put(url)
        .body(ReplayBody::new(StreamBody::new(frames)))
        .unwrap();
    let response = tokio::spawn(
        ServiceBuilder::new()
            .layer(layer)
            .service(client)
            .oneshot(request),
    );

    // First attempt: 503 after the first chunk, while the upload is still open.
    let (mut first, _) = listener.accept().await.unwrap();
    read_until(&mut first, &mut Vec::new(), b"first-chunk").await;
    first
        .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();

    // The retry replays the recording, then waits on the source too.
    let (mut second, _) = listener.accept().await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut second, &mut seen, b"first-chunk").await;

    // The abandoned copy was woken and failed its body, so hyper closed the
    // first connection; nothing from the network or the source woke it.
    assert!(
        closed_promptly(&mut first).await,
        "the abandoned attempt's connection is still open"
    );

    source.unbounded_send(chunk("second-chunk")).unwrap();
    drop(source);
    read_until(&mut second, &mut seen, b"0\r\n\r\n").await;
    second
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let response = tokio::time::timeout(PROMPTLY, response)
        .await
        .expect("the request did not end")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = String::from_utf8_lossy(&seen);
    assert!(
        body.contains("first-chunk") && body.contains("second-chunk"),
        "{body}"
    );
}
