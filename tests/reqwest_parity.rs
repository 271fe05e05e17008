//! What reqwest does, the layer does: redirects, request extensions,
//! timeouts and `error_for_status` end the same on a plain `reqwest::Client`,
//! through `HttpRetryLayer` and through `BackoffMiddleware` in a
//! reqwest-middleware client. Each test sends one request each way, against
//! a real hyper server on 127.0.0.1 (one per way, from one script), and
//! compares how they ended, for the caller and for the server. Paused clock.
#![cfg(feature = "reqwest-middleware")]

use crate::http_server;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream;
use http::{Extensions, HeaderName, Method, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_backoff::http::{BackoffMiddleware, HttpPolicy, HttpRetryLayer};
use tower_backoff::{Constant, Hedging, Jitter};

use http_server::{http_layer, status, status_with, with_body, Reply, Seen, Server, STEP};

// --- the three ways -------------------------------------------------------------

/// How a request is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// `reqwest::Client::execute`.
    Plain,
    /// Through `HttpRetryLayer` around the client, as a tower service.
    Layer,
    /// Through `BackoffMiddleware` in a reqwest-middleware client.
    Middleware,
}

const WAYS: [Way; 3] = [Way::Plain, Way::Layer, Way::Middleware];

/// How one request ended, for the caller and for the server.
#[derive(Debug, PartialEq)]
struct Ending {
    /// The response, or what kind of error.
    answer: Result<Answer, String>,
    /// Every request the server saw, in order.
    seen: Vec<Hop>,
    /// From the call to its end, on the paused clock.
    took: Duration,
}

/// A response as the caller reads it.
#[derive(Debug, PartialEq)]
struct Answer {
    status: StatusCode,
    /// The final URL's path: where the redirects led.
    path: String,
    body: Bytes,
    /// What `error_for_status` makes of it.
    for_status: Result<(), String>,
}

/// One request as the server saw it.
#[derive(Debug, PartialEq)]
struct Hop {
    method: Method,
    path: String,
    body: Bytes,
    content_length: Option<String>,
}

impl From<&Seen> for Hop {
    fn from(seen: &Seen) -> Self {
        Hop {
            method: seen.method.clone(),
            path: seen.path.clone(),
            body: seen.body.clone(),
            content_length: seen
                .headers
                .get(http::header::CONTENT_LENGTH)
                .map(|v| v.to_str().unwrap().to_owned()),
        }
    }
}

/// A layer of up to 3 attempts, `STEP` apart, with no budget.
fn retries() -> HttpRetryLayer {
    http_layer(HttpPolicy::new())
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// What kind of error: what a caller tells apart.
fn kind(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        "timeout".into()
    } else if error.is_connect() {
        "connect".into()
    } else if let Some(status) = error.status() {
        format!(
            "status {status} from {}",
            error.url().map_or("", |url| url.path())
        )
    } else {
        format!("other: {error}")
    }
}

fn middleware_kind(error: &reqwest_middleware::Error) -> String {
    match error {
        reqwest_middleware::Error::Reqwest(error) => kind(error),
        reqwest_middleware::Error::Middleware(error) => format!("middleware: {error}"),
    }
}

async fn send(
    way: Way,
    client: reqwest::Client,
    request: reqwest::Request,
) -> Result<reqwest::Response, String> {
    match way {
        Way::Plain => client.execute(request).await.map_err(|e| kind(&e)),
        Way::Layer => {
            let svc = ServiceBuilder::new().layer(retries()).service(client);
            svc.oneshot(request)
                .await
                .map_err(|e| kind(&e.into_inner().expect("no timeout or breaker")))
        }
        Way::Middleware => {
            let client = ClientBuilder::new(client)
                .with(BackoffMiddleware::from(retries()))
                .build();
            client
                .execute(request)
                .await
                .map_err(|e| middleware_kind(&e))
        }
    }
}

