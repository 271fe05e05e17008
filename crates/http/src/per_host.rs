//! [`PerHostLayer`]: one retry layer per authority, so one host's outage
//! cannot spend another host's retry budget.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

/// Hosts a [`PerHostLayer`] keeps by default before it evicts the one idle
/// longest.
#[doc(hidden)]
pub const DEFAULT_MAX_HOSTS: usize = 256;

/// Shards of the host table: requests to different hosts rarely share a lock.
const SHARDS: usize = 8;

/// Gives every authority (scheme, host and port) its own stack made by
/// `make`, typically a [`BackoffLayer`](tower_backoff_core::BackoffLayer) with its own
/// budget, so one host's outage spends only that host's retries. For the
/// HTTP layer, [`HttpRetryBuilder::build_per_host`](crate::HttpRetryBuilder::build_per_host)
/// does it in one call; an [`HttpRetryLayer`](crate::HttpRetryLayer) with a
/// [circuit breaker](crate::HttpRetryBuilder::circuit_breaker) keeps its
/// breaker, budget and pacing per host already, in its own service type.
///
/// A host's stack is made on its first request and shared by every clone of
/// the service. At most [`max_hosts`](Self::max_hosts) are kept (default
/// [`DEFAULT_MAX_HOSTS`]); making one more evicts the one that has gone
/// unused longest (requests in flight keep theirs until they end). Whatever
/// the stack shares across its clones (the budget, adaptive pacing, stats) is
/// then per host.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_backoff::http::{HttpPolicy, PerHostLayer};
/// use tower_backoff::{BackoffLayer, TokenBucket};
/// # let client = tower::service_fn(|_: http::Request<String>| async {
/// #     Ok::<_, std::io::Error>(http::Response::new(String::new()))
/// # });
///
/// let svc = ServiceBuilder::new()
///     .layer(PerHostLayer::new(|| {
///         BackoffLayer::builder()
///             .policy(HttpPolicy::new())
///             .budget(TokenBucket::default())
///             .build()
///             .expect("valid retry settings")
///     }))
///     .service(client);
/// # drop(svc);
/// ```
///
/// The service is always ready: each request waits for its own host's
/// stack to be ready, in its response future.
#[derive(Clone)]
pub struct PerHostLayer<F> {
    make: F,
    max_hosts: usize,
}

impl<F> PerHostLayer<F> {
    /// A layer that makes each host's stack with `make`.
    pub fn new(make: F) -> Self {
        Self {
            make,
            max_hosts: DEFAULT_MAX_HOSTS,
        }
    }

    /// Keeps at most `hosts` hosts' stacks (at least one per shard of the
    /// table, so up to 8 even when fewer are asked for). The bound is kept
    /// per shard, `hosts / 8` each: hosts that happen to hash to one shard
    /// can evict an idle one there before the total reaches `hosts`.
    pub fn max_hosts(mut self, hosts: usize) -> Self {
        self.max_hosts = hosts;
        self
    }
}

impl<F> fmt::Debug for PerHostLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerHostLayer")
            .field("max_hosts", &self.max_hosts)
            .finish_non_exhaustive()
    }
}

/// Makes the layer of each new host of a [`PerHostLayer`]: any `Fn() ->
/// Layer` closure, or an [`HttpRetryLayer`](crate::HttpRetryLayer), which
/// gives each host a [fresh](tower_backoff_core::BackoffLayer::fresh) copy
/// of itself.
pub trait MakeHostLayer {
    /// The layer each host's stack is made with.
    type Layer;

    /// The layer for a host seen for the first time.
    fn make_host_layer(&self) -> Self::Layer;

    /// The layer for the host `authority` (`host:port`), seen for the first
    /// time: by default [`make_host_layer`](Self::make_host_layer)'s, which
    /// does not know it; an [`HttpRetryLayer`](crate::HttpRetryLayer) gives
    /// a copy [for that host](tower_backoff_core::BackoffLayer::for_host),
    /// whose events and metrics name it.
    fn make_layer_for_host(&self, authority: &str) -> Self::Layer {
        let _ = authority;
        self.make_host_layer()
    }
}

impl<F, L> MakeHostLayer for F
where
    F: Fn() -> L,
{
    type Layer = L;

    fn make_host_layer(&self) -> L {
        self()
    }
}

impl<S, F, L> Layer<S> for PerHostLayer<F>
where
    F: MakeHostLayer<Layer = L> + Clone,
    L: Layer<S>,
{
    type Service = PerHost<S, F, L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        PerHost {
            inner,
            make: self.make.clone(),
            hosts: Arc::new(Hosts::new(self.max_hosts)),
        }
    }
}

