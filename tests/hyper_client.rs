//! The layer around a real hyper-util client talking to a real hyper server.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};
use tower_backoff::{classify_fn, BackoffLayer, Constant, Decision};

/// Serves `statuses` in order on 127.0.0.1 (port 0), then 200s; counts requests.
async fn serve(statuses: Vec<StatusCode>) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            let statuses = statuses.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let n = counter.fetch_add(1, Ordering::SeqCst);
                    let status = statuses.get(n).copied().unwrap_or(StatusCode::OK);
                    async move {
                        let mut response =
                            Response::new(Full::new(Bytes::from(format!("attempt {}", n + 1))));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, hits)
}

#[tokio::test(start_paused = true)]
async fn hyper_server_503_503_200_returns_200_after_exactly_3_attempts() {
    let (addr, hits) = serve(vec![StatusCode::SERVICE_UNAVAILABLE; 2]).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let layer = BackoffLayer::builder()
        .policy(classify_fn(
            |_: &Request<Full<Bytes>>, r: &Result<Response<Incoming>, _>| match r {
                Ok(resp) if resp.status() == StatusCode::SERVICE_UNAVAILABLE => Decision::retry(),
                Ok(_) => Decision::Success,
                Err(_) => Decision::retry(),
            },
        ))
        .schedule(Constant::new(Duration::from_millis(200)))
        .max_attempts(5)
        .no_budget()
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(client);

    let request = Request::get(format!("http://{addr}/"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(body, "attempt 3");
}
