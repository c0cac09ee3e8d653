//! `Provider`: what the cloud is and which capabilities it has.

use std::sync::Arc;

use ccm_proto::v1::provider_server::Provider;
use ccm_proto::v1::{GetProviderInfoRequest, GetProviderInfoResponse};
use tonic::{Request, Response, Status};

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
        let p = self.cloud.provider();
        Ok(Response::new(GetProviderInfoResponse {
            name: p.name().to_owned(),
            instances: p.instances().is_some(),
            load_balancers: p.load_balancers().is_some(),
            routes: p.routes().is_some(),
            host_label_annotations: p
                .load_balancers()
                .map(|lb| lb.host_label_annotations())
                .unwrap_or_default()
                .iter()
                .map(|a| (*a).to_owned())
                .collect(),
        }))
    }
}
