//! [`Event`]: what happened to a provider, for logs and metrics.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// Something that happened to one provider, sent to every
/// [`subscribe`](super::Poller::subscribe)r.
///
/// A provider's events arrive in the order they happened, and by the time one
/// is received the [`Board`](super::Board) already reflects it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event<K> {
    /// The provider was added; its first poll starts at once.
    Added {
        /// The provider.
        key: K,
    },
    /// A poll answered (or timed out). A failure is followed by
    /// [`Quarantined`](Event::Quarantined) or [`Evicted`](Event::Evicted), a
    /// success after failures by [`Recovered`](Event::Recovered).
    Polled {
        /// The provider.
        key: K,
        /// `Ok` when the poll succeeded.
        outcome: Result<(), Failure>,
        /// How long the poll took.
        took: Duration,
    },
    /// A poll failed and the provider is polled again at `next_poll`; sent for
    /// every failure short of eviction.
    Quarantined {
        /// The provider.
        key: K,
        /// Consecutive failed polls.
        failures: u32,
        /// When it is polled next.
        next_poll: Instant,
    },
    /// A poll succeeded after `failures` failed ones: the provider is healthy
    /// again and its backoff starts over.
    Recovered {
        /// The provider.
        key: K,
        /// How many polls in a row had failed before.
        failures: u32,
    },
    /// The provider failed too many polls in a row and is no longer polled,
    /// except for a re-probe at `reprobe_at`. Sent once; failed re-probes only
    /// send [`Polled`](Event::Polled).
    Evicted {
        /// The provider.
        key: K,
        /// Consecutive failed polls.
        failures: u32,
        /// When it is probed again, if ever.
        reprobe_at: Option<Instant>,
    },
    /// A quarantined provider's poll was skipped because the shared budget
    /// refused it; it is tried again at `next_poll`.
    Deferred {
        /// The provider.
        key: K,
        /// When its poll is tried again.
        next_poll: Instant,
    },
    /// The provider was removed; it is not polled any more.
    Removed {
        /// The provider.
        key: K,
    },
}

impl<K> Event<K> {
    /// The provider this event is about.
    pub fn key(&self) -> &K {
        match self {
            Event::Added { key }
            | Event::Polled { key, .. }
            | Event::Quarantined { key, .. }
            | Event::Recovered { key, .. }
            | Event::Evicted { key, .. }
            | Event::Deferred { key, .. }
            | Event::Removed { key } => key,
        }
    }
}

/// Why a poll failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// No answer within the per-poll [`timeout`](super::PollerBuilder::timeout).
    TimedOut,
    /// The service failed (or was not ready); its error's message.
    Error(String),
    /// The service answered, but the policy did not call the answer a success.
    Rejected,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::TimedOut => f.write_str("timed out"),
            Failure::Error(message) => f.write_str(message),
            Failure::Rejected => f.write_str("answer rejected by the policy"),
        }
    }
}
