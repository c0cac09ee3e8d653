//! The service controller's metrics, under `service_controller_`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use ccm_runtime::metrics::{ErrorCounts, ErrorLabels};
use ccm_runtime::metrics::{Listed, slo_buckets};
use ccm_runtime::queue::QueueMetrics;

/// Every metric of the service controller.
#[derive(Clone)]
pub struct Metrics {
    pub syncs: Counter,
    pub sync_errors: ErrorCounts,
    pub sync_duration: Histogram,
    pub time_to_ingress: Histogram,
    pub change_to_ingress: Histogram,
    pub host_sync_delay: Histogram,
    pub host_updates: Counter,
    pub host_update_errors: Counter,
    pub takeovers_confirmed: Counter,
    pub orphans: Gauge,
    pub orphans_deleted: Counter,
    pub queue: QueueMetrics,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("service_controller");
        let m = Self {
            syncs: Counter::default(),
            sync_errors: Family::default(),
            sync_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            time_to_ingress: Histogram::new(slo_buckets()),
            change_to_ingress: Histogram::new(slo_buckets()),
            host_sync_delay: Histogram::new(slo_buckets()),
            host_updates: Counter::default(),
            host_update_errors: Counter::default(),
            takeovers_confirmed: Counter::default(),
            orphans: Gauge::default(),
            orphans_deleted: Counter::default(),
            queue: QueueMetrics::register(r),
        };
        r.register("syncs", "Service syncs run", m.syncs.clone());
        r.register(
            "sync_errors",
            "Service syncs failed, by error",
            Listed(m.sync_errors.clone()),
        );
        r.register(
            "sync_duration_seconds",
            "Time per Service sync",
            m.sync_duration.clone(),
        );
        r.register(
            "time_to_ingress_seconds",
            "Time from a Service's creation to its first ingress",
            m.time_to_ingress.clone(),
        );
        r.register(
            "change_to_ingress_seconds",
            "Time from a LoadBalancer Service's change (its creation included) seen by the controller to its load balancer ensured and ingress written",
            m.change_to_ingress.clone(),
        );
        r.register(
            "host_sync_delay_seconds",
            "Time from a node change to the end of the host pass that gave every load balancer its new hosts (passes with a failed update are not counted)",
            m.host_sync_delay.clone(),
        );
        r.register(
            "host_updates",
            "Load balancer host updates sent",
            m.host_updates.clone(),
        );
        r.register(
            "host_update_errors",
            "Load balancer host updates that failed",
            m.host_update_errors.clone(),
        );
        r.register(
            "ensures_skipped",
            "Services whose recorded load balancer the cloud confirmed when a new term began, so no ensure was sent",
            m.takeovers_confirmed.clone(),
        );
        r.register(
            "orphaned_load_balancers",
            "This cluster's load balancers without a Service",
            m.orphans.clone(),
        );
        r.register(
            "orphans_deleted",
            "Orphaned load balancers deleted",
            m.orphans_deleted.clone(),
        );
        m
    }
}
