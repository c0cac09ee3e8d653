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

use super::status::{answer, answer_for, service_object};

use super::convert;
use super::validate::Violations;
use crate::cloud::budget::Priority;
use crate::cloud::load_balancer_reads::LoadBalancerReads;
use crate::cloud::{Audit, Cloud};
use crate::identity::Caller;
use ccm_proto::v1 as wire;
use ccm_provider::{CloudError, Host, HostLimits, LoadBalancerSpec, Operation, load_balancer_name};

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
}

/// The spec and hosts of an ensure or host update, checked in full and in
/// the provider's types.
fn checked(
    cluster_name: &str,
    spec: Option<wire::LoadBalancerSpec>,
    hosts: Vec<wire::Host>,
) -> Result<(LoadBalancerSpec, Vec<Host>), CloudError> {
    let mut v = Violations::default();
    v.cluster_name(cluster_name);
    v.spec(spec.as_ref());
    v.hosts(&hosts);
    v.finish()?;
    Ok((convert::spec(spec), convert::hosts(hosts)))
}

/// Refuses hosts past the cloud's limits for the Service's kind of load
/// balancer, naming the quota, before any cloud write.
async fn within_limits(
    cloud: &Cloud,
    spec: &LoadBalancerSpec,
    hosts: &[Host],
) -> Result<(), CloudError> {
    let limits = cloud.host_limits().await?;
    let Some(limits) = HostLimits::of_service(limits, &spec.annotations) else {
        return Ok(());
    };
    limits
        .check(&spec.annotations, hosts.iter().map(|h| h.zone.as_str()))
        .map_err(|problem| CloudError::InvalidArgument(vec![("hosts".to_owned(), problem)]))
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
        let objects = service_object(request.get_ref().service.as_ref());
        let log = self.cloud.calls();
        answer_for(
            log,
            "GetLoadBalancer",
            Priority::Normal,
            &objects,
            async move {
                let req = request.into_inner();
                let mut v = Violations::default();
                v.cluster_name(&req.cluster_name);
                v.service("service", req.service.as_ref());
                v.finish()?;
                let service = convert::service(req.service);
                let status = self.reads.get(&req.cluster_name, service).await?;
                Ok(Response::new(GetLoadBalancerResponse {
                    exists: status.is_some(),
                    status: status.map(convert::status_to_wire),
                }))
            },
        )
        .await
    }

    #[tracing::instrument(target = "ccm_calls", skip_all, fields(service = ?request.get_ref().spec.as_ref().and_then(|s| s.service.as_ref()).map(|s| format!("{}/{}", s.namespace, s.name))))]
    async fn ensure_load_balancer(
        &self,
        request: Request<EnsureLoadBalancerRequest>,
    ) -> Result<Response<EnsureLoadBalancerResponse>, Status> {
        let spec = request.get_ref().spec.as_ref();
        let objects = service_object(spec.and_then(|s| s.service.as_ref()));
        let log = self.cloud.calls();
        answer_for(
            log,
            "EnsureLoadBalancer",
            Priority::High,
            &objects,
            async move {
                let caller = Caller::name_of(&request);
                let req = request.into_inner();
                let (spec, hosts) = checked(&req.cluster_name, req.spec, req.hosts)?;
                within_limits(&self.cloud, &spec, &hosts).await?;
                let resource = resource(&spec.service.uid);
                let status = self
                    .cloud
                    .load_balancers()?
                    .call(
                        Operation::EnsureLoadBalancer,
                        Priority::High,
                        Some(Audit {
                            caller: &caller,
                            cluster: &req.cluster_name,
                            resource: &resource,
                        }),
                        |lbs| lbs.ensure(&req.cluster_name, &spec, &hosts),
                    )
                    .await?;
                let adopted = status.adopted.clone().unwrap_or_default();
                let no_effect = status.no_effect.clone();
                Ok(Response::new(EnsureLoadBalancerResponse {
                    status: Some(convert::status_to_wire(status)),
                    adopted,
                    no_effect,
                }))
            },
        )
        .await
    }

    async fn update_load_balancer_hosts(
        &self,
        request: Request<UpdateLoadBalancerHostsRequest>,
    ) -> Result<Response<UpdateLoadBalancerHostsResponse>, Status> {
        let spec = request.get_ref().spec.as_ref();
        let objects = service_object(spec.and_then(|s| s.service.as_ref()));
        let log = self.cloud.calls();
        let method = "UpdateLoadBalancerHosts";
        answer_for(log, method, Priority::Normal, &objects, async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let (spec, hosts) = checked(&req.cluster_name, req.spec, req.hosts)?;
            within_limits(&self.cloud, &spec, &hosts).await?;
            let resource = resource(&spec.service.uid);
            self.cloud
                .load_balancers()?
                .call(
                    Operation::UpdateLoadBalancerHosts,
                    Priority::Normal,
                    Some(Audit {
                        caller: &caller,
                        cluster: &req.cluster_name,
                        resource: &resource,
                    }),
                    |lbs| lbs.update_hosts(&req.cluster_name, &spec, &hosts),
                )
                .await?;
            Ok(Response::new(UpdateLoadBalancerHostsResponse {}))
        })
        .await
    }

    async fn delete_load_balancer(
        &self,
        request: Request<DeleteLoadBalancerRequest>,
    ) -> Result<Response<DeleteLoadBalancerResponse>, Status> {
        let objects = service_object(request.get_ref().service.as_ref());
        let log = self.cloud.calls();
        answer_for(
            log,
            "DeleteLoadBalancer",
            Priority::High,
            &objects,
            async move {
                let caller = Caller::name_of(&request);
                let req = request.into_inner();
                let mut v = Violations::default();
                v.cluster_name(&req.cluster_name);
                v.service("service", req.service.as_ref());
                v.finish()?;
                let service = convert::service(req.service);
                let resource = resource(&service.uid);
                self.cloud
                    .load_balancers()?
                    .call(
                        Operation::DeleteLoadBalancer,
                        Priority::High,
                        Some(Audit {
                            caller: &caller,
                            cluster: &req.cluster_name,
                            resource: &resource,
                        }),
                        |lbs| lbs.delete(&req.cluster_name, &service),
                    )
                    .await?;
                Ok(Response::new(DeleteLoadBalancerResponse {}))
            },
        )
        .await
    }

    async fn list_load_balancers(
        &self,
        request: Request<ListLoadBalancersRequest>,
    ) -> Result<Response<ListLoadBalancersResponse>, Status> {
        answer(async move {
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            v.finish()?;
            let load_balancers = self
                .cloud
                .load_balancers()?
                .call(Operation::ListLoadBalancers, Priority::Low, None, |lbs| {
                    lbs.list(&req.cluster_name)
                })
                .await?;
            Ok(Response::new(ListLoadBalancersResponse {
                load_balancers: load_balancers
                    .into_iter()
                    .map(convert::load_balancer_to_wire)
                    .collect(),
            }))
        })
        .await
    }
}
