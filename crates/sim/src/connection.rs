//! [`Connection`]: a client's view of the simulated server, one attempt at a
//! time, each with its own timeout.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Timeout;
use tower_service::Service;

use super::server::{Server, ServerGone, Submission};

/// One logical request of the workload. Retries send the same value again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Numbers logical requests in the order the workload issued them.
    pub id: u64,
}

/// Why one attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptError {
    /// No answer within the per-attempt timeout. The server may still be
    /// working on it.
    TimedOut,
    /// The server was dropped; only happens when a simulation ends.
    ServerGone,
    /// The server answered with an error.
    Failed,
}

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttemptError::TimedOut => "attempt timed out",
            AttemptError::ServerGone => "server gone",
            AttemptError::Failed => "server answered with an error",
        })
    }
}

impl std::error::Error for AttemptError {}

/// A tower `Service` that sends each request to a [`Server`] and gives up on it
/// after a per-attempt timeout, as an HTTP client with a request timeout does.
///
/// This is the service a retry layer wraps in the simulations: the timeout is
/// per attempt, inside the layer, so a retry gets a fresh one.
#[derive(Debug, Clone)]
pub struct Connection {
    server: Server,
    timeout: Duration,
}

impl Connection {
    /// Attempts to `server` that time out after `timeout`.
    pub fn new(server: Server, timeout: Duration) -> Self {
        Self { server, timeout }
    }
}

impl Service<Request> for Connection {
    type Response = ();
    type Error = AttemptError;
    type Future = Attempt;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), AttemptError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request) -> Attempt {
        Attempt {
            inner: tokio::time::timeout(self.timeout, self.server.submit()),
        }
    }
}

pin_project! {
    /// The future of one [`Connection`] attempt.
    #[derive(Debug)]
    pub struct Attempt {
        #[pin]
        inner: Timeout<Submission>,
    }
}

impl Future for Attempt {
    type Output = Result<(), AttemptError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map(|outcome| match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(ServerGone)) => Err(AttemptError::ServerGone),
            Err(_elapsed) => Err(AttemptError::TimedOut),
        })
    }
}
