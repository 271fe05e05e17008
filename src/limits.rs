//! The settings the layer and the [`retry`](fn@crate::retry) helper share: how
//! delays are jittered and when to stop trying.

use std::time::Duration;

use crate::error::{check_duration, ConfigError};
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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            jitter: Jitter::Full,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_elapsed: None,
            seed: None,
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
            if limit.is_zero() {
                return Err(ConfigError::new("max_elapsed", "must be longer than zero"));
            }
            check_duration("max_elapsed", limit)?;
        }
        self.jitter.validate()?;
        schedule.validate()
    }
}
