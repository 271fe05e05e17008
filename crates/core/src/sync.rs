//! The atomics the budgets are built on: std's, or loom's when the crate is
//! model-checked (`--cfg tower_backoff_loom`), so loom checks the code that ships.
//!
//! The cfg has the crate's name in it because a plain `--cfg loom` would also
//! switch tokio into its own loom mode, which does not build as a dependency.

#[cfg(not(tower_backoff_loom))]
pub use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(tower_backoff_loom)]
pub use loom::sync::atomic::{AtomicU64, Ordering};
