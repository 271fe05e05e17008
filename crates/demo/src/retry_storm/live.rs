//! `--live`: the storm over real sockets, in real time. Each strategy gets its
//! own hyper server on 127.0.0.1 (port 0), backed by the same server model as
//! the simulation, and its own hyper-util clients; all strategies run side by
//! side, so the whole demo takes the horizon (30 s by default) and stops by
//! itself.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::net::TcpListener;
use tokio::task::LocalSet;
use tower_backoff_sim::{storm_table, Request, Server, ServerModel, Storm, Strategy};
use tower_service::Service;

use crate::{check, Options};

/// The live storm is the simulated one scaled down three times (capacity,
/// latency step, backlog and load), so the same curve holds with a third of
/// the sockets: 300 clients at 0.2 req/s, a server at full speed up to 10 in
/// flight, down from 8 s to 13 s, 30 s in all.
fn scenario(options: &Options) -> Storm {
    let model = ServerModel::new()
        .capacity(10)
        .slowdown(1.05, 5.0)
        .backlog(170);
    let defaults = Storm::new()
        .clients(300)
        .horizon(Duration::from_secs(30))
        .outage(Duration::ZERO, Duration::from_secs(5));
    options.storm(defaults, model, Duration::from_secs(8))
}

pub fn run(options: &Options) -> Result<(), String> {
    let storm = scenario(options);
    check(&storm)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let horizon = storm.length();
    let bar = ProgressBar::new(horizon.as_secs()).with_style(
        ProgressStyle::with_template("live, every strategy at once [{bar:40}] {pos}/{len} s")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let started = Instant::now();
    let reports = LocalSet::new().block_on(&runtime, async {
        let mut runs = Vec::new();
        for (i, strategy) in Strategy::ALL.into_iter().enumerate() {
            let server = storm.start_server();
            let addr = listen(server.clone()).await?;
            let layer = strategy.layer(options.seed).map_err(|e| e.to_string())?;
            let attempt = HttpAttempt::new(addr, Duration::from_secs(1));
            let storm = &storm;
            let bar = &bar;
            runs.push(async move {
                let report = storm
                    .drive(
                        &server,
                        || tower_layer::Layer::layer(&layer, attempt.clone()),
                        |t| {
                            if i == 0 {
                                bar.set_position(t.as_secs())
                            }
                        },
                    )
                    .await;
                (strategy, report)
            });
        }
        Ok::<_, String>(futures::future::join_all(runs).await)
    })?;
    bar.finish_and_clear();
    drop(runtime);

    println!("Live: {storm}; over 127.0.0.1, in real time.\n");
    let summaries: Vec<_> = reports
        .iter()
        .map(|(s, r)| (s.name(), r.summary()))
        .collect();
    print!("{}", storm_table(summaries.iter().map(|(n, s)| (*n, s))));
    println!(
        "\n{} strategies side by side in {:.1} s of real time.",
        reports.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Serves the model over HTTP/1 on a fresh loopback port until the runtime
/// ends. A client that gives up closes its connection; the model still
/// finishes the request's work, as the simulation's server does.
async fn listen(server: Server) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("binding 127.0.0.1:0: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::task::spawn_local(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of file descriptors, most likely: let some close.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let server = server.clone();
            tokio::task::spawn_local(async move {
                let service = service_fn(move |_: hyper::Request<Incoming>| {
                    let submission = server.submit();
                    async move {
                        let status = match submission.await {
                            Ok(()) => StatusCode::OK,
                            Err(_) => StatusCode::SERVICE_UNAVAILABLE,
                        };
                        let mut response =
                            hyper::Response::new(Full::new(Bytes::from_static(b"ok")));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// One GET to the live server with a per-attempt timeout: the `Service` the
/// retry layer wraps, as `Connection` is in the simulation.
#[derive(Clone)]
struct HttpAttempt {
    client: Client<HttpConnector, Empty<Bytes>>,
    uri: Uri,
    timeout: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl HttpAttempt {
    fn new(addr: SocketAddr, timeout: Duration) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http();
        let uri = format!("http://{addr}/").parse().expect("a valid URI");
        Self {
            client,
            uri,
            timeout,
        }
    }
}

impl Service<Request> for HttpAttempt {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request) -> Self::Future {
        let response = self.client.get(self.uri.clone());
        let timeout = self.timeout;
        Box::pin(async move {
            let attempt = async {
                let response = response.await?;
                let status = response.status();
                // Read the small body so the connection goes back to the pool.
                response.into_body().collect().await?;
                if status.is_success() {
                    Ok(())
                } else {
                    Err(BoxError::from(format!("status {status}")))
                }
            };
            tokio::time::timeout(timeout, attempt)
                .await
                .map_err(|_| BoxError::from("timed out"))?
        })
    }
}
