//! A streaming response holds its place until its body ends, and its
//! latency is measured there (issue 52, case 5): server-streaming gRPC,
//! server-sent events and downloads are limited like any request.
#![cfg(feature = "shed")]

use crate::http_server;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tower::{service_fn, Layer, ServiceExt};
use tower_backoff::shed::{Limiter, ShedLayer};

type Chunks = mpsc::Receiver<Bytes>;

/// A body that sends what the channel gives it, and ends when it closes.
fn streaming(
    chunks: Chunks,
) -> StreamBody<impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
    StreamBody::new(
        stream::unfold(chunks, |mut chunks| async move {
            let chunk = chunks.recv().await?;
            Some((Ok(Frame::data(chunk)), chunks))
        })
        .boxed(),
    )
}

#[tokio::test]
async fn over_hyper_a_streaming_body_holds_its_place_until_it_ends() {
    let limiter = Limiter::builder()
        .initial_limit(1)
        .min_limit(1)
        .max_limit(1)
        .seed(5)
        .build()
        .unwrap();
    let layer = ShedLayer::builder()
        .shared_limiter(limiter.clone())
        .build()
        .unwrap();
    let (give, take) = mpsc::channel::<mpsc::Receiver<Bytes>>(1);
    let take = std::sync::Arc::new(tokio::sync::Mutex::new(take));
    let service = layer.layer(service_fn(move |_req: Request<Incoming>| {
        let take = take.clone();
        async move {
            // Each request streams what the test feeds it.
            let chunks = take.lock().await.recv().await.unwrap();
            Ok::<_, Infallible>(Response::new(streaming(chunks)))
        }
    }));
    let addr = http_server::serve_tower(service).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let get = || {
        Request::get(format!("http://{addr}/"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };

    let (feed, chunks) = mpsc::channel(4);
    give.send(chunks).await.unwrap();
    let response = client.request(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    feed.send(Bytes::from_static(b"first")).await.unwrap();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "first");

    // Headers sent, body still streaming: its place is still taken.
    assert_eq!(limiter.in_flight(), 1);
    let shed = client.request(get()).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(shed.headers().contains_key("retry-after"));

    // The body ends: the place is free, and the next request is admitted.
    drop(feed);
    assert!(body.frame().await.is_none());
    for _ in 0..100 {
        if limiter.in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(limiter.in_flight(), 0);
    let (feed, chunks) = mpsc::channel(4);
    give.send(chunks).await.unwrap();
    drop(feed);
    let admitted = client.request(get()).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    admitted.into_body().collect().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_latency_measured_is_the_bodys_not_the_headers() {
    // Headers at once, the body 300 ms later: the baseline is 300 ms.
    let layer = ShedLayer::builder()
        .limiter(Limiter::builder().seed(1))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let server = layer.layer(service_fn(|_req: Request<Full<Bytes>>| async {
        let (feed, chunks) = mpsc::channel(1);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            feed.send(Bytes::from_static(b"late")).await.unwrap();
        });
        Ok::<_, Infallible>(Response::new(streaming(chunks)))
    }));
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            let response = server
                .oneshot(Request::new(Full::new(Bytes::new())))
                .await
                .unwrap();
            response.into_body().collect().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let baseline = limiter.baseline().expect("measured");
    assert!(
        (Duration::from_millis(299)..=Duration::from_millis(301)).contains(&baseline),
        "{baseline:?}"
    );
    assert_eq!(limiter.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_before_its_end_frees_its_place_unmeasured() {
    let layer = ShedLayer::builder()
        .limiter(Limiter::builder().seed(1))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let server = layer.layer(service_fn(|_req: Request<Full<Bytes>>| async {
        let (_feed, chunks) = mpsc::channel::<Bytes>(1);
        // The sender is kept by nobody: the body would end; keep it open.
        std::mem::forget(_feed);
        Ok::<_, Infallible>(Response::new(streaming(chunks)))
    }));
    for _ in 0..20 {
        let response = server
            .clone()
            .oneshot(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        assert_eq!(limiter.in_flight(), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(response);
        assert_eq!(limiter.in_flight(), 0);
    }
    assert_eq!(limiter.baseline(), None);
}
