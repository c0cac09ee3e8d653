//! `Routes`: the cluster's pod CIDR routes, through the budget.

use std::sync::Arc;

use ccm_proto::v1::routes_server::Routes;
use ccm_proto::v1::{
    CreateRouteRequest, CreateRouteResponse, DeleteRouteRequest, DeleteRouteResponse,
    ListRoutesRequest, ListRoutesResponse,
};
use tonic::{Request, Response, Status};

use super::caller_name;
use super::validate::{ProviderIds, Violations};
use crate::budget::Priority;
use crate::cloud::{Audit, Cloud};
use crate::provider::{self, CloudError, Operation};

/// The Routes service.
pub struct RoutesService {
    cloud: Arc<Cloud>,
}

impl RoutesService {
    /// Serves routes of `cloud`.
    pub fn new(cloud: Arc<Cloud>) -> Self {
        Self { cloud }
    }

    fn provider(&self) -> Result<&dyn provider::Routes, CloudError> {
        self.cloud
            .provider()
            .routes()
            .ok_or(CloudError::NotImplemented("routes"))
    }
}

#[tonic::async_trait]
impl Routes for RoutesService {
    async fn list_routes(
        &self,
        request: Request<ListRoutesRequest>,
    ) -> Result<Response<ListRoutesResponse>, Status> {
        let req = request.into_inner();
        let mut v = Violations::default();
        v.cluster_name(&req.cluster_name);
        v.finish()?;
        let routes = self
            .cloud
            .call(
                Operation::ListRoutes,
                Priority::Normal,
                None,
                self.provider()?.list(&req.cluster_name),
            )
            .await?;
        Ok(Response::new(ListRoutesResponse { routes }))
    }

    async fn create_route(
        &self,
        request: Request<CreateRouteRequest>,
    ) -> Result<Response<CreateRouteResponse>, Status> {
        let caller = caller_name(&request);
        let req = request.into_inner();
        let mut v = Violations::default();
        v.cluster_name(&req.cluster_name);
        v.route(
            req.route.as_ref(),
            true,
            &ProviderIds::of(self.cloud.provider()),
        );
        v.name_hint(&req.name_hint);
        v.finish()?;
        let route = req.route.unwrap_or_default();
        let resource = format!("route/{}->{}", route.destination_cidr, route.target_node);
        let created = self
            .cloud
            .call(
                Operation::CreateRoute,
                Priority::Normal,
                Some(Audit {
                    caller: &caller,
                    cluster: &req.cluster_name,
                    resource: &resource,
                }),
                self.provider()?
                    .create(&req.cluster_name, &req.name_hint, &route),
            )
            .await?;
        Ok(Response::new(CreateRouteResponse {
            route: Some(created),
        }))
    }

    async fn delete_route(
        &self,
        request: Request<DeleteRouteRequest>,
    ) -> Result<Response<DeleteRouteResponse>, Status> {
        let caller = caller_name(&request);
        let req = request.into_inner();
        let mut v = Violations::default();
        v.cluster_name(&req.cluster_name);
        v.route(
            req.route.as_ref(),
            false,
            &ProviderIds::of(self.cloud.provider()),
        );
        v.finish()?;
        let route = req.route.unwrap_or_default();
        let resource = format!(
            "route/{}",
            if route.name.is_empty() {
                &route.destination_cidr
            } else {
                &route.name
            }
        );
        self.cloud
            .call(
                Operation::DeleteRoute,
                Priority::Normal,
                Some(Audit {
                    caller: &caller,
                    cluster: &req.cluster_name,
                    resource: &resource,
                }),
                self.provider()?.delete(&req.cluster_name, &route),
            )
            .await?;
        Ok(Response::new(DeleteRouteResponse {}))
    }
}
