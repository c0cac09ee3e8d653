//! Kubelet serving certificates approved on the cloud's word (off unless
//! `--approve-kubelet-serving-csrs`): each pending CSR of the signer
//! `kubernetes.io/kubelet-serving` is judged by `csr` (the request on its
//! own, then its addresses and names against a fresh gateway lookup of the
//! node's instance, batched with the other CSRs waiting) and approved or
//! denied through its `approval` subresource, with an event and a metric.
//! A CSR of any other signer is never touched; one whose node or cloud
//! cannot answer yet stays pending and is asked about again later. Only
//! the leader decides (see `worker`).

pub mod worker;

use std::time::Duration;

use ccm_runtime::queue::{Backoff, WorkQueue};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use kube::runtime::reflector::Store;

use crate::csr;

/// Undecided CSRs are asked about again after 5 s, doubling up to 5
/// minutes.
const BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(5),
    max: Duration::from_secs(300),
};

/// The CSRs, their cache and the work waiting.
pub struct ServingCsrs {
    pub api: Api<CertificateSigningRequest>,
    pub store: Store<CertificateSigningRequest>,
    pub queue: WorkQueue<String>,
}

impl ServingCsrs {
    pub fn new(
        api: Api<CertificateSigningRequest>,
        store: Store<CertificateSigningRequest>,
    ) -> Self {
        Self {
            api,
            store,
            queue: WorkQueue::new(BACKOFF),
        }
    }
}

/// Whether `c` is a kubelet serving CSR still waiting for a decision.
pub fn is_pending(c: &CertificateSigningRequest) -> bool {
    let decided = c.status.as_ref().is_some_and(|s| {
        s.certificate.is_some()
            || s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Approved" || c.type_ == "Denied" || c.type_ == "Failed")
    });
    c.spec.signer_name == csr::SIGNER && !decided
}
