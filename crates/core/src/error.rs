//! Configuration errors, reported when a layer, schedule or budget is built,
//! and the checks the builders share.

use std::fmt;

/// A configuration value that cannot work, found when the layer (or a schedule,
/// budget or pacing) is built rather than when the first request fails.
///
/// The message names the field, so a user reading a start-up error knows which
/// setting to fix.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff::{BackoffLayer, Exponential};
///
/// let err = BackoffLayer::builder()
///     .schedule(Exponential::new(Duration::from_millis(100)).factor(0.5))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "factor");
/// assert!(err.to_string().contains("factor"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    reason: String,
}

impl ConfigError {
    /// An error about `field`, explained by `reason`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }

    /// The name of the setting that is wrong, as it appears in the builder.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why the value cannot work.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Longest delay or time limit the crate accepts: a year. Anything longer is
/// almost certainly a unit mistake (milliseconds passed as seconds), and tokio's
/// timer cannot represent much more than that anyway.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 60 * 60);

/// Rejects durations no timer should be asked for: longer than
/// [`MAX_DURATION`], as every builder of the crate checks them.
pub fn check_duration(field: &'static str, value: std::time::Duration) -> Result<(), ConfigError> {
    if value > MAX_DURATION {
        return Err(ConfigError::new(
            field,
            format!("{value:?} is longer than a year; is the unit right?"),
        ));
    }
    Ok(())
}
