//! What went wrong in a cloud call.

use std::time::Duration;

/// A convenient alias for provider results.
pub type Result<T, E = CloudError> = std::result::Result<T, E>;

/// What went wrong in a cloud call. The gateway maps it to a gRPC
/// status, in one place.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CloudError {
    /// A named resource does not exist; a definite answer from the cloud.
    #[error("{0} not found")]
    NotFound(String),
    /// The provider does not implement this capability.
    #[error("{0} is not implemented by this provider")]
    NotImplemented(&'static str),
    /// Another implementation handles this object.
    #[error("implemented elsewhere: {0}")]
    ImplementedElsewhere(String),
    /// The resource is still being provisioned.
    #[error("{message}; retry after {retry_after:?}")]
    Provisioning {
        /// When to ask again.
        retry_after: Duration,
        /// What is being provisioned.
        message: String,
    },
    /// The cloud throttled us.
    #[error("throttled by the cloud; retry after {retry_after:?}")]
    Throttled {
        /// When the cloud will take calls again.
        retry_after: Duration,
    },
    /// The gateway's API budget has no room for this call in time.
    #[error("cloud API budget exhausted; retry after {retry_after:?}")]
    BudgetExhausted {
        /// The estimated wait.
        retry_after: Duration,
    },
    /// Request fields are invalid: `(field path, what is wrong)`.
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<(String, String)>),
    /// The request conflicts with an existing resource.
    #[error("conflict: {0}")]
    Conflict(String),
    /// No free address is left in the pool.
    #[error("address pool exhausted: {0}")]
    PoolExhausted(String),
    /// The cloud account is at a quota; an operator must raise it.
    #[error("cloud quota reached: {0}")]
    QuotaExceeded(String),
    /// The gateway's credentials may not do this.
    #[error("the cloud refused: {0}")]
    PermissionDenied(String),
    /// The cloud account is not set up for this cluster (e.g. no route
    /// table carries the cluster's tag); an operator must act.
    #[error("the cloud is not set up for this: {0}")]
    NotConfigured(String),
    /// The cloud failed or could not be reached; nothing is known.
    #[error("cloud unavailable: {0}")]
    Unavailable(String),
    /// A bug or an unexpected state in the gateway or provider.
    #[error("internal error: {0}")]
    Internal(String),
    /// A volume is attached to another instance (or, to delete it, to any).
    #[error("volume in use: {0}")]
    VolumeInUse(String),
    /// A volume and an instance are in different zones.
    #[error("zone mismatch: {0}")]
    ZoneMismatch(String),
    /// An instance has as many volumes attached as it can take.
    #[error("attach limit reached: {0}")]
    AttachLimit(String),
}

fn describe(violations: &[(String, String)]) -> String {
    violations
        .iter()
        .map(|(field, problem)| format!("{field}: {problem}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl CloudError {
    /// One invalid field.
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::InvalidArgument(vec![(field.into(), problem.into())])
    }

    /// `Ok` when no problem was found, else every one at once:
    /// `(field path, what is wrong)`, as [`CloudError::InvalidArgument`].
    pub fn none_of(problems: Vec<(String, String)>) -> Result<()> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Self::InvalidArgument(problems))
        }
    }

    /// A stable label for the `outcome` of cloud-call metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::NotImplemented(_) => "not_implemented",
            Self::ImplementedElsewhere(_) => "implemented_elsewhere",
            Self::Provisioning { .. } => "provisioning",
            Self::Throttled { .. } => "throttled",
            Self::BudgetExhausted { .. } => "budget_exhausted",
            Self::InvalidArgument(_) => "invalid_argument",
            Self::Conflict(_) => "conflict",
            Self::PoolExhausted(_) => "pool_exhausted",
            Self::QuotaExceeded(_) => "quota_exceeded",
            Self::PermissionDenied(_) => "permission_denied",
            Self::NotConfigured(_) => "not_configured",
            Self::Unavailable(_) => "unavailable",
            Self::Internal(_) => "internal",
            Self::VolumeInUse(_) => "volume_in_use",
            Self::ZoneMismatch(_) => "zone_mismatch",
            Self::AttachLimit(_) => "attach_limit",
        }
    }
}
