//! The cost of `HttpRetryLayer` on a successful small response, beside the
//! stack of separate layers it replaces (`ReplayLayer` → `BackoffLayer` with
//! the `HttpPolicy` → `BufferBodyLayer`, the parts a correct HTTP setup took
//! before) and beside the bare `BackoffLayer` with the `HttpPolicy` (which
//! returns a body cut short as a success). One column, one run, so that
//! `benches/callgrind_http.sh` can count its instructions; `--table` prints
//! allocations per request.
//!
//! Not a criterion bench: `cargo bench --bench http_layer -- --table`.

mod common;

use std::task::{Context, Poll};

use bytes::Bytes;
use common::{allocations, Counting};
use futures::future::{ready, Ready};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_backoff::http::parts::{BufferBodyLayer, ReplayLayer};
use tower_backoff::http::{HttpPolicy, HttpRetryLayer};
use tower_backoff::BackoffLayer;

#[global_allocator]
static GLOBAL: Counting = Counting;

const COLUMNS: [&str; 5] = [
    "bare",
    "BackoffLayer + HttpPolicy (no body checks)",
    "parts: Replay + BackoffLayer + BufferBody",
    "HttpRetryLayer",
    "HttpRetryLayer, without RetryInfo",
];

/// A client that answers every GET 200 with a small JSON body and its
/// `content-length`, as a server would.
#[derive(Clone)]
struct Client;

impl<B> Service<Request<B>> for Client {
    type Response = Response<Full<Bytes>>;
    type Error = std::io::Error;
    type Future = Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        std::hint::black_box(&request);
        let body = Bytes::from_static(b"{\"price\":7}");
        let response = Response::builder()
            .header(http::header::CONTENT_LENGTH, body.len())
            .body(Full::new(body))
            .expect("a valid response");
        ready(Ok(response))
    }
}

/// A GET with an empty body and the headers a real client sends.
fn get() -> Request<Full<Bytes>> {
    Request::get("http://api.internal:8080/v1/items/42?fields=price")
        .header("accept", "application/json")
        .header("user-agent", "tower-backoff-bench/0.1")
        .body(Full::new(Bytes::new()))
        .expect("a valid request")
}

/// Sends `iters` GETs through `svc`, each read to its end.
async fn drive<S, B>(mut svc: S, iters: u64)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    for _ in 0..iters {
        let response = svc.ready().await.unwrap().call(get()).await.unwrap();
        let body = response.into_body().collect().await.unwrap();
        std::hint::black_box(body.to_bytes());
    }
}

fn plain() -> BackoffLayer<HttpPolicy> {
    BackoffLayer::builder()
        .policy(HttpPolicy::new())
        .build()
        .expect("valid settings")
}

async fn run(column: &str, iters: u64) {
    match column {
        "bare" => drive(Client, iters).await,
        "BackoffLayer + HttpPolicy (no body checks)" => drive(plain().layer(Client), iters).await,
        "parts: Replay + BackoffLayer + BufferBody" => {
            let svc = ServiceBuilder::new()
                .layer(ReplayLayer::new())
                .layer(plain())
                .layer(BufferBodyLayer::new())
                .service(Client);
            drive(svc, iters).await
        }
        "HttpRetryLayer" => drive(HttpRetryLayer::new().layer(Client), iters).await,
        "HttpRetryLayer, without RetryInfo" => {
            let layer = HttpRetryLayer::new().without_retry_info();
            drive(layer.layer(Client), iters).await
        }
        other => panic!("unknown column {other:?}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    match args.as_slice() {
        [flag] if flag == "--table" => {
            println!("column\tallocations/request");
            for column in COLUMNS {
                let count = |iters| {
                    let before = allocations();
                    runtime.block_on(run(column, iters));
                    allocations() - before
                };
                let per_request = (count(1_100) as f64 - count(100) as f64) / 1_000.0;
                println!("{column}\t{per_request:.2}");
            }
        }
        [column, iters] => {
            let iters = iters.parse().expect("a number of requests");
            runtime.block_on(run(column, iters));
        }
        [] => {}
        _ => eprintln!("usage: http_layer --table | <column> <requests>"),
    }
}
