//! `client.get(url).send()` through the retry layer: the request builder of
//! a wrapped `reqwest::Client`, so that wrapping a client does not take
//! reqwest's way of writing requests away.

use std::fmt;
use std::future::poll_fn;
use std::time::Duration;

use ::http::header::{HeaderMap, HeaderName, HeaderValue};
use ::http::Version;
use reqwest::{IntoUrl, Method};
use tower_backoff_core::Error;
use tower_service::Service;

use super::retry_layer::HttpRetry;

impl HttpRetry<reqwest::Client> {
    /// Starts a request with `method` to `url`, as
    /// [`reqwest::Client::request`] does; [`send`](RequestBuilder::send)
    /// sends it through the retry layer.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # mod tower_backoff { pub mod http { pub use tower_backoff_http::*; } }
    /// # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// # let url = format!("http://{}/", listener.local_addr()?);
    /// # tokio::spawn(async move {
    /// #     use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// #     let (mut socket, _) = listener.accept().await.unwrap();
    /// #     let mut request = [0; 1024];
    /// #     let _ = socket.read(&mut request).await;
    /// #     let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
    /// # });
    /// use tower::ServiceBuilder;
    /// use tower_backoff::http::HttpRetryLayer;
    ///
    /// let client = ServiceBuilder::new()
    ///     .layer(HttpRetryLayer::new())
    ///     .service(reqwest::Client::new());
    ///
    /// let response = client.get(&url).header("accept", "text/plain").send().await?;
    /// assert_eq!(response.text().await?, "ok");
    /// # Ok(())
    /// # }
    /// ```
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> RequestBuilder {
        RequestBuilder {
            request: self.get_ref().request(method, url),
            client: self.clone(),
        }
    }

    /// A `GET` to `url` ([`request`](Self::request)).
    pub fn get<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// A `POST` to `url` ([`request`](Self::request)); retried only where
    /// the policy retries `POST`.
    pub fn post<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// A `PUT` to `url` ([`request`](Self::request)).
    pub fn put<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PUT, url)
    }

    /// A `PATCH` to `url` ([`request`](Self::request)); retried only where
    /// the policy retries `PATCH`.
    pub fn patch<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PATCH, url)
    }

    /// A `DELETE` to `url` ([`request`](Self::request)).
    pub fn delete<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::DELETE, url)
    }

    /// A `HEAD` to `url` ([`request`](Self::request)).
    pub fn head<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::HEAD, url)
    }
}

/// A request being written for an [`HttpRetry`] over `reqwest::Client`:
/// reqwest's builder, sent through the retry layer.
///
/// It has the methods of `reqwest::RequestBuilder` that need no reqwest
/// feature; [`with`](Self::with) reaches the others (`json`, `query`,
/// `form`, `multipart`) on the builder it holds. A `timeout` is reqwest's,
/// so it bounds each attempt, not the request: the layer's `max_elapsed`
/// bounds the whole.
#[must_use = "a request is sent by `send`"]
pub struct RequestBuilder {
    request: reqwest::RequestBuilder,
    client: HttpRetry<reqwest::Client>,
}

impl RequestBuilder {
    /// Adds a header ([`reqwest::RequestBuilder::header`]).
    pub fn header<K, V>(self, key: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<::http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<::http::Error>,
    {
        self.with(|request| request.header(key, value))
    }

    /// Adds headers ([`reqwest::RequestBuilder::headers`]).
    pub fn headers(self, headers: HeaderMap) -> Self {
        self.with(|request| request.headers(headers))
    }

    /// Basic authentication ([`reqwest::RequestBuilder::basic_auth`]).
    pub fn basic_auth<U: fmt::Display, P: fmt::Display>(
        self,
        username: U,
        password: Option<P>,
    ) -> Self {
        self.with(|request| request.basic_auth(username, password))
    }

    /// Bearer authentication ([`reqwest::RequestBuilder::bearer_auth`]).
    pub fn bearer_auth<T: fmt::Display>(self, token: T) -> Self {
        self.with(|request| request.bearer_auth(token))
    }

    /// The body ([`reqwest::RequestBuilder::body`]). A body reqwest cannot
    /// clone (a stream) is replayed up to the layer's replay limit.
    pub fn body<T: Into<reqwest::Body>>(self, body: T) -> Self {
        self.with(|request| request.body(body))
    }

    /// Each attempt's timeout ([`reqwest::RequestBuilder::timeout`]).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.with(|request| request.timeout(timeout))
    }

    /// The HTTP version ([`reqwest::RequestBuilder::version`]).
    pub fn version(self, version: Version) -> Self {
        self.with(|request| request.version(version))
    }

    /// Any other change to reqwest's builder: `json`, `query`, `form` with
    /// reqwest's features of those names, or whatever is added later.
    ///
    /// ```
    /// # mod tower_backoff { pub mod http { pub use tower_backoff_http::*; } }
    /// # fn run(client: tower_backoff::http::HttpRetry<reqwest::Client>) {
    /// let request = client
    ///     .post("http://localhost/items")
    ///     .with(|request| request.header("idempotency-key", "42"));
    /// # drop(request);
    /// # }
    /// ```
    pub fn with(
        self,
        change: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Self {
        Self {
            request: change(self.request),
            client: self.client,
        }
    }

    /// The request, as [`reqwest::RequestBuilder::build`] makes it: to send
    /// later through the service with `oneshot`.
    pub fn build(self) -> reqwest::Result<reqwest::Request> {
        self.request.build()
    }

    /// Sends the request through the retry layer and returns the last
    /// attempt's response or error. A request reqwest cannot build (a bad
    /// header, a URL without a host) is its error, and nothing is sent.
    pub async fn send(self) -> Result<reqwest::Response, Error<reqwest::Error>> {
        let mut client = self.client;
        let request = self.request.build().map_err(Error::Inner)?;
        poll_fn(|cx| client.poll_ready(cx)).await?;
        client.call(request).await
    }
}

impl fmt::Debug for RequestBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}
