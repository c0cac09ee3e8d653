//! The node controller's errors.

/// What can go wrong while syncing a node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A gateway call failed.
    #[error("gateway: {0}")]
    Gateway(#[from] ccm_proto::Error),
    /// A Kubernetes API call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// The cloud has no instance for the node (yet).
    #[error("no instance found in the cloud for node {0}")]
    InstanceNotFound(String),
    /// The node's data does not allow initialisation (e.g. a bad node-ip).
    #[error("{0}")]
    Invalid(String),
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
            Error::InstanceNotFound(_) => "instance_not_found",
            Error::Invalid(_) => "invalid",
            Error::NotLeader => "not_leader",
        }
    }
}
