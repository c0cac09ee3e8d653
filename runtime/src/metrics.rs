//! Metric pieces every process shares: bucket sets sized for what they
//! measure, families listed even before their first sample, and the leader
//! gauge read at scrape time.

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::exponential_buckets;

use crate::leader::Leadership;

/// The label of an error counter: a stable name of the error's kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: &'static str,
}

/// Errors counted by kind.
pub type ErrorCounts = Family<ErrorLabels, Counter>;

/// Waits inside a process (a queue, a budget): 1 ms to about 65 s.
pub fn wait_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

/// Delays a user waits for (a node initialised, an address written, hosts
/// or a route in place): 50 ms to about 14 minutes, so a fast controller's
/// fraction of a second and a cloud's minutes of provisioning both land in
/// buckets of their own.
pub fn slo_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.05, 2.0, 15)
}

/// A metric whose name, help and type are exported even while it has no
/// sample (a family with no labels seen yet): dashboards and alerts can
/// rely on every name existing, and the chart checks prove they do.
#[derive(Clone, Debug)]
pub struct Listed<M>(pub M);

impl<M: EncodeMetric> EncodeMetric for Listed<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// 1 while this replica leads, else 0; read from the election at each
/// scrape, so a lease past its renew deadline reads 0 at once.
#[derive(Debug)]
pub struct LeaderGauge(pub Leadership);

impl EncodeMetric for LeaderGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&i64::from(self.0.is_leader()))
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::registry::Registry;

    use super::*;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
    struct Labels {
        error: &'static str,
    }

    #[test]
    fn a_listed_family_is_exported_before_its_first_sample_a_plain_one_is_not() {
        let mut registry = Registry::default();
        let listed: Family<Labels, Counter> = Family::default();
        let plain: Family<Labels, Counter> = Family::default();
        registry.register("listed_errors", "Listed", Listed(listed.clone()));
        registry.register("plain_errors", "Plain", plain);
        registry.register("leader", "Leading", LeaderGauge(Leadership::always()));
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(text.contains("# TYPE listed_errors counter"), "{text}");
        assert!(!text.contains("plain_errors"), "{text}");
        assert!(text.contains("leader 1"), "{text}");
        listed.get_or_create(&Labels { error: "x" }).inc();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("listed_errors_total{error=\"x\"} 1"),
            "{text}"
        );
    }
}
