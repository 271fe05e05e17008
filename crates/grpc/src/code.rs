//! [`CodeSet`]: which gRPC status codes a method may retry.

use std::fmt;

use tonic::Code;

/// Every gRPC status code, in numeric order: `Code` has no iterator of its own.
const ALL: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

/// The upper-case names a service config uses (`"UNAVAILABLE"`), in numeric
/// order.
const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// A set of gRPC status codes, as `retryableStatusCodes` lists them: a bit
/// per code, `Copy`, no allocation.
///
/// [`CodeSet::DEFAULT`] is `UNAVAILABLE` alone, the only code that says the
/// server did not process the call whatever the method does. Add others only
/// for methods that are safe to run twice (gRFC A6 leaves that judgement to
/// the service owner).
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// use tonic::Code;
/// use tower_backoff::grpc::CodeSet;
///
/// let codes = CodeSet::DEFAULT.with(Code::ResourceExhausted);
/// assert!(codes.contains(Code::Unavailable));
/// assert!(codes.contains(Code::ResourceExhausted));
/// assert!(!codes.contains(Code::Internal));
/// assert_eq!(CodeSet::parse("deadline_exceeded"), Some(Code::DeadlineExceeded));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CodeSet(u32);

impl CodeSet {
    /// No code: nothing is retried but requests that never left the client.
    pub const EMPTY: CodeSet = CodeSet(0);

    /// `UNAVAILABLE` only.
    pub const DEFAULT: CodeSet = CodeSet(1 << Code::Unavailable as u32);

    /// This set and `code`.
    pub const fn with(self, code: Code) -> Self {
        CodeSet(self.0 | 1 << code as u32)
    }

    /// This set without `code`.
    pub const fn without(self, code: Code) -> Self {
        CodeSet(self.0 & !(1 << code as u32))
    }

    /// Whether `code` is in the set.
    pub const fn contains(self, code: Code) -> bool {
        self.0 & 1 << code as u32 != 0
    }

    /// Whether the set has no code.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The codes in the set, in numeric order.
    pub fn iter(self) -> impl Iterator<Item = Code> {
        ALL.into_iter().filter(move |&code| self.contains(code))
    }

    /// The code a service config names, case-insensitively (`"UNAVAILABLE"`,
    /// `"unavailable"`); `None` for anything else.
    pub fn parse(name: &str) -> Option<Code> {
        NAMES
            .iter()
            .position(|known| known.eq_ignore_ascii_case(name))
            .map(|i| ALL[i])
    }

    /// The service-config name of `code` (`"UNAVAILABLE"`).
    pub fn name(code: Code) -> &'static str {
        NAMES[code as usize]
    }
}

impl FromIterator<Code> for CodeSet {
    fn from_iter<I: IntoIterator<Item = Code>>(iter: I) -> Self {
        iter.into_iter().fold(CodeSet::EMPTY, CodeSet::with)
    }
}

impl fmt::Debug for CodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(CodeSet::name))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_line_up() {
        for (i, code) in ALL.iter().enumerate() {
            assert_eq!(*code as usize, i);
            assert_eq!(Code::from_i32(i as i32), *code);
            assert_eq!(CodeSet::parse(NAMES[i]), Some(*code));
        }
    }

    #[test]
    fn parsing_ignores_case_and_rejects_strangers() {
        assert_eq!(CodeSet::parse("Unavailable"), Some(Code::Unavailable));
        assert_eq!(CodeSet::parse("UNAVAILABLE "), None);
        assert_eq!(CodeSet::parse(""), None);
        assert_eq!(CodeSet::parse("14"), None);
    }

    #[test]
    fn a_set_holds_what_was_added() {
        let set: CodeSet = [Code::Aborted, Code::Internal].into_iter().collect();
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [Code::Aborted, Code::Internal]
        );
        assert!(set.without(Code::Aborted).contains(Code::Internal));
        assert!(!set.without(Code::Aborted).contains(Code::Aborted));
        assert_eq!(format!("{set:?}"), r#"{"ABORTED", "INTERNAL"}"#);
    }
}
