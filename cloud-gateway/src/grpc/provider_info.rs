//! `Provider`: what the cloud is and which capabilities it has.

use std::sync::Arc;

use ccm_proto::v1::provider_server::Provider;
use ccm_proto::v1::{GetProviderInfoRequest, GetProviderInfoResponse};
use tonic::{Request, Response, Status};

use super::convert;
use super::status::answer;

use crate::cloud::Cloud;

/// The Provider service.
pub struct ProviderService {
    cloud: Arc<Cloud>,
}

impl ProviderService {
    /// Describes `cloud`'s provider.
    pub fn new(cloud: Arc<Cloud>) -> Self {
        Self { cloud }
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
            }))
        })
        .await
    }
}
