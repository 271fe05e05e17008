//! The shed layer's happy path (admitted, no queueing) beside tower's
//! `load_shed` over `concurrency_limit` and a bare service: one request
//! answered at once, polled by hand. Run under callgrind by
//! `bash benches/callgrind_shed.sh`; `shed_instructions <column> <requests>`.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{service_fn, Layer, Service, ServiceBuilder};
use tower_backoff::shed::ShedLayer;

type Body = Full<Bytes>;

fn drive<S, B>(mut svc: S, requests: u64)
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
{
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..requests {
        match svc.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => {}
            other => panic!("not ready: {:?}", other.map(|r| r.err())),
        }
        let future = pin!(svc.call(Request::new(Body::new(Bytes::new()))));
        match future.poll(&mut cx) {
            Poll::Ready(Ok(response)) => {
                // The body ends at once, as a server would find it ended,
                // where the shed layer measures and frees the place.
                black_box(response.body().is_end_stream());
                black_box(response);
            }
            _ => panic!("the backend answers at once"),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [column, requests] = args.as_slice() else {
        eprintln!("usage: shed_instructions <bare|tower|shed> <requests>");
        return;
    };
    let requests: u64 = requests.parse().expect("a number of requests");
    let backend = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::new(Bytes::new())))
    });
    match column.as_str() {
        "bare" => drive(backend, requests),
        "tower" => drive(
            ServiceBuilder::new()
                .load_shed()
                .concurrency_limit(1_000)
                .service(backend),
            requests,
        ),
        "shed" => drive(
            ShedLayer::builder().build().unwrap().layer(backend),
            requests,
        ),
        other => panic!("unknown column {other:?}"),
    }
}