/// The service of a [`PerHostLayer`]: routes each request to its host's
/// stack.
pub struct PerHost<S, F, T> {
    inner: S,
    make: F,
    hosts: Arc<Hosts<T>>,
}

impl<S: Clone, F: Clone, T> Clone for PerHost<S, F, T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            make: self.make.clone(),
            hosts: self.hosts.clone(),
        }
    }
}

impl<S, F, T> PerHost<S, F, T> {
    /// How many hosts have a stack now.
    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }
}

impl<S: fmt::Debug, F, T> fmt::Debug for PerHost<S, F, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerHost")
            .field("inner", &self.inner)
            .field("hosts", &self.hosts.len())
            .finish_non_exhaustive()
    }
}

/// Where a request goes: its scheme and authority, read without copying.
pub trait RequestAuthority {
    /// The scheme (`http`) and the authority (`host:port`, with any
    /// user-info) of the request's URI, the port left out when it is the
    /// scheme's default, so `http://a.example:80/` and `http://a.example/`
    /// share a stack. Requests without an authority all share one.
    fn authority(&self) -> (&str, &str);
}

impl<B> RequestAuthority for ::http::Request<B> {
    fn authority(&self) -> (&str, &str) {
        let uri = self.uri();
        let scheme = uri.scheme_str().unwrap_or("http");
        let authority = uri.authority().map_or("", |a| a.as_str());
        // Parsing out the host and port costs more than the rest of the
        // lookup; only the default port needs recognising.
        let default = match scheme {
            "http" => ":80",
            "https" => ":443",
            _ => return (scheme, authority),
        };
        (scheme, authority.strip_suffix(default).unwrap_or(authority))
    }
}

#[cfg(feature = "reqwest")]
impl RequestAuthority for reqwest::Request {
    fn authority(&self) -> (&str, &str) {
        // `url` leaves the scheme's default port out already.
        (self.url().scheme(), self.url().authority())
    }
}

impl<S, F, L, T, Req> Service<Req> for PerHost<S, F, T>
where
    Req: RequestAuthority,
    S: Clone,
    F: MakeHostLayer<Layer = L>,
    L: Layer<S, Service = T>,
    T: Service<Req> + Clone,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = PerHostFuture<T, Req>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let authority = request.authority();
        let service = self.hosts.get_or_make(authority, || {
            self.make
                .make_layer_for_host(authority.1)
                .layer(self.inner.clone())
        });
        PerHostFuture {
            state: Route::Readying {
                service,
                request: Some(request),
            },
        }
    }
}

pin_project! {
    /// The response future of [`PerHost`]: waits for the host's stack to be
    /// ready, then for its response.
    pub struct PerHostFuture<T, Req>
    where
        T: Service<Req>,
    {
        #[pin]
        state: Route<T, Req>,
    }
}

pin_project! {
    #[project = RouteProj]
    enum Route<T, Req>
    where
        T: Service<Req>,
    {
        Readying { service: T, request: Option<Req> },
        Called { #[pin] future: T::Future },
    }
}

impl<T, Req> Future for PerHostFuture<T, Req>
where
    T: Service<Req>,
{
    type Output = Result<T::Response, T::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                RouteProj::Readying { service, request } => {
                    ready!(service.poll_ready(cx))?;
                    let request = request.take().expect("called once");
                    let future = service.call(request);
                    state.set(Route::Called { future });
                }
                RouteProj::Called { future } => return future.poll(cx),
            }
        }
    }
}

impl<T: Service<Req>, Req> fmt::Debug for PerHostFuture<T, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerHostFuture").finish_non_exhaustive()
    }
}

/// One layer per authority, for an [`HttpRetryLayer`](crate::HttpRetryLayer)
/// whose circuit breaker is kept per host: the first host called gets the
/// layer as it was built (so the breaker handle given to the builder reads
/// that host's state), every other host a fresh copy. Shared by every clone
/// of the layer and every service it makes, as a breaker is.
pub(crate) struct HostLayers<L> {
    built: L,
    /// Whether `built` still waits for its host.
    built_free: AtomicBool,
    hosts: Hosts<L>,
    max_hosts: usize,
}

