//! The node controller's errors: those of every controller
//! ([`SyncError`]) and its own ([`NodeError`]).

use ccm_runtime::controller::{OwnError, SyncError};

/// What can go wrong while syncing a node.
pub type Error = SyncError<NodeError>;

/// A convenient alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong with a node in this controller alone.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The cloud has no instance for the node (yet).
    #[error("no instance found in the cloud for node {0}")]
    InstanceNotFound(String),
    /// The node's data does not allow initialisation (e.g. a bad node-ip).
    #[error("{0}")]
    Invalid(String),
}

impl OwnError for NodeError {
    fn metric_label(&self) -> &'static str {
        match self {
            NodeError::InstanceNotFound(_) => "instance_not_found",
            NodeError::Invalid(_) => "invalid",
        }
    }
}
