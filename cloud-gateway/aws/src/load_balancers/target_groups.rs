//! An NLB's target groups (ELBv2), one per listener: named from the
//! Service UID and what cannot change in place, made with the health check
//! and the attributes the Service sets (the others left as they are, as
//! upstream leaves them), their instance targets
//! registered and deregistered by difference, and deleted with the Service
//! or when no listener uses them any more.

use std::collections::BTreeSet;

use aws_sdk_elasticloadbalancingv2::types::{
    ProtocolEnum, TargetDescription, TargetGroup, TargetGroupAttribute, TargetTypeEnum,
};
use ccm_provider::{CloudError, Result, ServiceRef, load_balancer_name};

use super::elb_tags::{elb_tags_of, tag_value};
use super::health_check::HealthCheck;
use super::listeners::Listening;
use crate::annotations::{HcPort, HcProtocol, TargetGroupAttributes};
use crate::tags::{self, ServedBy, TAG_SERVICE_NAME, TAG_SERVICE_UID, served_by};
use crate::{AwsCloud, errors};

/// The target group attribute of the proxy protocol.
const PROXY_PROTOCOL: &str = "proxy_protocol_v2.enabled";
/// The target group attribute of client IP preservation.
const PRESERVE_CLIENT_IP: &str = "preserve_client_ip.enabled";

/// The attributes `wanted` sets that `have` (as AWS reports them) does not
/// have yet, as (key, value). One AWS does not report has its default on
/// an instance target group: PROXY v2 off, client addresses kept.
fn attribute_changes(
    wanted: &TargetGroupAttributes,
    have: &[TargetGroupAttribute],
) -> Vec<(&'static str, String)> {
    [
        (PROXY_PROTOCOL, wanted.proxy_protocol_v2, "false"),
        (PRESERVE_CLIENT_IP, wanted.preserve_client_ip, "true"),
    ]
    .into_iter()
    .filter_map(|(key, value, default)| {
        let value = value?.to_string();
        let current = have
            .iter()
            .find(|a| a.key() == Some(key))
            .and_then(|a| a.value())
            .unwrap_or(default);
        (current != value).then_some((key, value))
    })
    .collect()
}

/// A target group's name (32 characters at most): the first 12 characters
/// of the Service's UID, so a Service's groups are found by prefix, and a
/// digest of what cannot change in place (port, protocol, node port).
fn target_group_name(lb_name: &str, l: &Listening) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{lb_name}/{}/{}/{}", l.port, l.target.as_str(), l.node_port).as_bytes(),
    );
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{}{}", target_group_prefix(lb_name), &hex[..15])
}

/// The name prefix every target group of the load balancer `lb_name`
/// shares.
fn target_group_prefix(lb_name: &str) -> String {
    format!("k8s-{}-", &lb_name[1..lb_name.len().min(13)])
}

/// Whether the NLB `lb_arn` forwards to the target group `g`.
fn serves_nlb(g: &TargetGroup, lb_arn: &str) -> bool {
    !lb_arn.is_empty() && g.load_balancer_arns().iter().any(|a| a == lb_arn)
}

/// The health check protocol in ELBv2's terms.
fn elbv2_protocol(protocol: HcProtocol) -> ProtocolEnum {
    match protocol {
        HcProtocol::Tcp => ProtocolEnum::Tcp,
        HcProtocol::Http => ProtocolEnum::Http,
        HcProtocol::Https => ProtocolEnum::Https,
    }
}

/// The health check port in ELBv2's terms: a number, or `traffic-port`.
fn elbv2_port(port: HcPort) -> String {
    match port {
        HcPort::TrafficPort => "traffic-port".to_owned(),
        HcPort::Port(p) => p.to_string(),
    }
}

/// Whether the target group named `name` is one of ours for the load
/// balancer `lb_name`.
pub(super) fn is_ours(lb_name: &str, name: &str) -> bool {
    name.starts_with(&target_group_prefix(lb_name))
}

