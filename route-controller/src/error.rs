//! The route controller's errors: those of every controller
//! ([`SyncError`]) and its own ([`RouteError`]).

use ccm_runtime::controller::{OwnError, SyncError};

/// What can go wrong in a reconcile.
pub type Error = SyncError<RouteError>;

/// A convenient alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in this controller alone.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// Some routes could not be created; they are retried.
    #[error("{0} routes could not be created")]
    CreateFailed(usize),
}

impl OwnError for RouteError {
    fn metric_label(&self) -> &'static str {
        match self {
            RouteError::CreateFailed(_) => "create_failed",
        }
    }
}
