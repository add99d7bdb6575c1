use std::error::Error as StdError;

use recollect_model::{Classify, ErrorKind};

/// The underlying error of a backend (redb, neo4rs, qdrant, reqwest, io), kept for `source()`.
pub type Source = Box<dyn StdError + Send + Sync + 'static>;

/// Errors of every store. The variant says what a caller can do about it ([`Classify`]): a
/// `Backend` failure may pass on retry; `Corrupt`, `Invalid` and `Conflict` will not, so a
/// pipeline stage sends the message to the dead-letter topic at once.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The message names the backend and carries the underlying error's text, so one log line
    /// says what failed; `source()` still gives the error itself.
    #[error("storage backend failed: {message}")]
    Backend {
        message: String,
        #[source]
        source: Option<Source>,
    },
    #[error("stored data is unreadable: {message}")]
    Corrupt {
        message: String,
        #[source]
        source: Option<Source>,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
}

impl StoreError {
    /// A backend failure caused by `source`; `context` names the backend or the operation.
    pub fn backend(context: &str, source: impl StdError + Send + Sync + 'static) -> Self {
        StoreError::Backend {
            message: join(context, &source),
            source: Some(Box::new(source)),
        }
    }

    /// A backend failure known only by its message (a remote peer's reply, a refused state).
    pub fn backend_msg(message: impl Into<String>) -> Self {
        StoreError::Backend {
            message: message.into(),
            source: None,
        }
    }

    /// Unreadable stored data caused by `source` (a decoding error).
    pub fn corrupt(context: &str, source: impl StdError + Send + Sync + 'static) -> Self {
        StoreError::Corrupt {
            message: join(context, &source),
            source: Some(Box::new(source)),
        }
    }

    pub fn corrupt_msg(message: impl Into<String>) -> Self {
        StoreError::Corrupt {
            message: message.into(),
            source: None,
        }
    }

    /// Whether the same call may succeed later (only backend failures may).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Backend { .. })
    }

    /// The message without the variant's prefix (what travels on the store service's wire).
    pub fn message(&self) -> &str {
        match self {
            StoreError::Backend { message, .. } | StoreError::Corrupt { message, .. } => message,
            StoreError::Invalid(m) | StoreError::Conflict(m) => m,
        }
    }
}

fn join(context: &str, source: &dyn std::fmt::Display) -> String {
    if context.is_empty() {
        source.to_string()
    } else {
        format!("{context}: {source}")
    }
}

impl Classify for StoreError {
    fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Backend { .. } => ErrorKind::Unavailable,
            StoreError::Corrupt { .. } => ErrorKind::Internal,
            StoreError::Invalid(_) => ErrorKind::InvalidArgument,
            StoreError::Conflict(_) => ErrorKind::Conflict,
        }
    }
}

macro_rules! backend_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::backend("", e)
            }
        }
    )*};
}
backend_from!(std::io::Error, tokio::task::JoinError);
#[cfg(feature = "embedded")]
backend_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::CompactionError
);

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::corrupt("", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_underlying_error_is_kept_as_source() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "disk says no");
        let e = StoreError::from(io);
        assert_eq!(e.to_string(), "storage backend failed: disk says no");
        let src = e.source().expect("source kept");
        assert_eq!(
            src.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::PermissionDenied)
        );
        assert!(e.is_transient());
    }

    #[test]
    fn only_backend_failures_are_transient() {
        let bad: serde_json::Error = serde_json::from_str::<u8>("x").unwrap_err();
        assert!(!StoreError::from(bad).is_transient());
        assert!(!StoreError::Invalid("x".into()).is_transient());
        assert!(!StoreError::Conflict("x".into()).is_transient());
        assert!(StoreError::backend_msg("x").is_transient());
        assert_eq!(
            StoreError::backend("neo4j", std::fmt::Error).message(),
            "neo4j: an error occurred when formatting an argument"
        );
    }
}
