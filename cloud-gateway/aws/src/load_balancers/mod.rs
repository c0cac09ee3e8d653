//! Load balancers: one Network Load Balancer per Service, named from the
//! Service UID, with one listener and one target group per Service port
//! (TCP, UDP, or TCP_UDP where a TCP and a UDP port share a number; TLS
//! where the certificate annotations ask), instance targets on the node
//! port, and one security group of its own that admits the Service's
//! source ranges on its ports. The nodes' security groups (the one tagged
//! for the cluster, or an instance's only one) admit the NLB's group on the
//! node ports and the health check port.
//!
//! Everything made carries the cluster tag (`owned`) and the Service's
//! tags, and is found again by name and checked by tag: a load balancer
//! with our name but another cluster's tag is never touched. Every step is
//! idempotent, so an ensure that failed half way is finished by the next.
//!
//! This file only maps [`LoadBalancers`] onto the operations beside it.
//! Whatever any kind of load balancer needs: `targets` (the instances
//! behind the selected hosts), `placement` (VPC and subnets),
//! `security_groups` over the pure `ingress_rules`, `health_check`. The
//! NLB's own (ELBv2): `nlb`, `listeners`, `target_groups`, `elb_tags`.

mod elb_tags;
mod health_check;
mod ingress_rules;
mod listeners;
mod nlb;
mod placement;
mod security_groups;
mod target_groups;
mod targets;

use async_trait::async_trait;
use ccm_provider::{
    CloudError, Host, LoadBalancer, LoadBalancerSpec, LoadBalancerStatus, LoadBalancers, Result,
    ServiceRef, load_balancer_name,
};

use self::health_check::health_check;
use self::ingress_rules::{client_rules, node_rules, rules_of};
use self::listeners::{Listening, listenings};
use self::nlb::{
    check_immutable, check_not_failed, listed, refuse_requested_address, reported_status,
};
use self::target_groups::GroupSettings;
use self::targets::instance_ids;
use crate::{AwsCloud, annotations, tags};

/// The kind of load balancer this capability makes, as its security
/// group's description and messages name it.
const KIND: &str = "NLB";

#[async_trait]
impl LoadBalancers for AwsCloud {
    async fn get(&self, cluster: &str, service: &ServiceRef) -> Result<Option<LoadBalancerStatus>> {
        match self
            .owned_nlb(cluster, &load_balancer_name(&service.uid))
            .await
        {
            Ok(Some(nlb)) => Ok(Some(reported_status(&nlb))),
            Ok(None) | Err(CloudError::Conflict(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn ensure(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<LoadBalancerStatus> {
        let service = &spec.service;
        let o = annotations::parse(&spec.annotations)?;
        let ls = listenings(spec, &o)?;
        let hc = health_check(spec, &o)?;
        refuse_requested_address(spec)?;
        let lb_name = load_balancer_name(&service.uid);
        let existing = self.owned_nlb(cluster, &lb_name).await?;
        let targets = self.target_instances(hosts, &o).await?;
        let existing_vpc = existing.as_ref().map(|n| n.vpc_id().unwrap_or_default());
        let place = self.placement(cluster, existing_vpc, &targets, &o).await?;
        if let Some(nlb) = &existing {
            check_immutable(nlb, &o, &place.subnets)?;
        }
        let tags = tags::service_tags(cluster, service, &o.tags);

        let group = self
            .load_balancer_group(cluster, KIND, &lb_name, &place.vpc, &tags)
            .await?;
        let group_id = group.group_id().unwrap_or_default();
        let clients = client_rules(
            &spec.source_ranges,
            o.dualstack,
            ls.iter().map(Listening::client_opening),
        );
        self.sync_rules(group_id, &rules_of(&group), &clients)
            .await?;
        let nodes = node_rules(
            group_id,
            ls.iter().map(Listening::node_opening),
            hc.own_port(),
        );
        self.open_nodes(cluster, group_id, &targets, &nodes).await?;

        let nlb = match existing {
            Some(nlb) => nlb,
            None => {
                tracing::info!(nlb = %lb_name, service = %format!("{}/{}", service.namespace, service.name), "creating NLB");
                self.create_nlb(&lb_name, &o, &place.subnets, group_id, &tags)
                    .await?
            }
        };
        check_not_failed(&nlb, &lb_name)?;
        let arn = nlb.load_balancer_arn().unwrap_or_default();
        self.sync_attributes(arn, &o).await?;
        let settings = GroupSettings {
            lb_name: &lb_name,
            vpc: &place.vpc,
            health_check: &hc,
            proxy_protocol: o.proxy_protocol,
            tags: &tags,
        };
        let wanted = self
            .ensure_target_groups(&settings, &ls, &instance_ids(&targets))
            .await?;
        let before = self.sync_listeners(arn, &wanted, &o).await?;
        // A group left by a failed attempt is found by the Service's
        // delete, which looks for every group of the Service.
        self.delete_stale_target_groups(&before, &wanted).await?;
        self.status_when_active(&nlb, &lb_name).await
    }

    async fn update_hosts(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<()> {
        let o = annotations::parse(&spec.annotations)?;
        let ls = listenings(spec, &o)?;
        let lb_name = load_balancer_name(&spec.service.uid);
        let Some(nlb) = self.owned_nlb(cluster, &lb_name).await? else {
            return Err(CloudError::NotFound(format!("load balancer {lb_name}")));
        };
        let targets = self.target_instances(hosts, &o).await?;
        if let Some(group) = nlb.security_groups().first() {
            let hc = health_check(spec, &o)?;
            let nodes = node_rules(group, ls.iter().map(Listening::node_opening), hc.own_port());
            self.open_nodes(cluster, group, &targets, &nodes).await?;
        }
        self.update_targets(&lb_name, &ls, &instance_ids(&targets))
            .await
    }

    async fn delete(&self, cluster: &str, service: &ServiceRef) -> Result<()> {
        let lb_name = load_balancer_name(&service.uid);
        let nlb = match self.owned_nlb(cluster, &lb_name).await {
            Ok(nlb) => nlb,
            // Someone else's NLB: nothing of ours to delete.
            Err(CloudError::Conflict(why)) => {
                tracing::warn!(nlb = %lb_name, "{why}");
                None
            }
            Err(e) => return Err(e),
        };
        let mut vpc = self.settings.vpc_id.clone();
        if let Some(nlb) = &nlb {
            vpc = nlb.vpc_id().map(str::to_owned).or(vpc);
            self.delete_nlb(nlb, &lb_name).await?;
        }
        let groups_vpc = self.delete_service_target_groups(cluster, service).await?;
        let Some(vpc) = vpc.or(groups_vpc) else {
            return Ok(());
        };
        self.delete_load_balancer_group(cluster, KIND, &lb_name, &vpc)
            .await
    }

    fn host_label_annotations(&self) -> &'static [&'static str] {
        &[annotations::TARGET_NODE_LABELS]
    }

    async fn list(&self, cluster: &str) -> Result<Vec<LoadBalancer>> {
        let owned = self.owned_nlbs(cluster).await?;
        Ok(owned.iter().map(|(nlb, t)| listed(nlb, t)).collect())
    }
}
