//! Typed errors of the gateway client. [`Error::from_status`] is the one
//! place where a gRPC `Status` becomes a typed error on the client side.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::reason;

/// A convenient alias for results of gateway calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One invalid field of a request, as the gateway named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field's path, e.g. `spec.annotations["sim.cloudgateway.io/algorithm"]`.
    pub field: String,
    /// What is wrong with it, and what would be accepted.
    pub description: String,
}

/// What went wrong with a gateway call.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// The named resource does not exist (a confirmed answer).
    #[error("not found: {message}")]
    NotFound {
        /// The machine-readable reason.
        reason: String,
        /// The gateway's message.
        message: String,
    },
    /// The provider does not implement this call.
    #[error("not implemented by the provider: {message}")]
    Unimplemented {
        /// The gateway's message.
        message: String,
    },
    /// The provider hands this object to another implementation.
    #[error("implemented elsewhere: {message}")]
    ImplementedElsewhere {
        /// The gateway's message.
        message: String,
    },
    /// Try again after `delay` (provisioning in progress, throttled, budget
    /// full).
    #[error("retry after {delay:?}: {message}")]
    RetryAfter {
        /// How long to wait before asking again.
        delay: Duration,
        /// The machine-readable reason, e.g. [`reason::PROVISIONING`].
        reason: String,
        /// The gateway's message.
        message: String,
    },
    /// The request was invalid; nothing was changed.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The fields at fault.
        violations: Vec<FieldViolation>,
        /// The gateway's message.
        message: String,
    },
    /// The request conflicts with an existing resource.
    #[error("conflict: {message}")]
    AlreadyExists {
        /// The gateway's message.
        message: String,
    },
    /// The call carried no valid token.
    #[error("unauthenticated: {message}")]
    Unauthenticated {
        /// The gateway's message.
        message: String,
    },
    /// The caller's role, or the gateway's cloud credentials, may not do this.
    #[error("permission denied: {message}")]
    PermissionDenied {
        /// [`reason::ROLE_NOT_ALLOWED`] or [`reason::CLOUD_PERMISSION_DENIED`].
        reason: String,
        /// The gateway's message.
        message: String,
    },
    /// The gateway or the cloud could not be reached or failed.
    #[error("unavailable: {message}")]
    Unavailable {
        /// The gateway's message.
        message: String,
    },
    /// The call's deadline passed.
    #[error("deadline exceeded: {message}")]
    DeadlineExceeded {
        /// The gateway's message.
        message: String,
    },
    /// Any other gRPC status.
    #[error("{code:?}: {message}")]
    Other {
        /// The gRPC code.
        code: Code,
        /// The gateway's message.
        message: String,
    },
    /// The client could not be set up (bad address, unreadable token file).
    #[error("gateway client: {0}")]
    Config(String),
}

