//! The gateway's Prometheus metrics, all under `cloud_gateway_`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use ccm_runtime::metrics::Listed;

/// Labels of gRPC request metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// `/package.Service/Method`.
    pub method: String,
    /// The gRPC code name, e.g. `Ok`, `PermissionDenied`.
    pub code: String,
}

/// Labels naming a gRPC method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// `/package.Service/Method`.
    pub method: String,
}

/// Labels of cloud call metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloudLabels {
    /// The operation, e.g. `get_instances`.
    pub operation: &'static str,
    /// `ok` or the error's metric label.
    pub outcome: &'static str,
}

/// Labels naming a cloud operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The operation.
    pub operation: &'static str,
}

/// Labels naming a budget priority class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PriorityLabels {
    /// `high`, `normal` or `low`.
    pub priority: &'static str,
}

/// Labels of the instance cache counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `hit`, `miss` (sent to the cloud) or `merged` (joined a lookup
    /// already on its way); `refresh` counts hits near their expiry that
    /// also queued a background fetch of the instance.
    pub result: &'static str,
}

/// Labels of refused requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// The limit: `in_flight`, `public_in_flight`, `request_bytes`,
    /// `too_large` or `receive_timeout`.
    pub reason: &'static str,
}

/// Labels of TokenReview outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// `accepted`, `refused`, `unavailable` or `limited`.
    pub result: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.25 ms to about 8 s.
    Histogram::new(exponential_buckets(0.00025, 2.0, 16))
}

fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 11))
}

/// Every metric of the gateway.
#[derive(Clone)]
pub struct Metrics {
    pub grpc_requests: Family<RpcLabels, Counter>,
    pub grpc_duration: HistogramFamily<MethodLabels>,
    pub cloud_calls: Family<CloudLabels, Counter>,
    pub cloud_duration: HistogramFamily<OperationLabels>,
    pub cloud_requests: Family<OperationLabels, Counter>,
    pub budget_wait: HistogramFamily<PriorityLabels>,
    pub budget_rejected: Family<PriorityLabels, Counter>,
    pub budget_throttled: Counter,
    pub budget_waiting: Gauge,
    pub instance_cache: Family<CacheLabels, Counter>,
    pub instance_batch_size: Histogram,
    pub connections: Gauge,
    pub connections_refused: Counter,
    pub tls_handshake_failures: Counter,
    pub requests_in_flight: Gauge,
    pub request_bytes_in_flight: Gauge,
    pub requests_refused: Family<RefusalLabels, Counter>,
    pub token_reviews: Family<ReviewLabels, Counter>,
    /// Calls answered per gRPC service (`package.Service`), for
    /// `/debug/status`: the controllers' services beside Cluster
    /// Autoscaler's and any other tool's.
    pub served: Arc<Mutex<BTreeMap<String, Served>>>,
}

/// Calls one gRPC service answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub ok: u64,
    pub failed: u64,
}

/// The most services [`Metrics::served`] keeps: the gateway serves about
/// ten; paths of services it does not have are counted up to this.
const MAX_SERVICES: usize = 32;

impl Metrics {
    /// Counts a call to `method` (`/package.Service/Method`) answered
    /// `ok` or not.
    pub fn count_served(&self, method: &str, ok: bool) {
        let service = method
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or_default();
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        // The service's name is copied only the first time it is seen.
        let full = served.len() >= MAX_SERVICES;
        let entry = match served.get_mut(service) {
            Some(entry) => entry,
            None if full => return,
            None => served.entry(service.to_owned()).or_default(),
        };
        if ok {
            entry.ok += 1;
        } else {
            entry.failed += 1;
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            served: Arc::default(),
            grpc_requests: Family::default(),
            grpc_duration: HistogramFamily::new_with_constructor(latency_histogram),
            cloud_calls: Family::default(),
            cloud_duration: HistogramFamily::new_with_constructor(latency_histogram),
            cloud_requests: Family::default(),
            budget_wait: HistogramFamily::new_with_constructor(latency_histogram),
            budget_rejected: Family::default(),
            budget_throttled: Counter::default(),
            budget_waiting: Gauge::default(),
            instance_cache: Family::default(),
            instance_batch_size: batch_histogram(),
            connections: Gauge::default(),
            connections_refused: Counter::default(),
            tls_handshake_failures: Counter::default(),
            requests_in_flight: Gauge::default(),
            request_bytes_in_flight: Gauge::default(),
            requests_refused: Family::default(),
            token_reviews: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("cloud_gateway");
        r.register(
            "grpc_requests",
            "gRPC requests handled, by method and code",
            Listed(m.grpc_requests.clone()),
        );
        r.register(
            "grpc_request_duration_seconds",
            "gRPC request latency",
            Listed(m.grpc_duration.clone()),
        );
        r.register(
            "cloud_calls",
            "Provider calls, by operation and outcome",
            Listed(m.cloud_calls.clone()),
        );
        r.register(
            "cloud_call_duration_seconds",
            "Provider call latency",
            Listed(m.cloud_duration.clone()),
        );
        r.register(
            "cloud_api_requests",
            "Requests sent to the cloud's API, by operation (one provider call may send several)",
            Listed(m.cloud_requests.clone()),
        );
        r.register(
            "budget_wait_seconds",
            "Time calls waited for the API budget",
            Listed(m.budget_wait.clone()),
        );
        r.register(
            "budget_rejected",
            "Calls refused because the budget was exhausted",
            Listed(m.budget_rejected.clone()),
        );
        r.register(
            "budget_throttled",
            "Throttling answers from the cloud",
            m.budget_throttled.clone(),
        );
        r.register(
            "budget_waiting",
            "Calls waiting for the API budget now",
            m.budget_waiting.clone(),
        );
        r.register(
            "instance_cache",
            "Instance lookups by cache result",
            Listed(m.instance_cache.clone()),
        );
        r.register(
            "instance_batch_size",
            "Instances per provider lookup call",
            m.instance_batch_size.clone(),
        );
        r.register(
            "connections",
            "gRPC connections open now",
            m.connections.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed on arrival because the gateway had its most",
            m.connections_refused.clone(),
        );
        r.register(
            "tls_handshake_failures",
            "Connections closed because their TLS handshake failed or took over 10 s (plaintext callers, untrusted or expired client certificates)",
            m.tls_handshake_failures.clone(),
        );
        r.register(
            "requests_in_flight",
            "Requests admitted whose responses are not sent yet",
            m.requests_in_flight.clone(),
        );
        r.register(
            "request_bytes_in_flight",
            "Bytes of request bodies the gateway holds now",
            m.request_bytes_in_flight.clone(),
        );
        r.register(
            "requests_refused",
            "Requests refused at a limit, by limit",
            Listed(m.requests_refused.clone()),
        );
        r.register(
            "token_reviews",
            "ServiceAccount tokens checked, by result (limited: refused without asking the API)",
            Listed(m.token_reviews.clone()),
        );
        m
    }
}