/// Sends the request `request` makes one way, to a server of its own
/// answering as `script` says.
async fn ending(
    way: Way,
    script: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
    client: reqwest::Client,
    request: impl FnOnce(&Server) -> reqwest::Request,
) -> Ending {
    let server = Server::start(script).await;
    let started = Instant::now();
    let answer = match send(way, client, request(&server)).await {
        Ok(response) => {
            let status = response.status();
            let path = response.url().path().to_owned();
            let for_status = response
                .error_for_status_ref()
                .map(drop)
                .map_err(|e| kind(&e));
            let body = response.bytes().await.unwrap();
            Ok(Answer {
                status,
                path,
                body,
                for_status,
            })
        }
        Err(error) => Err(error),
    };
    let took = started.elapsed();
    let seen = server.seen().iter().map(Hop::from).collect();
    Ending { answer, seen, took }
}

/// The same request, each way.
async fn each_way<S>(
    script: S,
    client: fn() -> reqwest::Client,
    request: fn(&Server) -> reqwest::Request,
) -> [Ending; 3]
where
    S: Fn(usize, &Seen) -> Reply + Copy + Send + Sync + 'static,
{
    let mut endings = Vec::with_capacity(WAYS.len());
    for way in WAYS {
        endings.push(ending(way, script, client(), request).await);
    }
    endings.try_into().unwrap()
}

/// The layer and the middleware ended as the plain client did.
fn assert_same(endings: &[Ending; 3]) {
    let [plain, layer, middleware] = endings;
    assert_eq!(layer, plain, "through HttpRetryLayer, then plain");
    assert_eq!(middleware, plain, "through BackoffMiddleware, then plain");
}

fn with_body_of(method: Method, url: String, body: impl Into<reqwest::Body>) -> reqwest::Request {
    let mut request = reqwest::Request::new(method, url.parse().unwrap());
    *request.body_mut() = Some(body.into());
    request
}

fn hop(method: Method, path: &str, body: &'static str) -> Hop {
    Hop {
        method,
        path: path.into(),
        body: Bytes::from_static(body.as_bytes()),
        content_length: (!body.is_empty()).then(|| body.len().to_string()),
    }
}

// --- redirects ------------------------------------------------------------------

/// `/old` redirects to `/new` with `code`; `/new` answers 200 "stored".
fn moved(code: u16) -> impl Fn(usize, &Seen) -> Reply + Copy + Send + Sync + 'static {
    move |_, seen| {
        if seen.path == "/old" {
            status_with(code, &[("location", "/new")])
        } else {
            with_body(status(200), "stored")
        }
    }
}

fn put_in_memory(server: &Server) -> reqwest::Request {
    with_body_of(Method::PUT, server.url("/old"), "payload")
}

