//! The error vocabulary shared by every layer. Each library keeps its own `thiserror` enum and
//! says which [`ErrorKind`] each variant is; the HTTP and gRPC edges map kinds to status codes in
//! one place each.

use thiserror::Error;

/// The classes of failure a client or operator needs to tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed or breaks a limit: fix it, do not retry.
    InvalidArgument,
    Unauthenticated,
    NotFound,
    /// The request contradicts what is stored (a turn id that already holds another turn):
    /// retrying the same request cannot succeed.
    Conflict,
    /// Too many requests or too much in flight: retry later.
    ResourceExhausted,
    /// A dependency (store, broker, model) failed: retrying may help.
    Unavailable,
    Internal,
}

impl ErrorKind {
    /// Stable lower-case code for JSON bodies and metric labels.
    pub fn code(&self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

/// An error that knows its kind.
pub trait Classify {
    fn kind(&self) -> ErrorKind;
}

/// A borrowed error is classified as the error itself, so `map_err(StageError::classified)`
/// takes errors by value and by reference alike.
impl<T: Classify + ?Sized> Classify for &T {
    fn kind(&self) -> ErrorKind {
        (**self).kind()
    }
}

/// The error type of the service layer: what handlers return.
#[derive(Debug, Error)]
pub enum RecollectError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Exhausted(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl RecollectError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::Invalid(msg.into())
    }
    pub fn internal(msg: impl std::fmt::Display) -> Self {
        Self::Internal(msg.to_string())
    }
    /// Wrap any classified library error, keeping its kind.
    pub fn from_classified<E: Classify + std::fmt::Display>(e: E) -> Self {
        let msg = e.to_string();
        match e.kind() {
            ErrorKind::InvalidArgument => Self::Invalid(msg),
            ErrorKind::Unauthenticated => Self::Unauthenticated(msg),
            ErrorKind::NotFound => Self::NotFound(msg),
            ErrorKind::Conflict => Self::Conflict(msg),
            ErrorKind::ResourceExhausted => Self::Exhausted(msg),
            ErrorKind::Unavailable => Self::Unavailable(msg),
            ErrorKind::Internal => Self::Internal(msg),
        }
    }
}

impl Classify for RecollectError {
    fn kind(&self) -> ErrorKind {
        match self {
            RecollectError::Invalid(_) => ErrorKind::InvalidArgument,
            RecollectError::Unauthenticated(_) => ErrorKind::Unauthenticated,
            RecollectError::NotFound(_) => ErrorKind::NotFound,
            RecollectError::Conflict(_) => ErrorKind::Conflict,
            RecollectError::Exhausted(_) => ErrorKind::ResourceExhausted,
            RecollectError::Unavailable(_) => ErrorKind::Unavailable,
            RecollectError::Internal(_) => ErrorKind::Internal,
        }
    }
}
