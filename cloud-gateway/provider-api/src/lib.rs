//! The provider API: what a cloud implements to sit behind the cloud
//! gateway. One trait, [`Provider`], with an optional capability per
//! upstream interface ([`Instances`], [`LoadBalancers`], [`Routes`]),
//! Cluster Autoscaler's node groups ([`NodeGroups`]) and a CSI controller's
//! volumes ([`Volumes`]), in
//! plain Rust values ([`types`]) the gateway has already checked; the
//! [`CloudError`] every call returns; the [`Operation`] names used for
//! metrics, the audit log and sim faults; and the request meter
//! ([`count_api_request`]) a provider uses when one call sends several API
//! requests. No gRPC, no server, no settings: a vendor's crate depends on
//! this one alone and is linked into the stock gateway (see the
//! `cloud-gateway` crate's `Gateway::start_with`).

mod error;
mod meter;
pub mod node_groups;
mod operation;
pub mod types;
pub mod volumes;
/// The forms an operator's values take (durations, quoting), the same in
/// every binary's settings and every provider's annotations.
pub use ccm_values as values;

use async_trait::async_trait;

pub use error::{CloudError, Result};
pub use meter::{count_api_request, metered};
pub use node_groups::NodeGroups;
pub use operation::Operation;
pub use types::{
    AddressType, Host, Ingress, Instance, IpFamily, LoadBalancer, LoadBalancerSpec,
    LoadBalancerStatus, Lookup, NodeAddress, NodeRef, PortStatus, Protocol, Route, ServicePort,
    ServiceRef, SessionAffinity, TagOutcome, TrafficPolicy, load_balancer_name,
    load_balancer_names, own_load_balancer_name,
};
pub use values::host_limits::HostLimits;
pub use values::{parse_duration, quote};
pub use volumes::Volumes;

/// A cloud behind the gateway. Each capability is optional; the gateway
/// answers `UNIMPLEMENTED` for a missing one. The gateway calls a provider
/// only through its budget, metrics and audit log, so a provider never
/// rate-limits or counts its own calls.
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

    /// Node groups Cluster Autoscaler scales, if supported (none unless a
    /// provider says so).
    fn node_groups(&self) -> Option<&dyn NodeGroups> {
        None
    }

    /// Block volumes and snapshots, if supported (none unless a provider
    /// says so).
    fn volumes(&self) -> Option<&dyn Volumes> {
        None
    }

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

    /// Whether `provider_id`, without this provider's scheme, is one of
    /// its forms all the same (AWS takes a bare `i-…`, as upstream does).
    /// None by default: an ID without the scheme is another cloud's.
    fn accepts_bare_provider_id(&self, _provider_id: &str) -> bool {
        false
    }

    /// Whether [`Self::tag_instances`] is served.
    fn tags_instances(&self) -> bool {
        false
    }

    /// Adds `tags` to `cluster`'s instances behind `nodes` (each by
    /// provider ID, not checked before: one this provider cannot tag is
    /// `NotTaggable`), or with `remove` takes away each tag that still has
    /// its value; one answer per node, in order. `NotFound` only on a
    /// definite answer.
    async fn tag_instances(
        &self,
        _cluster: &str,
        _nodes: &[NodeRef],
        _tags: &std::collections::BTreeMap<String, String>,
        _remove: bool,
    ) -> Result<Vec<TagOutcome>> {
        Err(CloudError::NotImplemented("instance tags"))
    }
}

/// Load balancers (upstream LoadBalancer). Every method is idempotent.
///
/// A load balancer is one Service's: a provider finds a Service's by its
/// own record of the Service (its tags), never by name alone, and never
/// changes or deletes one that another Service holds. Names come from
/// [`load_balancer_names`]: upstream's, or the Service's own where
/// another Service's load balancer holds upstream's.
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

    /// The cloud's limits on a load balancer's hosts, one entry per kind
    /// (none by default). The gateway asks once and keeps the answer; an
    /// ensure or host update past them must be refused before any write
    /// ([`HostLimits::check`]).
    async fn host_limits(&self) -> Result<Vec<HostLimits>> {
        Ok(Vec::new())
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
    fn two_uids_alike_in_31_digits_share_upstreams_name_but_never_their_own() {
        let first = "36300001-0000-0000-0000-000000000001";
        let second = "36300001-0000-0000-0000-000000000002";
        assert_eq!(load_balancer_name(first), load_balancer_name(second));
        let [a, own_a] = load_balancer_names(first);
        let [_, own_b] = load_balancer_names(second);
        assert_ne!(own_a, own_b);
        assert_ne!(own_a, a);
        assert_eq!(own_a.len(), 32);
        assert!(own_a.starts_with("a36300001000000000000"), "{own_a}");
        // Fixed for good: a load balancer made under it is found by it.
        assert_eq!(own_a, "a3630000100000000000000-1e7d5197");
    }

    #[test]
    fn a_listed_load_balancer_serves_the_service_of_its_uid_or_upstreams_name() {
        let svc = |ns: &str, name: &str, uid: &str| ServiceRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        };
        let first = svc("default", "first", "36300001-0000-0000-0000-000000000001");
        let second = svc("default", "second", "36300001-0000-0000-0000-000000000002");
        let tagged = LoadBalancer {
            name: load_balancer_name(&first.uid),
            service: first.clone(),
            ..Default::default()
        };
        assert!(tagged.serves(&first));
        assert!(!tagged.serves(&second), "same name, another UID");
        let upstreams = LoadBalancer {
            service: svc("default", "first", ""),
            ..tagged.clone()
        };
        assert!(upstreams.serves(&first));
        assert!(!upstreams.serves(&second));
        assert!(!upstreams.serves(&svc(
            "default",
            "first",
            "99999999-0000-0000-0000-000000000001"
        )));
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
