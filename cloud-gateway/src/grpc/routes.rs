//! `Routes`: the cluster's pod CIDR routes, through the budget.

use std::sync::Arc;

use ccm_proto::v1::routes_server::Routes;
use ccm_proto::v1::{
    CreateRouteRequest, CreateRouteResponse, DeleteRouteRequest, DeleteRouteResponse,
    ListRoutesRequest, ListRoutesResponse,
};
use tonic::{Request, Response, Status};

use super::status::answer;

use super::convert;
use super::validate::{ProviderIds, Violations};
use crate::cloud::budget::Priority;
use crate::cloud::{Audit, Cloud};
use crate::identity::Caller;
use ccm_provider::Operation;

/// The Routes service.
pub struct RoutesService {
    cloud: Arc<Cloud>,
}

impl RoutesService {
    /// Serves routes of `cloud`.
    pub fn new(cloud: Arc<Cloud>) -> Self {
        Self { cloud }
    }
}

#[tonic::async_trait]
impl Routes for RoutesService {
    async fn list_routes(
        &self,
        request: Request<ListRoutesRequest>,
    ) -> Result<Response<ListRoutesResponse>, Status> {
        answer(async move {
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            v.finish()?;
            let routes = self
                .cloud
                .routes()?
                .call(Operation::ListRoutes, Priority::Normal, None, |routes| {
                    routes.list(&req.cluster_name)
                })
                .await?;
            Ok(Response::new(ListRoutesResponse {
                routes: routes.into_iter().map(convert::route_to_wire).collect(),
            }))
        })
        .await
    }

    async fn create_route(
        &self,
        request: Request<CreateRouteRequest>,
    ) -> Result<Response<CreateRouteResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            v.route(req.route.as_ref(), true, &ProviderIds::of(&self.cloud));
            v.name_hint(&req.name_hint);
            v.finish()?;
            let route = convert::route(req.route);
            let resource = format!("route/{}->{}", route.destination_cidr, route.target_node);
            let created = self
                .cloud
                .routes()?
                .call(
                    Operation::CreateRoute,
                    Priority::Normal,
                    Some(Audit {
                        caller: &caller,
                        cluster: &req.cluster_name,
                        resource: &resource,
                    }),
                    |routes| routes.create(&req.cluster_name, &req.name_hint, &route),
                )
                .await?;
            Ok(Response::new(CreateRouteResponse {
                route: Some(convert::route_to_wire(created)),
            }))
        })
        .await
    }

    async fn delete_route(
        &self,
        request: Request<DeleteRouteRequest>,
    ) -> Result<Response<DeleteRouteResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            v.route(req.route.as_ref(), false, &ProviderIds::of(&self.cloud));
            v.finish()?;
            let route = convert::route(req.route);
            let resource = format!(
                "route/{}",
                if route.name.is_empty() {
                    &route.destination_cidr
                } else {
                    &route.name
                }
            );
            self.cloud
                .routes()?
                .call(
                    Operation::DeleteRoute,
                    Priority::Normal,
                    Some(Audit {
                        caller: &caller,
                        cluster: &req.cluster_name,
                        resource: &resource,
                    }),
                    |routes| routes.delete(&req.cluster_name, &route),
                )
                .await?;
            Ok(Response::new(DeleteRouteResponse {}))
        })
        .await
    }
}