/// Whether `g` already runs the health check `hc`.
pub(super) fn checks_health_as(g: &TargetGroup, hc: &HealthCheck) -> bool {
    g.health_check_protocol() == Some(&elbv2_protocol(hc.protocol))
        && g.health_check_port() == Some(elbv2_port(hc.port).as_str())
        && g.health_check_path() == hc.path.as_deref()
        && g.health_check_interval_seconds() == Some(hc.interval)
        && g.health_check_timeout_seconds() == Some(hc.timeout)
        && g.healthy_threshold_count() == Some(hc.healthy)
        && g.unhealthy_threshold_count() == Some(hc.unhealthy)
}

/// What every target group of one NLB shares.
pub(super) struct GroupSettings<'a> {
    pub(super) lb_name: &'a str,
    /// The NLB's ARN: a group it forwards to is its own.
    pub(super) lb_arn: &'a str,
    pub(super) service: &'a ServiceRef,
    pub(super) vpc: &'a str,
    pub(super) health_check: &'a HealthCheck,
    pub(super) attributes: &'a TargetGroupAttributes,
    pub(super) tags: &'a [(String, String)],
}

impl AwsCloud {
    /// A target group per listener, made or brought up to date, each with
    /// exactly the instances `ids` as targets on its node port. Returns
    /// each listener with the ARN of its group.
    pub(super) async fn ensure_target_groups(
        &self,
        settings: &GroupSettings<'_>,
        ls: &[Listening],
        ids: &BTreeSet<String>,
    ) -> Result<Vec<(Listening, String)>> {
        let mut out = Vec::new();
        for l in ls {
            let tg = self.target_group(settings, l).await?;
            let tg_arn = tg.target_group_arn().unwrap_or_default().to_owned();
            self.sync_targets(&tg_arn, ids, l.node_port).await?;
            out.push((l.clone(), tg_arn));
        }
        Ok(out)
    }

    /// Makes the instances `ids` the targets of the existing target groups
    /// of `ls`, the NLB `lb_arn`'s (by AWS's word that it forwards to them,
    /// else by their tags, as [`Self::target_group`]). A missing group
    /// means the ports changed, and only a full ensure makes new groups:
    /// that is `NotFound`.
    pub(super) async fn update_targets(
        &self,
        lb_name: &str,
        lb_arn: &str,
        service: &ServiceRef,
        ls: &[Listening],
        ids: &BTreeSet<String>,
    ) -> Result<()> {
        let names: Vec<String> = ls.iter().map(|l| target_group_name(lb_name, l)).collect();
        let groups = match self
            .elb
            .describe_target_groups()
            .set_names(Some(names.clone()))
            .send()
            .await
        {
            Ok(a) => a.target_groups().to_vec(),
            Err(e) if errors::code(&e) == Some("TargetGroupNotFound") => {
                return Err(CloudError::NotFound(format!(
                    "a target group of load balancer {lb_name}"
                )));
            }
            Err(e) => return Err(errors::cloud_error("DescribeTargetGroups", e)),
        };
        for g in groups.iter().filter(|g| !serves_nlb(g, lb_arn)) {
            self.check_target_group_serves(g, service).await?;
        }
        for (l, name) in ls.iter().zip(&names) {
            let Some(tg) = groups
                .iter()
                .find(|g| g.target_group_name() == Some(name.as_str()))
            else {
                return Err(CloudError::NotFound(format!("target group {name}")));
            };
            self.sync_targets(tg.target_group_arn().unwrap_or_default(), ids, l.node_port)
                .await?;
        }
        Ok(())
    }

