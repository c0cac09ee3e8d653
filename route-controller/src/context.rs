//! What every part of the route controller shares.

use ccm_proto::GatewayClient;
use ccm_runtime::leader::Leadership;
use ccm_runtime::queue::WorkQueue;
use ccm_runtime::view::Views;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::events::Recorder;

use crate::args::Settings;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// The shared state of one route controller process.
pub struct Context {
    pub nodes: Api<Node>,
    /// What the controller keeps of each Node.
    pub store: Views<crate::plan::NodeInfo>,
    pub gateway: GatewayClient,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub leadership: Leadership,
    pub settings: Settings,
    /// One key: "reconcile the routes".
    pub queue: WorkQueue<()>,
    /// Pod CIDRs found without their route, and since when.
    pub missing_since: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl Context {
    /// Notes when `node`'s pod CIDRs were seen, for the delay to their
    /// routes (the next reconcile forgets those already routed).
    pub fn note_pod_cidrs(&self, node: &crate::plan::NodeInfo) {
        let now = std::time::Instant::now();
        let mut missing = self.missing_since.lock().unwrap_or_else(|e| e.into_inner());
        for cidr in &node.pod_cidrs {
            missing.entry(cidr.clone()).or_insert(now);
        }
    }

    /// What `/debug/status` tells of this controller beyond what every
    /// controller tells: pod CIDRs still without their route.
    pub fn inspect(&self) -> serde_json::Value {
        let missing = self.missing_since.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = missing
            .values()
            .min()
            .map(|t| t.elapsed().as_secs_f64().round());
        serde_json::json!({
            "enabled": self.settings.enabled,
            "pod_cidrs_without_route": missing.len(),
            "oldest_without_route_s": oldest,
        })
    }

    /// Fails unless this replica leads now. Every write checks it first.
    pub fn ensure_leader(&self) -> Result<()> {
        if self.leadership.is_leader() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }
}
