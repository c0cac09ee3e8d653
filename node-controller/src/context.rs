//! What every part of the node controller shares.

use ccm_proto::GatewayClient;
use ccm_proto::v1::{InstanceResult, LookupPurpose, NodeRef};
use ccm_runtime::leader::Leadership;
use ccm_runtime::queue::WorkQueue;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use crate::args::Settings;
use crate::error::{Error, Result};
use crate::metrics::{GatewayLabels, Metrics};

/// The shared state of one node controller process.
pub struct Context {
    pub nodes: Api<Node>,
    pub store: Store<Node>,
    pub gateway: GatewayClient,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub leadership: Leadership,
    pub settings: Settings,
    pub queue: WorkQueue<String>,
    /// The tagging controller, when `--instance-tags` names tags.
    pub tagging: Option<crate::tagging::Tagging>,
    /// The serving CSR approver, when `--approve-kubelet-serving-csrs`.
    pub csrs: Option<crate::serving_csrs::ServingCsrs>,
}

/// How a node is named to the gateway.
pub fn node_ref(node: &Node) -> NodeRef {
    NodeRef {
        name: node.metadata.name.clone().unwrap_or_default(),
        provider_id: node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default(),
    }
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

    /// Looks up instances through the gateway, counting the call.
    pub async fn lookup(
        &self,
        nodes: Vec<NodeRef>,
        purpose: LookupPurpose,
        fresh: bool,
    ) -> Result<Vec<InstanceResult>, ccm_proto::Error> {
        let result = self.gateway.get_instances(nodes, purpose, fresh).await;
        self.metrics
            .gateway_calls
            .get_or_create(&GatewayLabels {
                operation: "get_instances",
                outcome: match &result {
                    Ok(_) => "ok",
                    Err(e) => e.metric_label(),
                },
            })
            .inc();
        result
    }
}
