//! The route controller's metrics, under `route_controller_`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use ccm_runtime::metrics::{ErrorCounts, ErrorLabels};
use ccm_runtime::metrics::{Listed, slo_buckets};
use ccm_runtime::queue::QueueMetrics;

/// Every metric of the route controller.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub reconcile_errors: ErrorCounts,
    pub reconcile_duration: Histogram,
    pub routes_created: Counter,
    pub routes_deleted: Counter,
    pub route_errors: ErrorCounts,
    pub route_creation_delay: Histogram,
    pub queue: QueueMetrics,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("route_controller");
        let m = Self {
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            routes_created: Counter::default(),
            routes_deleted: Counter::default(),
            route_errors: Family::default(),
            route_creation_delay: Histogram::new(slo_buckets()),
            queue: QueueMetrics::register(r),
        };
        r.register(
            "route_syncs",
            "Route reconciles run (upstream: route_sync_total)",
            m.reconciles.clone(),
        );
        r.register(
            "reconcile_errors",
            "Route reconciles failed, by error",
            Listed(m.reconcile_errors.clone()),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time per route reconcile",
            m.reconcile_duration.clone(),
        );
        r.register("routes_created", "Routes created", m.routes_created.clone());
        r.register("routes_deleted", "Routes deleted", m.routes_deleted.clone());
        r.register(
            "route_errors",
            "Route creates and deletes that failed, by error",
            Listed(m.route_errors.clone()),
        );
        r.register(
            "route_creation_delay_seconds",
            "Time from a node's pod CIDR first seen without its route to the route created",
            m.route_creation_delay.clone(),
        );
        m
    }
}
