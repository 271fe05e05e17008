//! `Retry-After` spreads a fleet over whole seconds (issue 52, case 6):
//! most clients read only the standard header, so its values, not only
//! `retry-after-ms`, must differ from one rejection to the next.
#![cfg(feature = "shed")]

use crate::http_server;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{service_fn, Layer};
use tower_backoff::shed::{Limiter, Priority, ShedLayer};

#[tokio::test]
async fn over_hyper_rejections_carry_several_whole_seconds_that_agree_with_the_milliseconds() {
    // One place, held by hand: every request is shed.
    let limiter = Limiter::builder()
        .initial_limit(1)
        .min_limit(1)
        .max_limit(1)
        .seed(11)
        .build()
        .unwrap();
    let _held = limiter
        .try_acquire(Priority::HIGHEST, Instant::now())
        .unwrap();
    let service = ShedLayer::builder()
        .shared_limiter(limiter)
        .build()
        .unwrap()
        .layer(service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }));
    let addr = http_server::serve_tower(service).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut seconds = BTreeMap::new();
    let rejections = 200;
    for _ in 0..rejections {
        let request = Request::get(format!("http://{addr}/"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let header =
            |name: &str| -> u64 { response.headers()[name].to_str().unwrap().parse().unwrap() };
        let (whole, millis) = (header("retry-after"), header("retry-after-ms"));
        // The same delay: whole seconds of the milliseconds, never longer.
        assert_eq!(whole, millis / 1000, "{whole} s vs {millis} ms");
        assert!((1_000..3_000).contains(&millis), "{millis}");
        *seconds.entry(whole).or_insert(0u32) += 1;
    }
    println!("Retry-After values over {rejections} rejections: {seconds:?}");
    assert!(seconds.len() >= 2, "{seconds:?}");
    let largest = *seconds.values().max().unwrap();
    assert!(largest * 100 <= rejections * 60, "{seconds:?}");
}
