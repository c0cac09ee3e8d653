//! The one path from the gRPC services to the provider: every cloud call
//! takes a token from the shared budget, is timed and counted by operation
//! and outcome, feeds throttling answers back into the budget, and, when it
//! changes the cloud, leaves an audit log line.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::budget::{Budget, Priority};
use crate::metrics::{CloudLabels, Metrics, OperationLabels, PriorityLabels};
use crate::provider::{self, CloudError, Operation, Provider, Result};

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
}

impl Cloud {
    /// Wraps `provider`.
    pub fn new(provider: Arc<dyn Provider>, budget: Arc<Budget>, metrics: Metrics) -> Self {
        Self {
            provider,
            budget,
            metrics,
        }
    }

    /// The provider, for capability checks and building calls.
    pub fn provider(&self) -> &dyn Provider {
        &*self.provider
    }

    /// The budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs one provider call `call` for `op` at `priority`.
    pub async fn call<T>(
        &self,
        op: Operation,
        priority: Priority,
        audit: Option<Audit<'_>>,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.admit(priority).await?;
        self.call_admitted(op, audit, call).await
    }

    /// Takes one call's worth of budget at `priority`, waiting as the budget
    /// says. Follow it with exactly one [`Self::call_admitted`].
    #[tracing::instrument(target = "ccm_calls", name = "budget wait", skip(self), fields(priority = priority.as_str(), waited_ms))]
    pub async fn admit(&self, priority: Priority) -> Result<()> {
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
        Ok(())
    }

    /// Runs a provider call whose budget [`Self::admit`] already took.
    #[tracing::instrument(
        target = "ccm_calls",
        name = "provider call",
        skip_all,
        fields(operation = op.as_str(), requests, outcome)
    )]
    pub async fn call_admitted<T>(
        &self,
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