    /// The target group for `l`, made when missing, with the wanted health
    /// check and attributes. One of its name that the NLB does not forward
    /// to yet is taken only when its tags name the Service.
    async fn target_group(&self, s: &GroupSettings<'_>, l: &Listening) -> Result<TargetGroup> {
        let name = target_group_name(s.lb_name, l);
        let found = self.find_target_group(&name).await?;
        if let Some(g) = found.as_ref().filter(|g| !serves_nlb(g, s.lb_arn)) {
            self.check_target_group_serves(g, s.service).await?;
        }
        let group = match found {
            Some(g) if checks_health_as(&g, s.health_check) => g,
            Some(g) => self.modify_health_check(g, s.health_check).await?,
            None => self.create_target_group(&name, s, l).await?,
        };
        self.sync_group_attributes(group.target_group_arn().unwrap_or_default(), s.attributes)
            .await?;
        Ok(group)
    }

    /// The target group named `name`, if any.
    async fn find_target_group(&self, name: &str) -> Result<Option<TargetGroup>> {
        match self.elb.describe_target_groups().names(name).send().await {
            Ok(a) => Ok(a.target_groups().first().cloned()),
            Err(e) if errors::code(&e) == Some("TargetGroupNotFound") => Ok(None),
            Err(e) => Err(errors::cloud_error("DescribeTargetGroups", e)),
        }
    }

    /// Gives the group `g` the health check `hc`.
    async fn modify_health_check(&self, g: TargetGroup, hc: &HealthCheck) -> Result<TargetGroup> {
        let answer = self
            .elb
            .modify_target_group()
            .target_group_arn(g.target_group_arn().unwrap_or_default())
            .health_check_protocol(elbv2_protocol(hc.protocol))
            .health_check_port(elbv2_port(hc.port))
            .set_health_check_path(hc.path.clone())
            .health_check_interval_seconds(hc.interval)
            .health_check_timeout_seconds(hc.timeout)
            .healthy_threshold_count(hc.healthy)
            .unhealthy_threshold_count(hc.unhealthy)
            .send()
            .await
            .map_err(|e| errors::cloud_error("ModifyTargetGroup", e))?;
        Ok(answer.target_groups().first().cloned().unwrap_or(g))
    }

    /// A new target group `name` for `l`, with the settings' health check
    /// and tags.
    async fn create_target_group(
        &self,
        name: &str,
        s: &GroupSettings<'_>,
        l: &Listening,
    ) -> Result<TargetGroup> {
        let hc = s.health_check;
        let answer = self
            .elb
            .create_target_group()
            .name(name)
            .protocol(l.target.clone())
            .port(l.node_port)
            .vpc_id(s.vpc)
            .target_type(TargetTypeEnum::Instance)
            .health_check_protocol(elbv2_protocol(hc.protocol))
            .health_check_port(elbv2_port(hc.port))
            .set_health_check_path(hc.path.clone())
            .health_check_interval_seconds(hc.interval)
            .health_check_timeout_seconds(hc.timeout)
            .healthy_threshold_count(hc.healthy)
            .unhealthy_threshold_count(hc.unhealthy)
            .set_tags(Some(elb_tags_of(s.tags)))
            .send()
            .await
            .map_err(|e| errors::cloud_error("CreateTargetGroup", e))?;
        answer
            .target_groups()
            .first()
            .cloned()
            .ok_or_else(|| CloudError::Internal("CreateTargetGroup answered no group".into()))
    }

    /// The attributes `wanted` sets on the group `arn`; those it does not
    /// set are left as they are, as upstream leaves them.
    async fn sync_group_attributes(&self, arn: &str, wanted: &TargetGroupAttributes) -> Result<()> {
        if *wanted == TargetGroupAttributes::default() {
            return Ok(());
        }
        let have = self
            .elb
            .describe_target_group_attributes()
            .target_group_arn(arn)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeTargetGroupAttributes", e))?;
        let changes = attribute_changes(wanted, have.attributes());
        if changes.is_empty() {
            return Ok(());
        }
        self.elb
            .modify_target_group_attributes()
            .target_group_arn(arn)
            .set_attributes(Some(
                changes
                    .into_iter()
                    .map(|(k, v)| TargetGroupAttribute::builder().key(k).value(v).build())
                    .collect(),
            ))
            .send()
            .await
            .map_err(|e| errors::cloud_error("ModifyTargetGroupAttributes", e))?;
        Ok(())
    }