impl<L: Clone> HostLayers<L> {
    /// A table of at most `max_hosts` hosts (as
    /// [`PerHostLayer::max_hosts`] bounds it).
    pub(crate) fn new(built: L, max_hosts: usize) -> Self {
        Self {
            built,
            built_free: AtomicBool::new(true),
            hosts: Hosts::new(max_hosts),
            max_hosts,
        }
    }

    /// The bound the table was made with.
    pub(crate) fn max_hosts(&self) -> usize {
        self.max_hosts
    }

    /// The layer of this authority's host, on its first request
    /// `same(&built, host)` (`built`, told as the host's) or
    /// `fresh(&built, host)`.
    pub(crate) fn get(
        &self,
        authority: (&str, &str),
        same: impl FnOnce(&L, &str) -> L,
        fresh: impl FnOnce(&L, &str) -> L,
    ) -> L {
        self.hosts.get_or_make(authority, || {
            if self.built_free.swap(false, Ordering::Relaxed) {
                same(&self.built, authority.1)
            } else {
                fresh(&self.built, authority.1)
            }
        })
    }

    /// How many hosts have a layer now.
    pub(crate) fn len(&self) -> usize {
        self.hosts.len()
    }
}

/// The hosts' stacks: a table sharded by the authority's hash, each shard
/// read-locked for a lookup (write-locked only to add a host).
struct Hosts<T> {
    shards: [RwLock<Table<T>>; SHARDS],
    per_shard: usize,
    seed: u64,
    /// Advances each time a host is added. An entry's `used` is twice the
    /// tick it was added at, or twice the tick of its last use plus one (a
    /// use comes after the addition of its tick), so the smallest was idle
    /// longest. Written only on a miss, so a hit reads a line no other core
    /// writes, and writes its entry's only when the tick has moved.
    tick: AtomicU64,
}

/// Keyed by the authority's hash, already mixed: hashing it again would only
/// cost time.
type Table<T> = HashMap<u64, Entry<T>, BuildHasherDefault<Prehashed>>;

#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys reach here, through `write_u64`; anything else
        // still hashes, just slowly.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

struct Entry<T> {
    scheme: Box<str>,
    authority: Box<str>,
    service: T,
    used: AtomicU64,
}

impl<T> Entry<T> {
    fn is(&self, scheme: &str, authority: &str) -> bool {
        // Byte equality first: URIs are nearly always written in one case.
        let same = |a: &str, b: &str| a == b || a.eq_ignore_ascii_case(b);
        same(&self.authority, authority) && same(&self.scheme, scheme)
    }
}

impl<T> Hosts<T> {
    fn new(max_hosts: usize) -> Self {
        Self {
            shards: Default::default(),
            per_shard: max_hosts.div_ceil(SHARDS).max(1),
            seed: RandomState::new().hash_one(0x5EED_u64),
            tick: AtomicU64::new(0),
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|shard| read(shard).len()).sum()
    }
}

impl<T: Clone> Hosts<T> {
    /// A clone of the stack for this authority, made with `make` if there is
    /// none yet.
    fn get_or_make(&self, (scheme, authority): (&str, &str), make: impl FnOnce() -> T) -> T {
        let hash = self.hash(scheme, authority);
        let shard = &self.shards[(hash % SHARDS as u64) as usize];
        let used = self.tick.load(Ordering::Relaxed) * 2 + 1;
        if let Some(entry) = read(shard).get(&hash).filter(|e| e.is(scheme, authority)) {
            if entry.used.load(Ordering::Relaxed) != used {
                entry.used.store(used, Ordering::Relaxed);
            }
            return entry.service.clone();
        }
        let mut table = shard
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = table.get(&hash).filter(|e| e.is(scheme, authority)) {
            return entry.service.clone();
        }
        if table.len() >= self.per_shard && !table.contains_key(&hash) {
            let idle = table
                .iter()
                .min_by_key(|(_, entry)| entry.used.load(Ordering::Relaxed))
                .map(|(&key, _)| key);
            if let Some(idle) = idle {
                table.remove(&idle);
            }
        }
        let added = (self.tick.fetch_add(1, Ordering::Relaxed) + 1) * 2;
        let service = make();
        // A different authority with the same 64-bit hash takes the slot
        // over.
        table.insert(
            hash,
            Entry {
                scheme: scheme.into(),
                authority: authority.into(),
                service: service.clone(),
                used: AtomicU64::new(added),
            },
        );
        service
    }

