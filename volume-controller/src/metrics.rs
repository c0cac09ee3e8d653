//! The volume controller's metrics, under `volume_controller_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// A CSI call's method and the gRPC code it was answered with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub method: &'static str,
    pub code: String,
}

/// Every metric of the volume controller.
#[derive(Clone)]
pub struct Metrics {
    pub calls: Family<CallLabels, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("volume_controller");
        let m = Self {
            calls: Family::default(),
        };
        r.register(
            "csi_calls",
            "CSI calls the sidecars made, by method and the code they were answered with",
            m.calls.clone(),
        );
        m
    }

    /// Counts one call of `method` answered with `code`.
    pub fn count(&self, method: &'static str, code: tonic::Code) {
        self.calls
            .get_or_create(&CallLabels {
                method,
                code: format!("{code:?}"),
            })
            .inc();
    }
}
