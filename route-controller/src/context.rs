//! What every part of the route controller shares.

use ccm_proto::GatewayClient;
use ccm_runtime::leader::Leadership;
use ccm_runtime::queue::WorkQueue;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use crate::args::Settings;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// The shared state of one route controller process.
pub struct Context {
    pub nodes: Api<Node>,
    pub store: Store<Node>,
    pub gateway: GatewayClient,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub leadership: Leadership,
    pub settings: Settings,
    /// One key: "reconcile the routes".
    pub queue: WorkQueue<()>,
}

impl Context {
    /// Fails unless this replica leads now. Every write checks it first.
    pub fn ensure_leader(&self) -> Result<()> {
        if self.leadership.is_leader() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }
}
