//! The provider trait a cloud implements, one optional capability per
//! upstream interface (instances, load balancers, routes), and the error
//! type every provider returns. Data crosses the trait in the wire types of
//! `cloudgateway.v1`, already validated by the gRPC layer.

#[cfg(feature = "aws")]
pub mod aws;
pub mod sim;

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use ccm_proto::v1::{
    Host, Instance, LoadBalancer, LoadBalancerSpec, LoadBalancerStatus, NodeRef, Route, ServiceRef,
};

/// A convenient alias for provider results.
pub type Result<T, E = CloudError> = std::result::Result<T, E>;

/// What went wrong in a cloud call. `grpc::status` maps it to a gRPC
/// status, in that one place.
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
        }
    }
}

/// Every cloud operation the gateway performs. The name is the metric
/// label, the audit log's `operation`, and the key of sim latency faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    /// A batch of instance lookups.
    GetInstances,
    /// Read one load balancer.
    GetLoadBalancer,
    /// Create or update a load balancer.
    EnsureLoadBalancer,
    /// Replace a load balancer's hosts.
    UpdateLoadBalancerHosts,
    /// Delete a load balancer.
    DeleteLoadBalancer,
    /// List a cluster's load balancers.
    ListLoadBalancers,
    /// List a cluster's routes.
    ListRoutes,
    /// Create a route.
    CreateRoute,
    /// Delete a route.
    DeleteRoute,
}

impl Operation {
    /// Every operation, for listing accepted values.
    pub const ALL: [Operation; 9] = [
        Self::GetInstances,
        Self::GetLoadBalancer,
        Self::EnsureLoadBalancer,
        Self::UpdateLoadBalancerHosts,
        Self::DeleteLoadBalancer,
        Self::ListLoadBalancers,
        Self::ListRoutes,
        Self::CreateRoute,
        Self::DeleteRoute,
    ];

    /// The operation's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GetInstances => "get_instances",
            Self::GetLoadBalancer => "get_load_balancer",
            Self::EnsureLoadBalancer => "ensure_load_balancer",
            Self::UpdateLoadBalancerHosts => "update_load_balancer_hosts",
            Self::DeleteLoadBalancer => "delete_load_balancer",
            Self::ListLoadBalancers => "list_load_balancers",
            Self::ListRoutes => "list_routes",
            Self::CreateRoute => "create_route",
            Self::DeleteRoute => "delete_route",
        }
    }

    /// Whether the operation changes the cloud (and is audit-logged).
    pub fn is_mutating(self) -> bool {
        matches!(
            self,
            Self::EnsureLoadBalancer
                | Self::UpdateLoadBalancerHosts
                | Self::DeleteLoadBalancer
                | Self::CreateRoute
                | Self::DeleteRoute
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Operation {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|op| op.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|op| op.as_str()).collect();
                format!("unknown operation {s:?}; accepted: {}", names.join(", "))
            })
    }
}

tokio::task_local! {
    static API_REQUESTS: Cell<u32>;
}

/// Counts one request a provider sent to its cloud's API. A provider whose
/// calls may take several requests calls it once per request (the AWS
/// provider from an SDK interceptor), so the budget is charged for each.
pub fn count_api_request() {
    let _ = API_REQUESTS.try_with(|n| n.set(n.get().saturating_add(1)));
}

/// Runs one provider call and returns its output with the number of API
/// requests it sent: at least one, for providers that do not count.
pub async fn metered<T>(call: impl Future<Output = T>) -> (T, u32) {
    API_REQUESTS
        .scope(Cell::new(0), async {
            let out = call.await;
            (out, API_REQUESTS.with(Cell::get).max(1))
        })
        .await
}

/// What the cloud says about one looked-up node.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// The instance exists and runs.
    Running(Instance),
    /// The instance exists but is shut down.
    Shutdown(Instance),
    /// The cloud confirmed there is no such instance.
    NotFound,
}

/// A cloud behind the gateway. Each capability is optional; the gateway
/// answers `UNIMPLEMENTED` for a missing one.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The provider's name; its provider IDs start with `<name>://`.
    fn name(&self) -> &str;

    /// Instance metadata, if supported.
    fn instances(&self) -> Option<&dyn Instances>;

    /// Load balancers, if supported.
    fn load_balancers(&self) -> Option<&dyn LoadBalancers>;

    /// Routes, if supported.
    fn routes(&self) -> Option<&dyn Routes>;

    /// Succeeds when the provider can serve (credentials valid, API
    /// reachable); gates the gateway's readiness.
    async fn check(&self) -> Result<()>;
}

/// Instance lookups (upstream InstancesV2).
#[async_trait]
pub trait Instances: Send + Sync {
    /// Looks up every node, by provider ID when set, else by name; one
    /// answer per node, in order. `NotFound` only on a definite answer.
    async fn get_instances(&self, nodes: &[NodeRef]) -> Result<Vec<Lookup>>;

    /// Checks a provider ID (which starts with `<name>://`) before any
    /// lookup, so a malformed one is `INVALID_ARGUMENT` for its caller
    /// alone and never fails a batch it shares with others.
    fn check_provider_id(&self, _provider_id: &str) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Load balancers (upstream LoadBalancer). Every method is idempotent.
#[async_trait]
pub trait LoadBalancers: Send + Sync {
    /// The status of the Service's load balancer, `None` when none exists.
    async fn get(&self, cluster: &str, service: &ServiceRef) -> Result<Option<LoadBalancerStatus>>;

    /// Creates or updates the load balancer.
    async fn ensure(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<LoadBalancerStatus>;

    /// Replaces the hosts of an existing load balancer.
    async fn update_hosts(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<()>;

    /// Deletes the load balancer; `Ok` when it is already gone.
    async fn delete(&self, cluster: &str, service: &ServiceRef) -> Result<()>;

    /// Every load balancer of the cluster.
    async fn list(&self, cluster: &str) -> Result<Vec<LoadBalancer>>;

    /// Service annotations that select backend hosts by Node label; the
    /// controller then sends the labels they name in `Host.labels`.
    fn host_label_annotations(&self) -> &'static [&'static str] {
        &[]
    }
}

/// Routes (upstream Routes).
#[async_trait]
pub trait Routes: Send + Sync {
    /// Every route of the cluster.
    async fn list(&self, cluster: &str) -> Result<Vec<Route>>;

    /// Creates a route; the same target and destination again returns the
    /// existing one.
    async fn create(&self, cluster: &str, name_hint: &str, route: &Route) -> Result<Route>;

    /// Deletes a route; `Ok` when it is already gone.
    async fn delete(&self, cluster: &str, route: &Route) -> Result<()>;
}

/// The load balancer name upstream derives from a Service UID: "a" and the
/// UID without dashes, cut to 32 characters.
pub fn load_balancer_name(service_uid: &str) -> String {
    let mut name: String = std::iter::once('a')
        .chain(service_uid.chars().filter(|c| *c != '-'))
        .collect();
    name.truncate(32);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_balancer_name_matches_upstream() {
        assert_eq!(
            load_balancer_name("1234abcd-12ab-34cd-56ef-1234567890ab"),
            "a1234abcd12ab34cd56ef1234567890a"
        );
        let short = load_balancer_name("ab-cd");
        assert_eq!(short, "aabcd");
    }

    #[test]
    fn operations_round_trip_through_their_names() {
        for op in Operation::ALL {
            assert_eq!(op.as_str().parse::<Operation>(), Ok(op));
        }
        let err = "bogus".parse::<Operation>().unwrap_err();
        assert!(err.contains("get_instances"), "{err}");
    }
}
