//! The service controller's errors: those of every controller
//! ([`SyncError`]) and its own ([`ServiceError`]).

use std::time::Duration;

use ccm_runtime::controller::{OwnError, SyncError};

/// What can go wrong while syncing a Service.
pub type Error = SyncError<ServiceError>;

/// A convenient alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong with a Service in this controller alone.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The cloud asks to come back after `delay`: `reason` is the
    /// gateway's (e.g. `PROVISIONING`), `message` its words.
    #[error("retry after {delay:?}: {message}")]
    RetryAfter {
        delay: Duration,
        reason: String,
        message: String,
    },
}

impl OwnError for ServiceError {
    fn metric_label(&self) -> &'static str {
        match self {
            ServiceError::RetryAfter { .. } => "retry_after",
        }
    }
}
