//! The one place where a [`CloudError`] becomes a gRPC [`Status`], with the
//! machine-readable reason, retry delay and field violations as standard
//! `google.rpc` error details. The client maps them back in
//! `ccm_proto::error`.

use std::future::Future;

use ccm_proto::reason;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use ccm_provider::CloudError;

use crate::cloud::budget::Priority;
use crate::cloud::calls::{Call, CallLog};

/// Runs one RPC's work and answers its error as a status.
pub async fn answer<T>(work: impl Future<Output = Result<T, CloudError>>) -> Result<T, Status> {
    work.await.map_err(status)
}

/// Runs one RPC's work for `objects` (`service/<ns>/<name>`,
/// `node/<name>`), remembers its outcome for each in `log`, and answers its
/// error as a status.
pub async fn answer_for<T>(
    log: &CallLog,
    method: &'static str,
    priority: Priority,
    objects: &[String],
    work: impl Future<Output = Result<T, CloudError>>,
) -> Result<T, Status> {
    let started = std::time::Instant::now();
    let result = work.await.map_err(status);
    let (outcome, reason, message, retry_after) = match &result {
        Ok(_) => ("Ok".to_owned(), String::new(), String::new(), None),
        Err(s) => {
            let details = s.get_error_details();
            (
                format!("{:?}", s.code()),
                details
                    .error_info()
                    .map(|i| i.reason.clone())
                    .unwrap_or_default(),
                s.message().to_owned(),
                details.retry_info().and_then(|r| r.retry_delay),
            )
        }
    };
    log.record(
        objects.iter().map(String::as_str),
        Call {
            at: std::time::SystemTime::now(),
            method,
            priority: priority.as_str(),
            outcome,
            reason,
            message,
            retry_after,
            latency: started.elapsed(),
        },
    );
    result
}

/// How the call log names a Service.
pub fn service_object(service: Option<&ccm_proto::v1::ServiceRef>) -> Vec<String> {
    service
        .map(|s| vec![format!("service/{}/{}", s.namespace, s.name)])
        .unwrap_or_default()
}

/// The status for `err`.
pub fn status(err: CloudError) -> Status {
    let message = err.to_string();
    let info = |r: &str| ErrorDetails::with_error_info(r, reason::DOMAIN, []);
    let retry = |r: &str, delay| {
        let mut d = info(r);
        d.set_retry_info(Some(delay));
        d
    };
    let (code, details) = match err {
        CloudError::NotFound(_) => (Code::NotFound, info(reason::NOT_FOUND)),
        CloudError::NotImplemented(_) => (Code::Unimplemented, info(reason::NOT_IMPLEMENTED)),
        CloudError::ImplementedElsewhere(_) => (
            Code::FailedPrecondition,
            info(reason::IMPLEMENTED_ELSEWHERE),
        ),
        CloudError::Provisioning { retry_after, .. } => {
            (Code::Unavailable, retry(reason::PROVISIONING, retry_after))
        }
        CloudError::Throttled { retry_after } => (
            Code::ResourceExhausted,
            retry(reason::CLOUD_THROTTLED, retry_after),
        ),
        CloudError::BudgetExhausted { retry_after } => (
            Code::ResourceExhausted,
            retry(reason::BUDGET_EXHAUSTED, retry_after),
        ),
        CloudError::InvalidArgument(violations) => {
            let mut d = info(reason::INVALID_ARGUMENT);
            for (field, problem) in violations {
                d.add_bad_request_violation(field, problem);
            }
            (Code::InvalidArgument, d)
        }
        CloudError::Conflict(_) => (Code::AlreadyExists, info(reason::CONFLICT)),
        CloudError::PoolExhausted(_) => (
            Code::ResourceExhausted,
            info(reason::ADDRESS_POOL_EXHAUSTED),
        ),
        CloudError::QuotaExceeded(_) => {
            (Code::ResourceExhausted, info(reason::CLOUD_QUOTA_EXCEEDED))
        }
        CloudError::PermissionDenied(_) => (
            Code::PermissionDenied,
            info(reason::CLOUD_PERMISSION_DENIED),
        ),
        CloudError::NotConfigured(_) => {
            (Code::FailedPrecondition, info(reason::CLOUD_NOT_CONFIGURED))
        }
        CloudError::Unavailable(_) => (Code::Unavailable, info(reason::CLOUD_UNAVAILABLE)),
        CloudError::Internal(_) => (Code::Internal, ErrorDetails::new()),
        CloudError::VolumeInUse(_) => (Code::FailedPrecondition, info(reason::VOLUME_IN_USE)),
        CloudError::ZoneMismatch(_) => (Code::FailedPrecondition, info(reason::ZONE_MISMATCH)),
        CloudError::AttachLimit(_) => (Code::ResourceExhausted, info(reason::ATTACH_LIMIT)),
    };
    Status::with_error_details(code, message, details)
}