    /// The authority's hash, ASCII case folded: an FxHash-style multiply
    /// over 8-byte words from a random seed, then a final mix. Not SipHash:
    /// it runs on every request, and the hosts are the client's own choice,
    /// not an attacker's (a collision only makes two hosts share a slot in
    /// turn, never a request reach the wrong host).
    fn hash(&self, scheme: &str, authority: &str) -> u64 {
        mix(fold(
            fold(self.seed, scheme.as_bytes()),
            authority.as_bytes(),
        ))
    }
}

fn fold(mut h: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut word = <[u8; 8]>::try_from(word).unwrap_or_default();
        word.make_ascii_lowercase();
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    let rest = words.remainder();
    let mut last = [0u8; 8];
    last[..rest.len()].copy_from_slice(rest);
    last.make_ascii_lowercase();
    // The length keeps "ab" + "c" apart from "a" + "bc".
    h = (h.rotate_left(5) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    (h.rotate_left(5) ^ bytes.len() as u64).wrapping_mul(K)
}

/// SplitMix64's finaliser: every bit, the low ones that pick the shard
/// included, depends on every input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A panic while holding the lock leaves the table consistent: every
    // change is one insert or one remove.
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(max: usize) -> Hosts<Arc<u32>> {
        Hosts::new(max)
    }

    #[test]
    fn one_entry_per_authority_made_once() {
        // Large enough that no shard fills whatever the seeded hash does.
        let table = hosts(1024);
        let made = std::cell::Cell::new(0);
        let get = |authority| {
            table.get_or_make(authority, || {
                made.set(made.get() + 1);
                Arc::new(made.get())
            })
        };
        let a = get(("http", "a.example"));
        assert_eq!(*a, 1);
        assert!(
            Arc::ptr_eq(&a, &get(("HTTP", "A.Example"))),
            "case-insensitive"
        );
        assert_eq!(*get(("http", "a.example:8080")), 2, "another port");
        assert_eq!(*get(("https", "a.example")), 3, "another scheme");
        assert_eq!(*get(("http", "b.example")), 4);
        assert_eq!(made.get(), 4);
        assert_eq!(table.len(), 4);
    }

    #[test]
    fn the_hash_folds_case_and_tells_long_hosts_and_splits_apart() {
        let table = hosts(16);
        let h = |scheme, authority| table.hash(scheme, authority);
        let a = h("https", "service-a.internal.example");
        assert_eq!(a, h("HTTPS", "Service-A.Internal.EXAMPLE"));
        assert_ne!(a, h("https", "service-a.internal.examplf"));
        assert_ne!(a, h("https", "service-b.internal.example"));
        assert_ne!(a, h("https", "service-a.internal.example:444"));
        assert_ne!(a, h("http", "service-a.internal.example"));
        assert_ne!(h("ab", "c"), h("a", "bc"));
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_longest_idle() {
        let table = hosts(16); // two per shard
        let mut made = 0;
        let host = |i: usize| format!("h{i}.example");
        for i in 0..100 {
            table.get_or_make(("http", &host(i)), || {
                made += 1;
                Arc::new(made)
            });
            assert!(table.len() <= 16);
        }
        assert_eq!(made, 100);
        // A host used again after others were added survives their eviction.
        let keep = table.get_or_make(("http", "keep.example"), || Arc::new(0));
        for i in 100..200 {
            table.get_or_make(("http", "keep.example"), || Arc::new(1));
            table.get_or_make(("http", &host(i)), || Arc::new(2));
        }
        let again = table.get_or_make(("http", "keep.example"), || Arc::new(3));
        assert!(Arc::ptr_eq(&keep, &again));
    }

    #[test]
    fn default_ports_name_the_same_authority() {
        let authority = |uri: &str| {
            let request = ::http::Request::get(uri).body(()).unwrap();
            let (scheme, authority) = request.authority();
            (scheme.to_owned(), authority.to_owned())
        };
        let pair = |s: &str, a: &str| (s.to_owned(), a.to_owned());
        assert_eq!(
            authority("http://a.example:80/x"),
            pair("http", "a.example")
        );
        assert_eq!(authority("http://a.example/y"), pair("http", "a.example"));
        assert_eq!(
            authority("http://a.example:443/"),
            pair("http", "a.example:443")
        );
        assert_eq!(
            authority("https://a.example:443/"),
            pair("https", "a.example")
        );
        assert_eq!(authority("http://[::1]:80/"), pair("http", "[::1]"));
        assert_eq!(
            authority("ftp://a.example:21/"),
            pair("ftp", "a.example:21")
        );
        assert_eq!(authority("/only-a-path"), pair("http", ""));
    }
}
