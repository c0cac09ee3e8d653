//! The route controller's errors.

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A gateway call failed.
    #[error("gateway: {0}")]
    Gateway(#[from] ccm_proto::Error),
    /// A Kubernetes API call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// Some routes could not be created; they are retried.
    #[error("{0} routes could not be created")]
    CreateFailed(usize),
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
            Error::CreateFailed(_) => "create_failed",
            Error::NotLeader => "not_leader",
        }
    }
}
