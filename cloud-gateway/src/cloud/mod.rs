//! The one path from the gRPC services to the provider: every cloud call
//! takes a token from the shared budget, is timed and counted by operation
//! and outcome, feeds throttling answers back into the budget, and, when it
//! changes the cloud, leaves an audit log line. The compiler keeps it the
//! one path: [`Cloud`] holds the provider privately and hands a capability
//! only to a closure run inside [`Capability::call`], after the budget
//! admitted it; the readiness check goes through the budget too.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use ccm_provider::volumes::VolumeOffer;
use ccm_provider::{
    self as provider, CloudError, Instances, LoadBalancers, NodeGroups, Operation, Provider,
    Result, Routes, Volumes,
};

pub mod budget;
pub mod calls;
pub mod instance_lookups;
pub mod load_balancer_reads;
pub mod node_group_snapshots;
pub mod one_at_a_time;
pub mod volume_reads;

use self::budget::{Budget, Priority};
use crate::metrics::{CloudLabels, Metrics, OperationLabels, PriorityLabels};

/// Who asked, for the audit log.
#[derive(Clone, Debug)]
pub struct Audit<'a> {
    /// The caller's identity (never its token).
    pub caller: &'a str,
    /// The cluster the call is for.
    pub cluster: &'a str,
    /// The resource touched, e.g. `load_balancer/a1b2...`.
    pub resource: &'a str,
}

/// The provider behind the budget, metrics and audit log.
pub struct Cloud {
    provider: Arc<dyn Provider>,
    budget: Arc<Budget>,
    metrics: Metrics,
    calls: calls::CallLog,
    /// The provider's limits on load balancer hosts, once asked.
    host_limits: tokio::sync::OnceCell<Vec<ccm_provider::HostLimits>>,
}

impl Cloud {
    /// Wraps `provider`.
    pub fn new(provider: Arc<dyn Provider>, budget: Arc<Budget>, metrics: Metrics) -> Self {
        Self {
            provider,
            budget,
            metrics,
            calls: calls::CallLog::default(),
            host_limits: tokio::sync::OnceCell::new(),
        }
    }

    /// Recent calls per object and the provider's last errors.
    pub fn calls(&self) -> &calls::CallLog {
        &self.calls
    }

    /// The provider's name, the scheme of its provider IDs.
    pub fn name(&self) -> &str {
        self.provider.name()
    }

    /// Which capabilities the provider offers.
    pub fn offers(&self) -> Offers {
        Offers {
            instances: self.provider.instances().is_some(),
            load_balancers: self.provider.load_balancers().is_some(),
            routes: self.provider.routes().is_some(),
            node_groups: self.provider.node_groups().is_some(),
            volumes: self.provider.volumes().is_some(),
            instance_tags: self
                .provider
                .instances()
                .is_some_and(|i| i.tags_instances()),
            host_label_annotations: self
                .provider
                .load_balancers()
                .map(|lb| lb.host_label_annotations())
                .unwrap_or_default(),
        }
    }

    /// The provider's own check of a provider ID (no cloud call).
    pub fn check_provider_id(&self, provider_id: &str) -> std::result::Result<(), String> {
        self.provider
            .instances()
            .map_or(Ok(()), |i| i.check_provider_id(provider_id))
    }

    /// Whether the provider takes `provider_id` without its scheme.
    pub fn accepts_bare_provider_id(&self, provider_id: &str) -> bool {
        self.provider
            .instances()
            .is_some_and(|i| i.accepts_bare_provider_id(provider_id))
    }

    /// The budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Instance lookups; `NotImplemented` when the provider has none.
    pub fn instances(&self) -> Result<Capability<'_, dyn Instances + '_>> {
        self.capability(self.provider.instances(), "instances")
    }

    /// Load balancers; `NotImplemented` when the provider has none.
    pub fn load_balancers(&self) -> Result<Capability<'_, dyn LoadBalancers + '_>> {
        self.capability(self.provider.load_balancers(), "load balancers")
    }

    /// Routes; `NotImplemented` when the provider has none.
    pub fn routes(&self) -> Result<Capability<'_, dyn Routes + '_>> {
        self.capability(self.provider.routes(), "routes")
    }

    /// Node groups; `NotImplemented` when the provider has none.
    pub fn node_groups(&self) -> Result<Capability<'_, dyn NodeGroups + '_>> {
        self.capability(self.provider.node_groups(), "node groups")
    }

    /// Volumes; `NotImplemented` when the provider has none.
    pub fn volumes(&self) -> Result<Capability<'_, dyn Volumes + '_>> {
        self.capability(self.provider.volumes(), "volumes")
    }

    /// What the provider's volumes are (no cloud call); `None` without
    /// volumes.
    pub fn volume_offer(&self) -> Option<VolumeOffer> {
        self.provider.volumes().map(|v| v.offer())
    }

    /// The provider's GPU label and types (no cloud call); `None` without
    /// node groups.
    pub fn gpus(&self) -> Option<(&'static str, Vec<String>)> {
        self.provider
            .node_groups()
            .map(|g| (g.gpu_label(), g.gpu_types()))
    }

