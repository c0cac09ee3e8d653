//! The service controller's errors.

use std::time::Duration;

/// What can go wrong while syncing a Service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A gateway call failed.
    #[error("gateway: {0}")]
    Gateway(#[from] ccm_proto::Error),
    /// A Kubernetes API call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// The cloud asks to come back after a delay (e.g. provisioning).
    #[error("retry after {0:?}")]
    RetryAfter(Duration),
    /// This replica does not lead (any more); it must not write.
    #[error("not the leader")]
    NotLeader,
}

/// A convenient alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Gateway(e) => e.metric_label(),
            Error::Kube(_) => "kubernetes",
            Error::RetryAfter(_) => "retry_after",
            Error::NotLeader => "not_leader",
        }
    }
}
