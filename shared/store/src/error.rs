use recollect_model::{Classify, ErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage backend failed: {0}")]
    Backend(String),
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
}

impl Classify for StoreError {
    fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Backend(_) => ErrorKind::Unavailable,
            StoreError::Corrupt(_) => ErrorKind::Internal,
            StoreError::Invalid(_) => ErrorKind::InvalidArgument,
            StoreError::Conflict(_) => ErrorKind::Conflict,
        }
    }
}

macro_rules! backend_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Backend(e.to_string())
            }
        }
    )*};
}
backend_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    std::io::Error,
    tokio::task::JoinError
);

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}
