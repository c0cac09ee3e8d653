//! `Instances`: batched instance lookups through the cache and batcher.

use std::sync::Arc;

use ccm_proto::v1::instances_server::Instances;
use ccm_proto::v1::{
    GetInstancesRequest, GetInstancesResponse, InstanceResult, InstanceState, LookupPurpose,
    TagInstancesRequest, TagInstancesResponse, TagResult,
};
use ccm_provider::{Lookup, Operation, TagOutcome};
use tonic::{Request, Response, Status};

use super::status::{answer, answer_for};

use super::convert;
use super::validate::{ProviderIds, Violations};
use crate::cloud::budget::Priority;
use crate::cloud::instance_lookups::InstanceLookups;
use crate::cloud::{Audit, Cloud};
use crate::identity::Caller;

/// The Instances service.
pub struct InstancesService {
    lookups: Arc<InstanceLookups>,
    cloud: Arc<Cloud>,
}

impl InstancesService {
    /// Serves lookups of `cloud`'s provider through `lookups`.
    pub fn new(lookups: Arc<InstanceLookups>, cloud: Arc<Cloud>) -> Self {
        Self { lookups, cloud }
    }
}

fn priority(purpose: i32) -> Priority {
    match LookupPurpose::try_from(purpose) {
        Ok(LookupPurpose::Initialize | LookupPurpose::Lifecycle) => Priority::High,
        _ => Priority::Low,
    }
}

#[tonic::async_trait]
impl Instances for InstancesService {
    #[tracing::instrument(target = "ccm_calls", skip_all, fields(nodes = request.get_ref().nodes.len(), fresh = request.get_ref().fresh))]
    async fn get_instances(
        &self,
        request: Request<GetInstancesRequest>,
    ) -> Result<Response<GetInstancesResponse>, Status> {
        let objects: Vec<String> = request
            .get_ref()
            .nodes
            .iter()
            .map(|n| format!("node/{}", n.name))
            .collect();
        let priority = priority(request.get_ref().purpose);
        let log = self.cloud.calls();
        answer_for(log, "GetInstances", priority, &objects, async move {
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            v.nodes(&req.nodes, &ProviderIds::of(&self.cloud));
            if LookupPurpose::try_from(req.purpose).is_err() {
                v.add("purpose", "unknown purpose");
            }
            v.finish()?;
            let nodes: Vec<_> = req.nodes.into_iter().map(convert::node).collect();
            let answers = self
                .lookups
                .lookup_drained(&nodes, req.fresh, priority, req.queue_drained)
                .await?;
            let results = nodes
                .into_iter()
                .zip(answers)
                .map(|(node, answer)| {
                    let (state, instance) = match answer.lookup {
                        Lookup::Running(i) => (InstanceState::Running, Some(i)),
                        Lookup::Shutdown(i) => (InstanceState::Shutdown, Some(i)),
                        Lookup::NotFound => (InstanceState::NotFound, None),
                    };
                    InstanceResult {
                        node: Some(convert::node_to_wire(node)),
                        state: state as i32,
                        instance: instance.map(convert::instance_to_wire),
                        cached: answer.cached,
                    }
                })
                .collect();
            Ok(Response::new(GetInstancesResponse { results }))
        })
        .await
    }

    #[tracing::instrument(target = "ccm_calls", skip_all, fields(nodes = request.get_ref().nodes.len(), remove = request.get_ref().remove))]
    async fn tag_instances(
        &self,
        request: Request<TagInstancesRequest>,
    ) -> Result<Response<TagInstancesResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            v.tagged_nodes(&req.nodes);
            v.tags(&req.tags);
            v.finish()?;
            let nodes: Vec<_> = req.nodes.into_iter().map(convert::node).collect();
            let tags: std::collections::BTreeMap<String, String> = req.tags.into_iter().collect();
            let resource = format!("instances/{} nodes", nodes.len());
            let outcomes = self
                .cloud
                .instances()?
                .call(
                    Operation::TagInstances,
                    Priority::Low,
                    Some(Audit {
                        caller: &caller,
                        cluster: &req.cluster_name,
                        resource: &resource,
                    }),
                    |instances| {
                        instances.tag_instances(&req.cluster_name, &nodes, &tags, req.remove)
                    },
                )
                .await?;
            if outcomes.len() != nodes.len() {
                return Err(ccm_provider::CloudError::Unavailable(format!(
                    "the provider answered for {} of {} nodes",
                    outcomes.len(),
                    nodes.len()
                )));
            }
            let results = outcomes
                .into_iter()
                .map(|o| {
                    let result = match o {
                        TagOutcome::Done => TagResult::Done,
                        TagOutcome::NotFound => TagResult::NotFound,
                        TagOutcome::NotTaggable => TagResult::NotTaggable,
                    };
                    result as i32
                })
                .collect();
            Ok(Response::new(TagInstancesResponse { results }))
        })
        .await
    }
}
