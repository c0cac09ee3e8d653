//! The node controller's metrics, under `node_controller_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use ccm_runtime::metrics::{ErrorCounts, ErrorLabels};
use ccm_runtime::metrics::{Listed, slo_buckets};
use ccm_runtime::queue::QueueMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayLabels {
    pub operation: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: &'static str,
}

/// Every metric of the node controller.
/// A kubelet serving CSR's decision and its reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CsrLabels {
    pub decision: &'static str,
    pub reason: &'static str,
}

#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub reconcile_errors: ErrorCounts,
    pub reconcile_duration: Histogram,
    pub taint_removal_delay: Histogram,
    pub gateway_calls: Family<GatewayLabels, Counter>,
    pub address_updates: Counter,
    pub nodes_deleted: Counter,
    pub deletions_held_back: Counter,
    pub shutdown_taints: Family<ActionLabels, Counter>,
    pub instance_tags: Family<ActionLabels, Counter>,
    pub serving_csrs: Family<CsrLabels, Counter>,
    pub queue: QueueMetrics,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("node_controller");
        let m = Self {
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            // Upstream's buckets start at 1 s, where all of ours would land.
            taint_removal_delay: Histogram::new(slo_buckets()),
            gateway_calls: Family::default(),
            address_updates: Counter::default(),
            nodes_deleted: Counter::default(),
            deletions_held_back: Counter::default(),
            shutdown_taints: Family::default(),
            instance_tags: Family::default(),
            serving_csrs: Family::default(),
            queue: QueueMetrics::register(r),
        };
        r.register(
            "serving_csr_decisions",
            "Kubelet serving CSRs approved, denied (by reason) or left waiting",
            m.serving_csrs.clone(),
        );
        r.register(
            "instance_tags",
            "Instances tagged, untagged, not found, not taggable, or failed (the tagging controller)",
            m.instance_tags.clone(),
        );
        r.register("reconciles", "Node syncs run", m.reconciles.clone());
        r.register(
            "reconcile_errors",
            "Node syncs failed, by error",
            Listed(m.reconcile_errors.clone()),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time per node sync (nodes initialised together each count the whole batch)",
            m.reconcile_duration.clone(),
        );
        r.register(
            "taint_removal_delay_seconds",
            "Time from a node's creation to the removal of its uninitialized taint",
            m.taint_removal_delay.clone(),
        );
        r.register(
            "gateway_calls",
            "Gateway calls, by operation and outcome",
            Listed(m.gateway_calls.clone()),
        );
        r.register(
            "address_updates",
            "Node address lists rewritten",
            m.address_updates.clone(),
        );
        r.register(
            "nodes_deleted",
            "Nodes deleted because their instance is gone",
            m.nodes_deleted.clone(),
        );
        r.register(
            "deletions_held_back",
            "Lifecycle passes whose deletions were held back by the safeguard",
            m.deletions_held_back.clone(),
        );
        r.register(
            "shutdown_taints",
            "Shutdown taints added or removed",
            Listed(m.shutdown_taints.clone()),
        );
        m
    }
}
