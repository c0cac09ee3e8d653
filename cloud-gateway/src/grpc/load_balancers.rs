//! `LoadBalancers`: one load balancer per Service, through the budget.

use std::sync::Arc;

use ccm_proto::v1::load_balancers_server::LoadBalancers;
use ccm_proto::v1::{
    DeleteLoadBalancerRequest, DeleteLoadBalancerResponse, EnsureLoadBalancerRequest,
    EnsureLoadBalancerResponse, GetLoadBalancerRequest, GetLoadBalancerResponse,
    ListLoadBalancersRequest, ListLoadBalancersResponse, UpdateLoadBalancerHostsRequest,
    UpdateLoadBalancerHostsResponse,
};
use tonic::{Request, Response, Status};

use super::caller_name;
use super::validate::Violations;
use crate::budget::Priority;
use crate::cloud::{Audit, Cloud};
use crate::lbreads::LoadBalancerReads;
use crate::provider::{self, CloudError, Operation, load_balancer_name};

/// The LoadBalancers service.
pub struct LoadBalancersService {
    cloud: Arc<Cloud>,
    reads: Arc<LoadBalancerReads>,
}

impl LoadBalancersService {
    /// Serves load balancers of `cloud`, status reads through `reads`.
    pub fn new(cloud: Arc<Cloud>, reads: Arc<LoadBalancerReads>) -> Self {
        Self { cloud, reads }
    }

    fn provider(&self) -> Result<&dyn provider::LoadBalancers, CloudError> {
        self.cloud
            .provider()
            .load_balancers()
            .ok_or(CloudError::NotImplemented("load balancers"))
    }
}

fn resource(uid: &str) -> String {
    format!("load_balancer/{}", load_balancer_name(uid))
}

#[tonic::async_trait]
impl LoadBalancers for LoadBalancersService {
    async fn get_load_balancer(
        &self,
        request: Request<GetLoadBalancerRequest>,
    ) -> Result<Response<GetLoadBalancerResponse>, Status> {
        let req = request.into_inner();
        let mut v = Violations::default();
        v.cluster_name(&req.cluster_name);
        v.service("service", req.service.as_ref());
        v.finish()?;
        let service = req.service.unwrap_or_default();
        let status = self.reads.get(&req.cluster_name, service).await?;
        Ok(Response::new(GetLoadBalancerResponse {
            exists: status.is_some(),
            status,
        }))
    }

    #[tracing::instrument(target = "ccm_calls", skip_all, fields(service = ?request.get_ref().spec.as_ref().and_then(|s| s.service.as_ref()).map(|s| format!("{}/{}", s.namespace, s.name))))]
    async fn ensure_load_balancer(
        &self,
        request: Request<EnsureLoadBalancerRequest>,
    ) -> Result<Response<EnsureLoadBalancerResponse>, Status> {
        let caller = caller_name(&request);
        let req = request.into_inner();
        let mut v = Violations::default();
        v.cluster_name(&req.cluster_name);
        v.spec(req.spec.as_ref());
        v.hosts(&req.hosts);
        v.finish()?;
        let spec = req.spec.unwrap_or_default();
        let resource = resource(&spec.service.clone().unwrap_or_default().uid);
        let status = self
            .cloud
            .call(
                Operation::EnsureLoadBalancer,
                Priority::High,
                Some(Audit {
                    caller: &caller,
                    cluster: &req.cluster_name,
                    resource: &resource,
                }),
                self.provider()?
                    .ensure(&req.cluster_name, &spec, &req.hosts),
            )
            .await?;
        Ok(Response::new(EnsureLoadBalancerResponse {
            status: Some(status),
        }))
    }

    async fn update_load_balancer_hosts(
        &self,
        request: Request<UpdateLoadBalancerHostsRequest>,
    ) -> Result<Response<UpdateLoadBalancerHostsResponse>, Status> {
        let caller = caller_name(&request);
        let req = request.into_inner();
        let mut v = Violations::default();
        v.cluster_name(&req.cluster_name);
        v.spec(req.spec.as_ref());
        v.hosts(&req.hosts);
        v.finish()?;
        let spec = req.spec.unwrap_or_default();
        let resource = resource(&spec.service.clone().unwrap_or_default().uid);
        self.cloud
            .call(
                Operation::UpdateLoadBalancerHosts,
                Priority::Normal,
                Some(Audit {
                    caller: &caller,
                    cluster: &req.cluster_name,
                    resource: &resource,
                }),
                self.provider()?
                    .update_hosts(&req.cluster_name, &spec, &req.hosts),
            )
            .await?;
        Ok(Response::new(UpdateLoadBalancerHostsResponse {}))
    }

    async fn delete_load_balancer(
        &self,
        request: Request<DeleteLoadBalancerRequest>,
    ) -> Result<Response<DeleteLoadBalancerResponse>, Status> {
        let caller = caller_name(&request);
        let req = request.into_inner();
        let mut v = Violations::default();
        v.cluster_name(&req.cluster_name);
        v.service("service", req.service.as_ref());
        v.finish()?;
        let service = req.service.unwrap_or_default();
        let resource = resource(&service.uid);
        self.cloud
            .call(
                Operation::DeleteLoadBalancer,
                Priority::High,
                Some(Audit {
                    caller: &caller,
                    cluster: &req.cluster_name,
                    resource: &resource,
                }),
                self.provider()?.delete(&req.cluster_name, &service),
            )
            .await?;
        Ok(Response::new(DeleteLoadBalancerResponse {}))
    }

    async fn list_load_balancers(
        &self,
        request: Request<ListLoadBalancersRequest>,
    ) -> Result<Response<ListLoadBalancersResponse>, Status> {
        let req = request.into_inner();
        let mut v = Violations::default();
        v.cluster_name(&req.cluster_name);
        v.finish()?;
        let load_balancers = self
            .cloud
            .call(
                Operation::ListLoadBalancers,
                Priority::Low,
                None,
                self.provider()?.list(&req.cluster_name),
            )
            .await?;
        Ok(Response::new(ListLoadBalancersResponse { load_balancers }))
    }
}