impl Error {
    /// Maps a gRPC status from the gateway to a typed error.
    pub fn from_status(status: Status) -> Self {
        let details = status.get_error_details();
        let reason = details
            .error_info()
            .map(|info| info.reason.clone())
            .unwrap_or_default();
        let delay = details.retry_info().and_then(|info| info.retry_delay);
        let mut message = status.message().to_owned();
        // A status tonic made from a transport error ("transport error")
        // says nothing on its own: name its causes (a certificate the CA
        // did not sign, a refused connection).
        let mut source = std::error::Error::source(&status);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !message.contains(&cause_text) {
                message = format!("{message}: {cause_text}");
            }
            source = cause.source();
        }
        match status.code() {
            Code::NotFound => Error::NotFound { reason, message },
            Code::Unimplemented => Error::Unimplemented { message },
            Code::FailedPrecondition if reason == reason::IMPLEMENTED_ELSEWHERE => {
                Error::ImplementedElsewhere { message }
            }
            Code::Unavailable | Code::ResourceExhausted if delay.is_some() => Error::RetryAfter {
                delay: delay.unwrap_or_default(),
                reason,
                message,
            },
            Code::InvalidArgument => Error::InvalidArgument {
                violations: details
                    .bad_request()
                    .map(|bad| {
                        bad.field_violations
                            .iter()
                            .map(|v| FieldViolation {
                                field: v.field.clone(),
                                description: v.description.clone(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                message,
            },
            Code::AlreadyExists => Error::AlreadyExists { message },
            Code::Unauthenticated => Error::Unauthenticated { message },
            Code::PermissionDenied => Error::PermissionDenied { reason, message },
            Code::Unavailable => Error::Unavailable { message },
            Code::DeadlineExceeded => Error::DeadlineExceeded { message },
            code => Error::Other { code, message },
        }
    }

    /// A stable, low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::Unimplemented { .. } => "unimplemented",
            Error::ImplementedElsewhere { .. } => "implemented_elsewhere",
            Error::RetryAfter { .. } => "retry_after",
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::AlreadyExists { .. } => "already_exists",
            Error::Unauthenticated { .. } => "unauthenticated",
            Error::PermissionDenied { .. } => "permission_denied",
            Error::Unavailable { .. } => "unavailable",
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
            Error::Other { .. } => "other",
            Error::Config(_) => "config",
        }
    }

    /// The delay the gateway asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::RetryAfter { delay, .. } => Some(*delay),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic_types::ErrorDetails;

    use super::*;

    fn status(code: Code, details: ErrorDetails) -> Status {
        Status::with_error_details(code, "msg", details)
    }

    #[test]
    fn statuses_map_to_typed_errors() {
        let info = |r: &str| ErrorDetails::with_error_info(r, reason::DOMAIN, []);
        let mut retry = info(reason::PROVISIONING);
        retry.set_retry_info(Some(Duration::from_secs(3)));
        let cases: Vec<(Status, &str)> = vec![
            (status(Code::NotFound, info(reason::NOT_FOUND)), "not_found"),
            (Status::unimplemented("x"), "unimplemented"),
            (
                status(
                    Code::FailedPrecondition,
                    info(reason::IMPLEMENTED_ELSEWHERE),
                ),
                "implemented_elsewhere",
            ),
            (status(Code::Unavailable, retry), "retry_after"),
            (Status::unavailable("down"), "unavailable"),
            (
                status(
                    Code::InvalidArgument,
                    ErrorDetails::with_bad_request_violation("f", "bad"),
                ),
                "invalid_argument",
            ),
            (Status::unauthenticated("x"), "unauthenticated"),
            (Status::permission_denied("x"), "permission_denied"),
            (Status::already_exists("x"), "already_exists"),
            (Status::deadline_exceeded("x"), "deadline_exceeded"),
            (Status::internal("x"), "other"),
        ];
        for (status, label) in cases {
            assert_eq!(Error::from_status(status).metric_label(), label);
        }
    }

    #[test]
    fn retry_after_keeps_delay_and_reason() {
        let mut details =
            ErrorDetails::with_error_info(reason::CLOUD_THROTTLED, reason::DOMAIN, []);
        details.set_retry_info(Some(Duration::from_millis(1500)));
        let err = Error::from_status(status(Code::ResourceExhausted, details));
        match err {
            Error::RetryAfter { delay, reason, .. } => {
                assert_eq!(delay, Duration::from_millis(1500));
                assert_eq!(reason, reason::CLOUD_THROTTLED);
            }
            other => panic!("expected RetryAfter, got {other:?}"),
        }
    }

    #[test]
    fn invalid_argument_names_the_fields() {
        let mut details = ErrorDetails::new();
        details.add_bad_request_violation("route.destination_cidr", "not a CIDR");
        details.add_bad_request_violation("cluster_name", "empty");
        let err = Error::from_status(status(Code::InvalidArgument, details));
        let Error::InvalidArgument { violations, .. } = err else {
            panic!("expected InvalidArgument");
        };
        let fields: Vec<_> = violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["route.destination_cidr", "cluster_name"]);
    }
}