    fn capability<'a, C: ?Sized>(
        &'a self,
        capability: Option<&'a C>,
        name: &'static str,
    ) -> Result<Capability<'a, C>> {
        Ok(Capability {
            cloud: self,
            capability: capability.ok_or(CloudError::NotImplemented(name))?,
        })
    }

    /// The cloud's limits on load balancer hosts: asked of the provider
    /// once, at low priority through the budget, and kept (a failed ask is
    /// not kept). None without load balancers.
    pub async fn host_limits(&self) -> Result<&[ccm_provider::HostLimits]> {
        let Some(lbs) = self.provider.load_balancers() else {
            return Ok(&[]);
        };
        self.host_limits
            .get_or_try_init(|| async {
                let admitted = self.admit(Priority::Low).await?;
                self.run(
                    admitted,
                    Operation::LoadBalancerLimits,
                    None,
                    lbs.host_limits(),
                )
                .await
            })
            .await
            .map(Vec::as_slice)
    }

    /// The provider's readiness check (credentials valid, API reachable),
    /// at low priority through the budget like any other call.
    pub async fn check(&self) -> Result<()> {
        let admitted = self.admit(Priority::Low).await?;
        self.run(admitted, Operation::Check, None, self.provider.check())
            .await
    }

    /// Takes one call's worth of budget at `priority`, waiting as the budget
    /// says; the answer is spent by one [`Capability::call_admitted`].
    #[tracing::instrument(target = "ccm_calls", name = "budget wait", skip(self), fields(priority = priority.as_str(), waited_ms))]
    pub async fn admit(&self, priority: Priority) -> Result<Admitted> {
        let priority_labels = PriorityLabels {
            priority: priority.as_str(),
        };
        self.metrics
            .budget_waiting
            .set(self.budget.waiting() as i64);
        match self.budget.acquire(priority).await {
            Ok(waited) => {
                tracing::Span::current().record("waited_ms", waited.as_secs_f64() * 1000.0);
                self.metrics
                    .budget_wait
                    .get_or_create(&priority_labels)
                    .observe(waited.as_secs_f64());
            }
            Err(exhausted) => {
                self.metrics
                    .budget_rejected
                    .get_or_create(&priority_labels)
                    .inc();
                return Err(CloudError::BudgetExhausted {
                    retry_after: exhausted.retry_after,
                });
            }
        }
        Ok(Admitted(()))
    }

    /// Runs a provider call whose budget [`Self::admit`] took.
    #[tracing::instrument(
        target = "ccm_calls",
        name = "provider call",
        skip_all,
        fields(operation = op.as_str(), requests, outcome)
    )]
    async fn run<T>(
        &self,
        _admitted: Admitted,
        op: Operation,
        audit: Option<Audit<'_>>,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let start = Instant::now();
        let (result, requests) = provider::metered(call).await;
        tracing::Span::current().record("requests", requests);
        let elapsed = start.elapsed();
        // The call was admitted for one request; the rest are charged now.
        self.budget.charge(requests - 1);
        self.metrics
            .cloud_requests
            .get_or_create(&OperationLabels {
                operation: op.as_str(),
            })
            .inc_by(u64::from(requests));
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        };
        if let Err(e) = &result {
            self.calls.provider_error(calls::ProviderError {
                at: std::time::SystemTime::now(),
                operation: op.as_str(),
                outcome,
                message: e.to_string(),
            });
        }
        tracing::Span::current().record("outcome", outcome);
        self.metrics
            .cloud_calls
            .get_or_create(&CloudLabels {
                operation: op.as_str(),
                outcome,
            })
            .inc();
        self.metrics
            .cloud_duration
            .get_or_create(&OperationLabels {
                operation: op.as_str(),
            })
            .observe(elapsed.as_secs_f64());
        if let Err(CloudError::Throttled { retry_after }) = &result {
            self.metrics.budget_throttled.inc();
            self.budget.throttled(*retry_after);
        }
        if let Some(audit) = audit.filter(|_| op.is_mutating()) {
            tracing::info!(
                target: "audit",
                operation = op.as_str(),
                caller = audit.caller,
                cluster = audit.cluster,
                resource = audit.resource,
                outcome,
                latency_ms = elapsed.as_millis() as u64,
                "cloud write"
            );
        }
        result
    }
}

/// What a provider offers, for `GetProviderInfo`.
#[derive(Clone, Copy, Debug)]
pub struct Offers {
    /// Instance lookups.
    pub instances: bool,
    /// Load balancers.
    pub load_balancers: bool,
    /// Routes.
    pub routes: bool,
    /// Node groups for Cluster Autoscaler.
    pub node_groups: bool,
    /// Volumes.
    pub volumes: bool,
    /// Instance tags.
    pub instance_tags: bool,
    /// Service annotations that select hosts by Node label.
    pub host_label_annotations: &'static [&'static str],
}

/// The budget's word that one call may go ahead; only [`Cloud::admit`]
/// gives one, and one call spends it.
#[must_use = "an admitted call is charged to the budget"]
#[derive(Debug)]
pub struct Admitted(());

/// One capability of the provider, reachable only through its calls.
pub struct Capability<'a, C: ?Sized> {
    cloud: &'a Cloud,
    capability: &'a C,
}

impl<'a, C: ?Sized> Capability<'a, C> {
    /// Runs `call` on the capability for `op` at `priority`, once the
    /// budget admits it.
    pub async fn call<T, F>(
        &self,
        op: Operation,
        priority: Priority,
        audit: Option<Audit<'_>>,
        call: impl FnOnce(&'a C) -> F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let admitted = self.cloud.admit(priority).await?;
        self.call_admitted(admitted, op, audit, call).await
    }

    /// Runs `call` on the capability for `op` with budget already taken.
    pub async fn call_admitted<T, F>(
        &self,
        admitted: Admitted,
        op: Operation,
        audit: Option<Audit<'_>>,
        call: impl FnOnce(&'a C) -> F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        self.cloud
            .run(admitted, op, audit, call(self.capability))
            .await
    }
}
