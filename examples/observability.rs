//! What the layer shows while it works: a span per retry (with
//! `http.request.resend_count`), printed as each closes, and the retry
//! metrics in Prometheus text format.
//!
//! A local server answers every third `GET /flaky` with 200 and the others
//! with 503; three requests go through `HttpRetryLayer` around hyper-util's
//! client.
//!
//! ```text
//! cargo run --example observability --features http,tracing,metrics
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_backoff::http::HttpRetryLayer;
use tower_backoff::{Constant, Jitter};
use tracing_subscriber::fmt::format::FmtSpan;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_target(false)
        .without_time()
        .init();
    let metrics = PrometheusBuilder::new().install_recorder()?;

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener));

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = HttpRetryLayer::builder()
        .schedule(Constant::new(Duration::from_millis(20)))
        .jitter(Jitter::None)
        .build()?
        .layer(client);
    // Each request fails twice and succeeds on its third and last attempt.
    let mut failed = 0;
    for n in 1..=3 {
        let request = Request::get(format!("http://{addr}/flaky")).body(Full::default())?;
        let span = tracing::info_span!("request", n);
        let response = {
            let _entered = span.enter();
            svc.clone().oneshot(request).await?
        };
        println!("request {n}: {}", response.status());
        if response.status() != StatusCode::OK {
            failed += 1;
        }
    }

    println!("\n{}", metrics.render());
    // The metrics above say why; the exit status tells a script or test.
    if failed > 0 {
        return Err(format!("{failed} of 3 requests did not get their 200").into());
    }
    println!("all 3 requests got their 200");
    Ok(())
}

/// 503 twice, then 200, and so on.
async fn serve(listener: TcpListener) {
    let calls = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let calls = Arc::clone(&calls);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_: Request<hyper::body::Incoming>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                let status = if n % 3 == 2 {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
                *response.status_mut() = status;
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
