//! The settings the layer and the [`retry`](fn@crate::retry) helper share: how
//! delays are jittered and when to stop trying.

use std::time::Duration;

use crate::error::{check_limit, ConfigError};
use crate::jitter::Jitter;
use crate::schedule::Schedule;

/// Default number of attempts, the first included: AWS SDKs' standard mode and
/// the SRE book both settle on 3. One retry rarely rides out a blip; more than
/// two multiplies load on a server that is already failing.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) jitter: Jitter,
    pub(crate) max_attempts: u32,
    pub(crate) max_elapsed: Option<Duration>,
    pub(crate) seed: Option<u64>,
    /// Stop once the schedule's delay reaches its cap (after one last try).
    pub(crate) stop_at_cap: bool,
    /// Wait a server's delay as named, even below the schedule's.
    pub(crate) exact_server_delays: bool,
}

/// `max_attempts` meaning "no limit": a time limit (`max_elapsed`) bounds the
/// request instead.
pub const UNLIMITED_ATTEMPTS: u32 = u32::MAX;

impl Default for Limits {
    fn default() -> Self {
        Self {
            jitter: Jitter::Full,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_elapsed: None,
            seed: None,
            stop_at_cap: false,
            exact_server_delays: false,
        }
    }
}

impl Limits {
    /// Checks these settings together with `schedule`, naming the first field
    /// that cannot work.
    pub(crate) fn validate<S: Schedule + ?Sized>(&self, schedule: &S) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::new(
                "max_attempts",
                "must be at least 1 (the first attempt counts)",
            ));
        }
        if let Some(limit) = self.max_elapsed {
            check_limit("max_elapsed", limit)?;
        }
        self.jitter.validate()?;
        schedule.validate()
    }

    /// Refuses unlimited attempts without a time limit. A budget bounds a
    /// fleet's retries, not one request's: a request it keeps paying for
    /// (each retry earning its cost back from a success of another) would
    /// never end; and the stop at the cap does not hold once a server's
    /// delay restarts the schedule.
    pub(crate) fn check_bounded(&self) -> Result<(), ConfigError> {
        if self.max_attempts == UNLIMITED_ATTEMPTS && self.max_elapsed.is_none() {
            return Err(ConfigError::new(
                "max_attempts",
                "unlimited attempts need a time limit (max_elapsed): a budget bounds a fleet's retries, not one request's",
            ));
        }
        Ok(())
    }
}