    /// Registers and deregisters only the difference between the group's
    /// targets and `ids` on `port`.
    async fn sync_targets(&self, group_arn: &str, ids: &BTreeSet<String>, port: i32) -> Result<()> {
        let health = self
            .elb
            .describe_target_health()
            .target_group_arn(group_arn)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeTargetHealth", e))?;
        let have: BTreeSet<(String, i32)> = health
            .target_health_descriptions()
            .iter()
            .filter_map(|d| {
                let t = d.target()?;
                Some((t.id()?.to_owned(), t.port().unwrap_or(port)))
            })
            .collect();
        let want: BTreeSet<(String, i32)> = ids.iter().map(|id| (id.clone(), port)).collect();
        let describe =
            |(id, port): &(String, i32)| TargetDescription::builder().id(id).port(*port).build();
        let add: Vec<TargetDescription> = want.difference(&have).map(describe).collect();
        let remove: Vec<TargetDescription> = have.difference(&want).map(describe).collect();
        if !add.is_empty() {
            self.elb
                .register_targets()
                .target_group_arn(group_arn)
                .set_targets(Some(add))
                .send()
                .await
                .map_err(|e| errors::cloud_error("RegisterTargets", e))?;
        }
        if !remove.is_empty() {
            self.elb
                .deregister_targets()
                .target_group_arn(group_arn)
                .set_targets(Some(remove))
                .send()
                .await
                .map_err(|e| errors::cloud_error("DeregisterTargets", e))?;
        }
        Ok(())
    }

    /// `Conflict` unless the tags of the target group `g` name `service`.
    async fn check_target_group_serves(&self, g: &TargetGroup, service: &ServiceRef) -> Result<()> {
        let arn = g.target_group_arn().unwrap_or_default();
        let t = self
            .elb_tags(&[arn.to_owned()])
            .await?
            .remove(arn)
            .unwrap_or_default();
        match served_by(
            tag_value(&t, TAG_SERVICE_NAME),
            tag_value(&t, TAG_SERVICE_UID),
            service,
        ) {
            ServedBy::This => Ok(()),
            ServedBy::Another(whose) => Err(CloudError::Conflict(format!(
                "target group {} is {whose}'s; it is left alone",
                g.target_group_name().unwrap_or_default()
            ))),
            ServedBy::Unnamed => Err(CloudError::Conflict(format!(
                "target group {} names no Service in its tags; it is left alone",
                g.target_group_name().unwrap_or_default()
            ))),
        }
    }

    /// Deletes the groups in `before` that no listener of `wanted` uses
    /// any more (a port or node port changed).
    pub(super) async fn delete_stale_target_groups(
        &self,
        before: &BTreeSet<String>,
        wanted: &[(Listening, String)],
    ) -> Result<()> {
        let in_use: BTreeSet<&str> = wanted.iter().map(|(_, a)| a.as_str()).collect();
        for stale in before.iter().filter(|a| !in_use.contains(a.as_str())) {
            self.delete_target_group(stale).await?;
        }
        Ok(())
    }

    /// Deletes every target group of `service`. Returns the VPC of the
    /// first that tells one. One cloud-provider-aws made that is still in
    /// use belongs to another load balancer (a Service of the same name
    /// before this one): it is left, with a warning.
    pub(super) async fn delete_service_target_groups(
        &self,
        cluster: &str,
        service: &ServiceRef,
    ) -> Result<Option<String>> {
        let mut vpc = None;
        for (g, ours) in self.service_target_groups(cluster, service).await? {
            if let Some(arn) = g.target_group_arn() {
                match self.delete_target_group(arn).await {
                    Err(CloudError::Provisioning { message, .. }) if !ours => {
                        tracing::warn!(target_group = arn, "left in place: {message}");
                    }
                    r => r?,
                }
            }
            vpc = vpc.or_else(|| g.vpc_id().map(str::to_owned));
        }
        Ok(vpc)
    }