async fn a_redirect_keeping_the_method_is_followed_with_the_body(code: u16) {
    let endings = each_way(moved(code), client, put_in_memory).await;
    assert_same(&endings);
    let answer = endings[0].answer.as_ref().unwrap();
    assert_eq!(
        (answer.status, answer.path.as_str()),
        (StatusCode::OK, "/new")
    );
    assert_eq!(answer.body, "stored");
    assert_eq!(
        endings[0].seen,
        [
            hop(Method::PUT, "/old", "payload"),
            hop(Method::PUT, "/new", "payload"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_307_of_an_in_memory_put_is_followed_with_its_body_as_by_plain_reqwest() {
    a_redirect_keeping_the_method_is_followed_with_the_body(307).await;
}

#[tokio::test(start_paused = true)]
async fn a_308_of_an_in_memory_put_is_followed_with_its_body_as_by_plain_reqwest() {
    a_redirect_keeping_the_method_is_followed_with_the_body(308).await;
}

/// reqwest cannot copy a stream to send it again: it returns the 307 itself,
/// and so does the layer, which keeps recording streams for its own retries.
#[tokio::test(start_paused = true)]
async fn a_307_of_a_streaming_put_is_returned_as_by_plain_reqwest() {
    fn put_streaming(server: &Server) -> reqwest::Request {
        let frames = ["pay", "load"].map(|s| Ok::<_, Infallible>(Frame::data(Bytes::from(s))));
        let body = reqwest::Body::wrap(StreamBody::new(stream::iter(frames)));
        with_body_of(Method::PUT, server.url("/old"), body)
    }
    let endings = each_way(moved(307), client, put_streaming).await;
    assert_same(&endings);
    let answer = endings[0].answer.as_ref().unwrap();
    assert_eq!(
        (answer.status, answer.path.as_str()),
        (StatusCode::TEMPORARY_REDIRECT, "/old")
    );
    assert_eq!(endings[0].seen.len(), 1);
    assert_eq!(endings[0].seen[0].body, "payload");
}

#[tokio::test(start_paused = true)]
async fn a_301_302_or_303_of_a_post_becomes_a_get_without_the_body_as_by_plain_reqwest() {
    fn post(server: &Server) -> reqwest::Request {
        with_body_of(Method::POST, server.url("/old"), "payload")
    }
    for code in [301, 302, 303] {
        let endings = each_way(moved(code), client, post).await;
        assert_same(&endings);
        let answer = endings[0].answer.as_ref().unwrap();
        assert_eq!(
            (answer.status, answer.path.as_str()),
            (StatusCode::OK, "/new"),
            "{code}"
        );
        assert_eq!(
            endings[0].seen,
            [
                hop(Method::POST, "/old", "payload"),
                hop(Method::GET, "/new", ""),
            ],
            "{code}"
        );
    }
}

// --- timeouts -------------------------------------------------------------------

const TIMEOUT: Duration = Duration::from_secs(1);

fn hangs(_: usize, _: &Seen) -> Reply {
    Reply::Hang
}

fn with_timeout(mut request: reqwest::Request) -> reqwest::Request {
    *request.timeout_mut() = Some(TIMEOUT);
    request
}

fn timing_out_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(TIMEOUT)
        .build()
        .unwrap()
}

/// A hung POST, which is never retried, ends exactly as on plain reqwest:
/// its timeout error, when the timeout says. A hung GET is retried, each
/// attempt with the request's timeout, and ends in the same error.
#[tokio::test(start_paused = true)]
async fn a_per_request_timeout_ends_a_hung_request_as_on_plain_reqwest() {
    fn post(server: &Server) -> reqwest::Request {
        with_timeout(with_body_of(Method::POST, server.url("/slow"), "x"))
    }
    let endings = each_way(hangs, client, post).await;
    assert_same(&endings);
    assert_eq!(endings[0].answer, Err("timeout".into()));
    assert_eq!(endings[0].took, TIMEOUT);
    assert_eq!(endings[0].seen, [hop(Method::POST, "/slow", "x")]);

    fn get(server: &Server) -> reqwest::Request {
        with_timeout(reqwest::Request::new(
            Method::GET,
            server.url("/slow").parse().unwrap(),
        ))
    }
    let [plain, layer, middleware] = each_way(hangs, client, get).await;
    a_retried_get_timed_out_on_every_attempt(&plain, &layer);
    a_retried_get_timed_out_on_every_attempt(&plain, &middleware);
}

/// As the per-request timeout: the client's applies to every attempt.
#[tokio::test(start_paused = true)]
async fn the_client_timeout_ends_a_hung_request_as_on_plain_reqwest() {
    fn post(server: &Server) -> reqwest::Request {
        with_body_of(Method::POST, server.url("/slow"), "x")
    }
    let endings = each_way(hangs, timing_out_client, post).await;
    assert_same(&endings);
    assert_eq!(endings[0].answer, Err("timeout".into()));
    assert_eq!(endings[0].took, TIMEOUT);

    fn get(server: &Server) -> reqwest::Request {
        reqwest::Request::new(Method::GET, server.url("/slow").parse().unwrap())
    }
    let [plain, layer, middleware] = each_way(hangs, timing_out_client, get).await;
    a_retried_get_timed_out_on_every_attempt(&plain, &layer);
    a_retried_get_timed_out_on_every_attempt(&plain, &middleware);
}

/// The error reqwest gave without the layer, after three attempts each cut
/// at the timeout.
fn a_retried_get_timed_out_on_every_attempt(plain: &Ending, retried: &Ending) {
    assert_eq!(plain.answer, Err("timeout".into()));
    assert_eq!(retried.answer, plain.answer);
    assert_eq!(plain.seen.len(), 1);
    assert_eq!(retried.seen.len(), 3);
    assert!(retried.seen.iter().all(|hop| hop == &plain.seen[0]));
    assert_eq!(plain.took, TIMEOUT);
    assert_eq!(retried.took, 3 * TIMEOUT + 2 * STEP);
}

// --- error_for_status -------------------------------------------------------------

/// A final status (not retried) reads the same, and `error_for_status` makes
/// the same error of it; so does a retryable one once the retries run out.
#[tokio::test(start_paused = true)]
async fn error_for_status_is_the_same_as_on_plain_reqwest() {
    fn missing(_: usize, _: &Seen) -> Reply {
        with_body(status(404), "no such item")
    }
    fn broken(_: usize, _: &Seen) -> Reply {
        with_body(status(500), "oops")
    }
    fn busy(_: usize, _: &Seen) -> Reply {
        with_body(status(503), "busy")
    }
    fn get(server: &Server) -> reqwest::Request {
        reqwest::Request::new(Method::GET, server.url("/item").parse().unwrap())
    }
    let endings = each_way(missing, client, get).await;
    assert_same(&endings);
    let answer = endings[0].answer.as_ref().unwrap();
    assert_eq!(answer.body, "no such item");
    assert_eq!(
        answer.for_status,
        Err("status 404 Not Found from /item".into())
    );

    let endings = each_way(broken, client, get).await;
    assert_same(&endings);
    let answer = endings[0].answer.as_ref().unwrap();
    assert_eq!(
        answer.for_status,
        Err("status 500 Internal Server Error from /item".into())
    );

    let [plain, layer, middleware] = each_way(busy, client, get).await;
    for retried in [layer, middleware] {
        assert_eq!(retried.answer, plain.answer);
        assert_eq!((plain.seen.len(), retried.seen.len()), (1, 3));
    }
    assert_eq!(
        plain.answer.unwrap().for_status,
        Err("status 503 Service Unavailable from /item".into())
    );
}

// --- request extensions ------------------------------------------------------------

/// What the caller puts in its request's extensions (auth, a tenant, a
/// tracing context).
#[derive(Debug, Clone, PartialEq)]
struct Tenant(&'static str);

/// What the inner middleware writes into the extensions once its copy is
/// answered: only a copy that ends writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Answered(StatusCode);

/// Which copy of a hedged request answers first.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Race {
    /// No hedging: the request goes straight on.
    None,
    /// The first copy is slow: the hedge answers, the first is cancelled.
    HedgeWins,
    /// The hedge is slow: the first copy answers, the hedge is cancelled.
    FirstWins,
}

const HEDGE_DELAY: Duration = Duration::from_millis(50);

impl Race {
    /// Holds a copy back as the race says; a hedge carries `x-attempt`. A
    /// request sent once is held as a first copy is.
    async fn hold(self, headers: &http::HeaderMap) {
        let hedge = headers.contains_key("x-attempt");
        let wait = match (self, hedge) {
            (Race::None, _) | (Race::HedgeWins, true) => return,
            (Race::HedgeWins, false) | (Race::FirstWins, true) => 10 * HEDGE_DELAY,
            (Race::FirstWins, false) => 2 * HEDGE_DELAY,
        };
        tokio::time::sleep(wait).await;
    }
}

/// A layer that hedges every request still pending after `HEDGE_DELAY`,
/// stamping the hedge `x-attempt: 2`.
fn hedged() -> HttpRetryLayer {
    HttpRetryLayer::builder()
        .policy(HttpPolicy::new().attempt_header(HeaderName::from_static("x-attempt")))
        .schedule(Constant::new(STEP))
        .jitter(Jitter::None)
        .no_budget()
        // The load cap grants hedges from the last second's requests: the
        // warm-up request, at 100 %, grants one.
        .hedge(Hedging::after(HEDGE_DELAY).max_extra_load(1.0))
        .build()
        .unwrap()
}

fn answers_ok(_: usize, _: &Seen) -> Reply {
    with_body(status(200), "ok")
}

type Saw = Arc<Mutex<Vec<Option<Tenant>>>>;

/// A middleware after the retries: notes the tenant each copy carries,
/// holds the copy back as the race says, and notes the answer in the
/// extensions.
struct Inner {
    race: Race,
    saw: Saw,
}

#[async_trait::async_trait]
impl Middleware for Inner {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.saw
            .lock()
            .unwrap()
            .push(extensions.get::<Tenant>().cloned());
        self.race.hold(request.headers()).await;
        let response = next.run(request, extensions).await?;
        extensions.insert(Answered(response.status()));
        Ok(response)
    }
}

type Boxed = tower::util::BoxCloneService<reqwest::Request, reqwest::Response, reqwest::Error>;

/// The layer's service with the client's own errors: none of these layers
/// has an attempt timeout or a breaker, so every error is the client's.
fn inner_errors<S>(
    svc: S,
) -> impl tower::Service<
    reqwest::Request,
    Response = reqwest::Response,
    Error = reqwest::Error,
    Future = impl Send,
> + Clone
       + Send
where
    S: tower::Service<
            reqwest::Request,
            Response = reqwest::Response,
            Error = tower_backoff::Error<reqwest::Error>,
        > + Clone
        + Send,
    S::Future: Send,
{
    tower::ServiceExt::map_err(svc, |e: tower_backoff::Error<reqwest::Error>| {
        e.into_inner().expect("no timeout or breaker")
    })
}

/// The tower service of [`Inner`]: reqwest 0.13 shows a request's
/// extensions only through `http::Request`.
fn inner_service(race: Race, saw: Saw) -> Boxed {
    let client = client();
    Boxed::new(service_fn(move |request: reqwest::Request| {
        let (client, saw) = (client.clone(), Arc::clone(&saw));
        async move {
            let request = http::Request::<reqwest::Body>::try_from(request)?;
            saw.lock()
                .unwrap()
                .push(request.extensions().get::<Tenant>().cloned());
            race.hold(request.headers()).await;
            client.execute(reqwest::Request::try_from(request)?).await
        }
    }))
}

/// What became of a request's extensions.
#[derive(Debug, Clone, PartialEq)]
struct Carried {
    status: StatusCode,
    body: Bytes,
    /// Every copy that reached the inner middleware carried the tenant.
    every_copy_saw_the_tenant: bool,
    /// The caller's extensions afterwards; a tower caller gave them away
    /// with its request.
    returned: Option<(Option<Tenant>, Option<Answered>)>,
    /// Copies that reached the inner middleware.
    copies: usize,
}

impl Carried {
    async fn of(
        response: reqwest::Response,
        saw: &Saw,
        returned: Option<(Option<Tenant>, Option<Answered>)>,
    ) -> Self {
        let status = response.status();
        let body = response.bytes().await.unwrap();
        let saw = saw.lock().unwrap();
        Carried {
            status,
            body,
            every_copy_saw_the_tenant: saw.iter().all(|t| t == &Some(Tenant("acme"))),
            returned,
            copies: saw.len(),
        }
    }
}

/// A first request, so a hedging layer's load cap grants a hedge, then a
/// step into the next tenth of a second, which the cap counts from.
async fn warm_up(send: impl std::future::Future<Output = ()>, saw: &Saw) {
    send.await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    saw.lock().unwrap().clear();
}

/// Through a reqwest-middleware client: the inner middleware, after
/// `backoff` if there is one.
async fn through_chain<M: Middleware>(race: Race, backoff: Option<M>) -> Carried {
    let server = Server::start(answers_ok).await;
    let saw = Saw::default();
    let mut builder = ClientBuilder::new(client());
    if let Some(backoff) = backoff {
        builder = builder.with(backoff);
    }
    let client: ClientWithMiddleware = builder
        .with(Inner {
            race,
            saw: Arc::clone(&saw),
        })
        .build();
    let warm = client.get(server.url("/warm")).send();
    warm_up(async { drop(warm.await.unwrap()) }, &saw).await;

    let mut extensions = Extensions::new();
    extensions.insert(Tenant("acme"));
    let request = client.get(server.url("/item")).build().unwrap();
    let response = client
        .execute_with_extensions(request, &mut extensions)
        .await
        .unwrap();
    let returned = (
        extensions.get::<Tenant>().cloned(),
        extensions.get::<Answered>().copied(),
    );
    Carried::of(response, &saw, Some(returned)).await
}

/// Through tower: the inner service, wrapped by `wrap`.
async fn through_tower(race: Race, wrap: impl FnOnce(Boxed) -> Boxed) -> Carried {
    let server = Server::start(answers_ok).await;
    let saw = Saw::default();
    let svc = wrap(inner_service(race, Arc::clone(&saw)));
    let warm = reqwest::Request::new(Method::GET, server.url("/warm").parse().unwrap());
    warm_up(
        async { drop(svc.clone().oneshot(warm).await.unwrap()) },
        &saw,
    )
    .await;

    let request = http::Request::get(server.url("/item"))
        .extension(Tenant("acme"))
        .body(reqwest::Body::from(""))
        .unwrap();
    let request = reqwest::Request::try_from(request).unwrap();
    let response = svc.oneshot(request).await.unwrap();
    Carried::of(response, &saw, None).await
}

/// Through the layer and the middleware (hedging unless `race` is none),
/// the extensions go as they go without: every copy sees the caller's, and
/// the caller gets them back with what the answered copy wrote.
async fn extensions_go_through_as_on_plain_reqwest(race: Race) {
    let chain = through_chain(race, None::<BackoffMiddleware>).await;
    assert_eq!(
        chain,
        Carried {
            status: StatusCode::OK,
            body: Bytes::from_static(b"ok"),
            every_copy_saw_the_tenant: true,
            returned: Some((Some(Tenant("acme")), Some(Answered(StatusCode::OK)))),
            copies: 1,
        }
    );
    let tower = through_tower(race, |inner| inner).await;
    assert_eq!(
        tower,
        Carried {
            returned: None,
            ..chain.clone()
        }
    );

    let copies = if race == Race::None { 1 } else { 2 };
    let (backoff, layered) = if race == Race::None {
        let backoff = through_chain(race, Some(BackoffMiddleware::from(retries()))).await;
        let layered = through_tower(race, |inner| {
            Boxed::new(inner_errors(retries().layer(inner)))
        })
        .await;
        (backoff, layered)
    } else {
        let backoff = through_chain(race, Some(BackoffMiddleware::from(hedged()))).await;
        let layered = through_tower(race, |inner| {
            Boxed::new(inner_errors(hedged().layer(inner)))
        })
        .await;
        (backoff, layered)
    };
    assert_eq!(
        backoff,
        Carried { copies, ..chain },
        "through BackoffMiddleware"
    );
    assert_eq!(
        layered,
        Carried { copies, ..tower },
        "through HttpRetryLayer"
    );
}

#[tokio::test(start_paused = true)]
async fn request_extensions_reach_the_inner_middleware_and_come_back_as_on_plain_reqwest() {
    extensions_go_through_as_on_plain_reqwest(Race::None).await;
}

#[tokio::test(start_paused = true)]
async fn a_hedge_sees_the_callers_extensions_and_when_it_wins_the_caller_gets_its_writes() {
    extensions_go_through_as_on_plain_reqwest(Race::HedgeWins).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_hedge_takes_nothing_from_the_callers_extensions() {
    extensions_go_through_as_on_plain_reqwest(Race::FirstWins).await;
}
