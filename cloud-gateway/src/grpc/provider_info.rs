//! `Provider`: what the cloud is and which capabilities it has.

use std::sync::Arc;

use ccm_proto::v1::provider_server::Provider;
use ccm_proto::v1::{GetProviderInfoRequest, GetProviderInfoResponse, VolumeOffer};
use tonic::{Request, Response, Status};

use super::convert;
use super::status::answer;

use crate::cloud::Cloud;

/// The Provider service.
pub struct ProviderService {
    cloud: Arc<Cloud>,
    /// The most instances one lookup call takes.
    instance_batch: usize,
}

impl ProviderService {
    /// Describes `cloud`'s provider, whose instance lookups go in calls of
    /// up to `instance_batch`.
    pub fn new(cloud: Arc<Cloud>, instance_batch: usize) -> Self {
        Self {
            cloud,
            instance_batch,
        }
    }
}

#[tonic::async_trait]
impl Provider for ProviderService {
    async fn get_provider_info(
        &self,
        _request: Request<GetProviderInfoRequest>,
    ) -> Result<Response<GetProviderInfoResponse>, Status> {
        answer(async move {
            let offers = self.cloud.offers();
            let host_limits = self.cloud.host_limits().await?;
            Ok(Response::new(GetProviderInfoResponse {
                name: self.cloud.name().to_owned(),
                instances: offers.instances,
                load_balancers: offers.load_balancers,
                routes: offers.routes,
                instance_tags: offers.instance_tags,
                node_groups: offers.node_groups,
                host_label_annotations: offers
                    .host_label_annotations
                    .iter()
                    .map(|a| (*a).to_owned())
                    .collect(),
                host_limits: host_limits
                    .iter()
                    .cloned()
                    .map(convert::host_limits_to_wire)
                    .collect(),
                instance_batch: u32::try_from(self.instance_batch).unwrap_or(u32::MAX),
                volumes: offers.volumes,
                volume_offer: self.cloud.volume_offer().map(|o| VolumeOffer {
                    csi_driver: o.csi_driver,
                    topology_keys: o.topology_keys,
                    clones: o.clones,
                    snapshots: o.snapshots,
                    modify: o.modify,
                    default_size_bytes: o.default_size_bytes,
                    node_parameters: o.node_parameters,
                }),
            }))
        })
        .await
    }
}
