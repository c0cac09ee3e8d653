//! The one place an AWS SDK error becomes a [`CloudError`]. Throttling
//! slows the budget down, refused credentials are permission errors, and
//! anything else the cloud did not answer clearly is "unavailable": none of
//! them ever reads as "not found". Callers that expect a `*.NotFound` code
//! check for it with [`code`] before mapping the rest here.

use std::error::Error as StdError;
use std::fmt::Debug;
use std::time::Duration;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use ccm_provider::CloudError;

/// How long the budget pauses after an AWS throttling answer, which carries
/// no delay of its own.
const THROTTLE_PAUSE: Duration = Duration::from_secs(1);

/// How long to wait before asking again about a load balancer being made or
/// taken down, or about what it still holds on to while it goes, or about a
/// volume being detached.
const PROVISIONING_RETRY: Duration = Duration::from_secs(15);

/// Error codes AWS uses for "slow down".
const THROTTLING: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
    "SlowDown",
    "BandwidthLimitExceeded",
];

/// Error codes for credentials that are missing, wrong, expired or not
/// allowed to do what was asked.
const REFUSED: &[&str] = &[
    "AuthFailure",
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
    "InvalidToken",
    "OptInRequired",
    "Blocked",
    "PendingVerification",
];

/// Error codes for an account quota (not throttling).
const QUOTA: &[&str] = &[
    "TooManyLoadBalancers",
    "TooManyTargetGroups",
    "TooManyListeners",
    "TooManyTargets",
    "TooManyRegistrationsForTargetId",
    "TooManyTags",
    "TooManyUniqueTargetGroupsPerLoadBalancer",
    "RulesPerSecurityGroupLimitExceeded",
    "SecurityGroupLimitExceeded",
    "AddressLimitExceeded",
    "VolumeLimitExceeded",
    "SnapshotLimitExceeded",
    "MaxIOPSLimitExceeded",
];

/// Error codes that say the request itself is wrong for this account,
/// e.g. a certificate or subnet the Service names does not exist.
const INVALID: &[&str] = &[
    "CertificateNotFound",
    "InvalidConfigurationRequest",
    "InvalidSubnet",
    "SubnetNotFound",
    "InvalidSubnetID.NotFound",
    "AllocationIdNotFound",
    "InvalidAllocationID.NotFound",
    "InvalidSecurityGroup",
    "SSLPolicyNotFound",
    "UnsupportedProtocol",
    "ValidationError",
    "InvalidParameterValue",
];

/// The service error code of `err`, when the cloud answered with one.
pub(super) fn code<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> Option<&str> {
    match err {
        SdkError::ServiceError(e) => e.err().code(),
        _ => None,
    }
}

/// The message the cloud answered `err` with; empty when there is none.
pub(super) fn message<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> &str {
    match err {
        SdkError::ServiceError(e) => e.err().message().unwrap_or_default(),
        _ => "",
    }
}

/// Maps an SDK error of the AWS action `action` (e.g. `DescribeInstances`).
pub(super) fn cloud_error<E, R>(action: &str, err: SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    R: Debug + 'static,
{
    if let SdkError::ServiceError(service) = &err {
        let code = service.err().code().unwrap_or("Unknown");
        let message = service.err().message().unwrap_or_default();
        return classify(action, code, message);
    }
    if let Some(credentials) = credentials_error(&err) {
        return match credentials {
            CredentialsError::CredentialsNotLoaded(_)
            | CredentialsError::InvalidConfiguration(_) => CloudError::PermissionDenied(format!(
                "{action}: no usable AWS credentials: {}",
                DisplayErrorContext(credentials)
            )),
            _ => CloudError::Unavailable(format!(
                "{action}: AWS credentials could not be loaded: {}",
                DisplayErrorContext(credentials)
            )),
        };
    }
    match err {
        SdkError::TimeoutError(_) => CloudError::Unavailable(format!("{action}: timed out")),
        SdkError::ConstructionFailure(_) => CloudError::Internal(format!(
            "{action}: the request could not be built: {}",
            DisplayErrorContext(&err)
        )),
        other => CloudError::Unavailable(format!("{action}: {}", DisplayErrorContext(&other))),
    }
}

/// Maps an error code AWS answered with.
pub(super) fn classify(action: &str, code: &str, message: &str) -> CloudError {
    if THROTTLING.contains(&code) {
        CloudError::Throttled {
            retry_after: THROTTLE_PAUSE,
        }
    } else if REFUSED.contains(&code) {
        CloudError::PermissionDenied(format!("{action}: {code}: {message}"))
    } else if QUOTA.contains(&code) {
        CloudError::QuotaExceeded(format!(
            "{action}: {code}: {message}; raise the account's quota or free some"
        ))
    } else if INVALID.contains(&code) {
        CloudError::invalid(
            "spec",
            format!("AWS refused it: {action}: {code}: {message}"),
        )
    } else {
        // Internal errors, unavailability and codes we do not know: nothing
        // is known about the resource, so the caller may retry.
        CloudError::Unavailable(format!("{action}: {code}: {message}"))
    }
}

/// A step that waits on a load balancer being made or taken down: the
/// caller schedules the retry.
pub(super) fn provisioning(message: String) -> CloudError {
    CloudError::Provisioning {
        retry_after: PROVISIONING_RETRY,
        message,
    }
}

/// The credentials error somewhere in `err`'s chain of sources.
fn credentials_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a CredentialsError> {
    let mut source: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(found) = e.downcast_ref::<CredentialsError>() {
            return Some(found);
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_codes_slow_the_budget_down() {
        for code in ["RequestLimitExceeded", "Throttling", "ThrottlingException"] {
            assert!(
                matches!(
                    classify("DescribeInstances", code, "slow down"),
                    CloudError::Throttled { .. }
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn refused_credentials_are_permission_errors_never_not_found() {
        for code in ["UnauthorizedOperation", "AuthFailure", "ExpiredToken"] {
            let err = classify("DescribeInstances", code, "no");
            assert!(matches!(err, CloudError::PermissionDenied(_)), "{code}");
        }
    }

    #[test]
    fn unknown_and_server_codes_are_unavailable() {
        for code in ["InternalError", "Unavailable", "SomethingNew"] {
            let err = classify("DescribeInstances", code, "oops");
            assert!(matches!(err, CloudError::Unavailable(_)), "{code}");
        }
    }
}
