//! The volume controller's metrics, under `volume_controller_`.

use ccm_runtime::metrics::{Listed, slo_buckets};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A CSI call's method and the gRPC code it was answered with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub method: &'static str,
    pub code: String,
}

/// A CSI call's method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

type Durations = Family<MethodLabels, Histogram, fn() -> Histogram>;

/// Every metric of the volume controller.
#[derive(Clone)]
pub struct Metrics {
    pub calls: Family<CallLabels, Counter>,
    /// How long each CSI call took to answer, whatever the answer: a
    /// create or attach includes the gateway's wait for the cloud.
    pub durations: Durations,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("volume_controller");
        let m = Self {
            calls: Family::default(),
            durations: Durations::new_with_constructor(|| Histogram::new(slo_buckets())),
        };
        r.register(
            "csi_calls",
            "CSI calls the sidecars made, by method and the code they were answered with",
            Listed(m.calls.clone()),
        );
        r.register(
            "csi_call_duration_seconds",
            "Time to answer a CSI call, by method (a create or attach includes the gateway's wait for the cloud)",
            Listed(m.durations.clone()),
        );
        m
    }

    /// Counts one call of `method` answered with `code` after `took`.
    pub fn count(&self, method: &'static str, code: tonic::Code, took: std::time::Duration) {
        self.calls
            .get_or_create(&CallLabels {
                method,
                code: format!("{code:?}"),
            })
            .inc();
        self.durations
            .get_or_create(&MethodLabels { method })
            .observe(took.as_secs_f64());
    }
}
