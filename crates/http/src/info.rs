//! [`RetryInfo`]: what the retries of one request cost, for the caller to read.

use std::time::Duration;

/// How many attempts a request took and how long it slept between them,
/// stored in the extensions of every response the HTTP policy returns, retried
/// or not.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::time::Duration;
/// use tower_backoff::http::RetryInfo;
///
/// # let mut response = http::Response::new(());
/// # response.extensions_mut().insert(RetryInfo::new(2, Duration::from_millis(100)));
/// if let Some(info) = response.extensions().get::<RetryInfo>() {
///     println!("{} attempts, {:?} asleep", info.attempts, info.slept);
/// }
/// ```
///
/// Errors carry no extensions, so an error returned after retries does not say
/// how many there were; count attempts with a layer inside the retry layer if
/// you need that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct RetryInfo {
    /// Attempts made, the first included.
    pub attempts: u32,
    /// Total time slept between attempts.
    pub slept: Duration,
}

impl RetryInfo {
    /// The record of `attempts` attempts with `slept` between them.
    pub const fn new(attempts: u32, slept: Duration) -> Self {
        Self { attempts, slept }
    }
}