    /// This Service's target groups, each with whether it is ours: ours
    /// by name prefix, confirmed by the UID tag; those cloud-provider-aws
    /// made by its name prefix, confirmed by the service-name tag.
    async fn service_target_groups(
        &self,
        cluster: &str,
        service: &ServiceRef,
    ) -> Result<Vec<(TargetGroup, bool)>> {
        let prefix = target_group_prefix(&load_balancer_name(&service.uid));
        let upstream = tags::upstream_name_prefix(service);
        let service_name = format!("{}/{}", service.namespace, service.name);
        let groups: Vec<TargetGroup> = self
            .elb
            .describe_target_groups()
            .page_size(400)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| errors::cloud_error("DescribeTargetGroups", e))?;
        let groups: Vec<TargetGroup> = groups
            .into_iter()
            .filter(|g| {
                g.target_group_name()
                    .is_some_and(|n| n.starts_with(&prefix) || n.starts_with(&upstream))
            })
            .collect();
        Ok(self
            .owned_by(cluster, groups, TargetGroup::target_group_arn)
            .await?
            .into_iter()
            .filter_map(|(g, t)| match tag_value(&t, TAG_SERVICE_UID) {
                Some(uid) => (uid == service.uid).then_some((g, true)),
                None => (tag_value(&t, TAG_SERVICE_NAME) == Some(service_name.as_str()))
                    .then_some((g, false)),
            })
            .collect())
    }

    /// Deletes the group `arn`. One already gone is fine; one still in use
    /// waits until its NLB is gone.
    async fn delete_target_group(&self, arn: &str) -> Result<()> {
        match self
            .elb
            .delete_target_group()
            .target_group_arn(arn)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if errors::code(&e) == Some("TargetGroupNotFound") => Ok(()),
            Err(e) if errors::code(&e) == Some("ResourceInUse") => Err(errors::provisioning(
                format!("target group {arn} is still in use while its NLB goes"),
            )),
            Err(e) => Err(errors::cloud_error("DeleteTargetGroup", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_group_names_fit_and_differ_by_port_protocol_and_node_port() {
        let lb = load_balancer_name("1234abcd-12ab-34cd-56ef-1234567890ab");
        let l = Listening {
            port: 80,
            listener: ProtocolEnum::Tcp,
            target: ProtocolEnum::Tcp,
            node_port: 30080,
            tls: false,
        };
        let a = target_group_name(&lb, &l);
        assert_eq!(a.len(), 32, "{a}");
        assert!(a.starts_with(&target_group_prefix(&lb)));
        let b = target_group_name(
            &lb,
            &Listening {
                node_port: 30081,
                ..l.clone()
            },
        );
        assert_ne!(a, b);
    }

    #[test]
    fn health_checks_reach_elbv2_as_protocol_and_port_or_traffic_port() {
        assert_eq!(elbv2_protocol(HcProtocol::Https), ProtocolEnum::Https);
        assert_eq!(elbv2_port(HcPort::Port(32000)), "32000");
        assert_eq!(elbv2_port(HcPort::TrafficPort), "traffic-port");
    }

    #[test]
    fn only_the_attributes_the_service_sets_and_the_group_has_change() {
        let attr = |k: &str, v: &str| TargetGroupAttribute::builder().key(k).value(v).build();
        let have = [
            attr(PROXY_PROTOCOL, "false"),
            attr(PRESERVE_CLIENT_IP, "true"),
        ];
        let wanted = TargetGroupAttributes {
            proxy_protocol_v2: Some(true),
            preserve_client_ip: Some(true),
        };
        assert_eq!(
            attribute_changes(&wanted, &have),
            [(PROXY_PROTOCOL, "true".to_owned())]
        );
        assert!(attribute_changes(&TargetGroupAttributes::default(), &have).is_empty());
        assert!(
            attribute_changes(&wanted, &[]) == [(PROXY_PROTOCOL, "true".to_owned())],
            "a key AWS does not report has its default"
        );
    }
}
