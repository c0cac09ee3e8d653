//! The Network Load Balancer itself: found by name and checked by tag,
//! made in its subnets with its security group, its cross-zone setting,
//! what cannot change after creation, its state and status, the listing
//! of the cluster's NLBs, and its deletion.

use std::collections::BTreeSet;

use aws_sdk_ec2::types::Subnet;
use aws_sdk_elasticloadbalancingv2::types::{
    IpAddressType, LoadBalancer as Nlb, LoadBalancerAttribute, LoadBalancerSchemeEnum,
    LoadBalancerStateEnum, LoadBalancerTypeEnum, SubnetMapping, Tag,
};
use ccm_provider::{
    CloudError, Ingress, LoadBalancer, LoadBalancerSpec, LoadBalancerStatus, Result,
    SessionAffinity,
};

use super::elb_tags::{elb_belongs, elb_tags_of, tag_value};
use crate::annotations::{self, LbOptions};
use crate::tags::{self, TAG_SERVICE_NAME, TAG_SERVICE_UID};
use crate::{AwsCloud, errors};

/// The load balancer attribute of cross-zone load balancing.
const CROSS_ZONE: &str = "load_balancing.cross_zone.enabled";
/// The load balancer attributes of access logs.
const ACCESS_LOGS: &str = "access_logs.s3.enabled";
const ACCESS_LOGS_BUCKET: &str = "access_logs.s3.bucket";
const ACCESS_LOGS_PREFIX: &str = "access_logs.s3.prefix";

/// The attributes of an NLB that `o` wants and `have` (as AWS reports
/// them) lacks, as upstream keeps them: cross-zone load balancing and
/// access logs as asked, off when not asked (so removing an annotation
/// turns it off); bucket and prefix only while logs are on (AWS refuses
/// an empty bucket).
fn attribute_changes(o: &LbOptions, have: &[LoadBalancerAttribute]) -> Vec<(&'static str, String)> {
    let log = o.access_log.clone().unwrap_or_default();
    let mut wanted = vec![
        (CROSS_ZONE, o.cross_zone.unwrap_or(false).to_string()),
        (ACCESS_LOGS, log.enabled.to_string()),
    ];
    if log.enabled {
        wanted.push((ACCESS_LOGS_BUCKET, log.bucket.unwrap_or_default()));
        wanted.push((ACCESS_LOGS_PREFIX, log.prefix.unwrap_or_default()));
    }
    let current = |key: &str| {
        have.iter()
            .find(|a| a.key() == Some(key))
            .and_then(|a| a.value())
            .unwrap_or_default()
    };
    wanted
        .into_iter()
        .filter(|(key, value)| {
            let now = current(key);
            // AWS reports a never-set switch as absent: that is off.
            now != value && !(now.is_empty() && value == "false")
        })
        .collect()
}

/// Refuses what no AWS load balancer of ours takes, every problem at
/// once: a requested address (an NLB's come from the annotations, a
/// Classic ELB has none of its own) and client affinity (neither kind
/// keeps it; cloud-provider-aws refuses it too, so no Service that worked
/// there asks for it).
pub(super) fn refuse_unsupported(spec: &LoadBalancerSpec) -> Result<()> {
    let mut problems = Vec::new();
    if !spec.load_balancer_ip.is_empty() {
        problems.push((
            "spec.load_balancer_ip".to_owned(),
            format!(
                "AWS load balancers take no requested address; an NLB takes {} or {}",
                annotations::EIP_ALLOCATIONS,
                annotations::PRIVATE_IPV4
            ),
        ));
    }
    if spec.session_affinity == SessionAffinity::ClientIp {
        problems.push((
            "spec.session_affinity".to_owned(),
            "AWS load balancers of this provider keep no client affinity (cloud-provider-aws refuses it too): set sessionAffinity: None".to_owned(),
        ));
    }
    CloudError::none_of(problems)
}

/// Refuses a change to what an NLB cannot change after creation.
pub(super) fn check_immutable(nlb: &Nlb, o: &LbOptions, subnets: &[Subnet]) -> Result<()> {
    let mut problems = Vec::new();
    let internal = nlb.scheme() == Some(&LoadBalancerSchemeEnum::Internal);
    if internal != o.internal {
        problems.push((
            annotations::field(annotations::INTERNAL),
            format!(
                "the NLB was made {}; the scheme cannot change after creation: delete the Service (or change its type away from LoadBalancer and back) to make a new NLB",
                if internal { "internal" } else { "internet-facing" }
            ),
        ));
    }
    let have: BTreeSet<&str> = nlb
        .availability_zones()
        .iter()
        .filter_map(|z| z.subnet_id())
        .collect();
    let want: BTreeSet<&str> = subnets.iter().filter_map(|s| s.subnet_id()).collect();
    if !o.subnets.is_empty() && have != want {
        problems.push((
            annotations::field(annotations::SUBNETS),
            format!(
                "the NLB is in {have:?}; this provider does not move an NLB to other subnets: recreate the Service to change them"
            ),
        ));
    }
    CloudError::none_of(problems)
}

/// Whether `nlb` is still being made.
fn is_provisioning(nlb: &Nlb) -> bool {
    nlb.state().and_then(|s| s.code()) == Some(&LoadBalancerStateEnum::Provisioning)
}

/// Refuses to go on with an NLB in the failed state.
pub(super) fn check_not_failed(nlb: &Nlb, lb_name: &str) -> Result<()> {
    let state = nlb.state();
    if state.and_then(|s| s.code()) != Some(&LoadBalancerStateEnum::Failed) {
        return Ok(());
    }
    Err(CloudError::Unavailable(format!(
        "NLB {lb_name} is in the failed state: {}",
        state.and_then(|s| s.reason()).unwrap_or("no reason given")
    )))
}

/// The status of an active NLB: its DNS name.
fn status_of(nlb: &Nlb) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: nlb
            .dns_name()
            .map(|dns| Ingress {
                hostname: dns.to_owned(),
                ..Default::default()
            })
            .into_iter()
            .collect(),
        adopted: None,
        no_effect: Vec::new(),
    }
}

/// The status to report of `nlb`: none yet while it is provisioned.
pub(super) fn reported_status(nlb: &Nlb) -> LoadBalancerStatus {
    if is_provisioning(nlb) {
        LoadBalancerStatus::default()
    } else {
        status_of(nlb)
    }
}

/// `nlb` as listed, its Service read from its tags `t`.
pub(super) fn listed(nlb: &Nlb, t: &[Tag]) -> LoadBalancer {
    LoadBalancer {
        name: nlb.load_balancer_name().unwrap_or_default().to_owned(),
        service: tags::service_of(
            tag_value(t, TAG_SERVICE_NAME),
            tag_value(t, TAG_SERVICE_UID),
        ),
        status: reported_status(nlb),
        hosts: Vec::new(),
    }
}

impl AwsCloud {
    /// The NLB named `name`, if any.
    pub(super) async fn find_nlb(&self, name: &str) -> Result<Option<Nlb>> {
        match self.elb.describe_load_balancers().names(name).send().await {
            Ok(answer) => Ok(answer.load_balancers().first().cloned()),
            Err(e) if errors::code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(errors::cloud_error("DescribeLoadBalancers", e)),
        }
    }

    /// The Service's NLB when it is this cluster's, with its tags.
    /// `Err(Conflict)` when an NLB of that name is someone else's.
    pub(super) async fn owned_nlb(
        &self,
        cluster: &str,
        name: &str,
    ) -> Result<Option<(Nlb, Vec<Tag>)>> {
        let Some(nlb) = self.find_nlb(name).await? else {
            return Ok(None);
        };
        let arn = nlb.load_balancer_arn().unwrap_or_default().to_owned();
        let mut tags = self.elb_tags(std::slice::from_ref(&arn)).await?;
        match tags.remove(&arn) {
            Some(t) if elb_belongs(&t, cluster) => Ok(Some((nlb, t))),
            _ => Err(CloudError::Conflict(format!(
                "a load balancer named {name} exists without the tag {}=owned; it is not this cluster's and is left alone",
                tags::cluster_key(cluster)
            ))),
        }
    }

    /// Every NLB of the cluster, each with its tags.
    pub(super) async fn owned_nlbs(&self, cluster: &str) -> Result<Vec<(Nlb, Vec<Tag>)>> {
        let nlbs: Vec<Nlb> = self
            .elb
            .describe_load_balancers()
            .page_size(400)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| errors::cloud_error("DescribeLoadBalancers", e))?;
        let nlbs: Vec<Nlb> = nlbs
            .into_iter()
            .filter(|l| l.r#type() == Some(&LoadBalancerTypeEnum::Network))
            .collect();
        self.owned_by(cluster, nlbs, Nlb::load_balancer_arn).await
    }

    /// The CIDRs of the subnets `nlb` is in.
    pub(super) async fn subnet_cidrs(&self, nlb: &Nlb) -> Result<Vec<String>> {
        let ids: Vec<String> = nlb
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id().map(str::to_owned))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let answer = self
            .ec2
            .describe_subnets()
            .set_subnet_ids(Some(ids))
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeSubnets", e))?;
        Ok(answer
            .subnets()
            .iter()
            .filter_map(|s| s.cidr_block().map(str::to_owned))
            .collect())
    }

    /// A new NLB in `subnets` with the security groups `groups`.
    pub(super) async fn create_nlb(
        &self,
        lb_name: &str,
        o: &LbOptions,
        subnets: &[Subnet],
        groups: &[String],
        tags: &[(String, String)],
    ) -> Result<Nlb> {
        let mappings: Vec<SubnetMapping> = subnets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                SubnetMapping::builder()
                    .subnet_id(s.subnet_id().unwrap_or_default())
                    .set_allocation_id(o.eip_allocations.get(i).cloned())
                    .set_private_ipv4_address(o.private_ipv4.get(i).map(ToString::to_string))
                    .build()
            })
            .collect();
        let answer = self
            .elb
            .create_load_balancer()
            .name(lb_name)
            .r#type(LoadBalancerTypeEnum::Network)
            .scheme(if o.internal {
                LoadBalancerSchemeEnum::Internal
            } else {
                LoadBalancerSchemeEnum::InternetFacing
            })
            .ip_address_type(if o.dualstack {
                IpAddressType::Dualstack
            } else {
                IpAddressType::Ipv4
            })
            .set_subnet_mappings(Some(mappings))
            .set_security_groups(Some(groups.to_vec()))
            .set_tags(Some(elb_tags_of(tags)))
            .send()
            .await
            .map_err(|e| errors::cloud_error("CreateLoadBalancer", e))?;
        answer.load_balancers().first().cloned().ok_or_else(|| {
            CloudError::Internal("CreateLoadBalancer answered no load balancer".into())
        })
    }

    /// Gives the NLB `arn` the security groups `groups` in place of its
    /// own (AWS keeps at least one on an NLB made with any).
    pub(super) async fn set_nlb_groups(&self, arn: &str, groups: &[String]) -> Result<()> {
        self.elb
            .set_security_groups()
            .load_balancer_arn(arn)
            .set_security_groups(Some(groups.to_vec()))
            .send()
            .await
            .map_err(|e| errors::cloud_error("SetSecurityGroups", e))?;
        Ok(())
    }

    /// The NLB's attributes as `o` asks ([`attribute_changes`]).
    pub(super) async fn sync_attributes(&self, arn: &str, o: &LbOptions) -> Result<()> {
        let have = self
            .elb
            .describe_load_balancer_attributes()
            .load_balancer_arn(arn)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeLoadBalancerAttributes", e))?;
        let changes = attribute_changes(o, have.attributes());
        if changes.is_empty() {
            return Ok(());
        }
        self.elb
            .modify_load_balancer_attributes()
            .load_balancer_arn(arn)
            .set_attributes(Some(
                changes
                    .into_iter()
                    .map(|(k, v)| LoadBalancerAttribute::builder().key(k).value(v).build())
                    .collect(),
            ))
            .send()
            .await
            .map_err(|e| errors::cloud_error("ModifyLoadBalancerAttributes", e))?;
        Ok(())
    }

    /// The status of `nlb` once it is active. One being provisioned is
    /// asked about once more, as it may have become active meanwhile;
    /// still provisioning, it is `Provisioning` for the caller to retry.
    pub(super) async fn status_when_active(
        &self,
        nlb: &Nlb,
        lb_name: &str,
    ) -> Result<LoadBalancerStatus> {
        if !is_provisioning(nlb) {
            return Ok(status_of(nlb));
        }
        if let Some(now) = self.find_nlb(lb_name).await?
            && !is_provisioning(&now)
        {
            return Ok(status_of(&now));
        }
        Err(errors::provisioning(format!(
            "NLB {lb_name} is being provisioned"
        )))
    }

    /// Deletes `nlb`; one already gone is fine.
    pub(super) async fn delete_nlb(&self, nlb: &Nlb, lb_name: &str) -> Result<()> {
        match self
            .elb
            .delete_load_balancer()
            .load_balancer_arn(nlb.load_balancer_arn().unwrap_or_default())
            .send()
            .await
        {
            Ok(_) => tracing::info!(nlb = %lb_name, "deleted NLB"),
            Err(e) if errors::code(&e) == Some("LoadBalancerNotFound") => {}
            Err(e) => return Err(errors::cloud_error("DeleteLoadBalancer", e)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_elasticloadbalancingv2::types::{AvailabilityZone, LoadBalancerState};

    fn nlb(state: LoadBalancerStateEnum) -> Nlb {
        Nlb::builder()
            .load_balancer_name("a1234abcd12ab34cd56ef1234567890")
            .dns_name("a1234.elb.example")
            .scheme(LoadBalancerSchemeEnum::InternetFacing)
            .availability_zones(AvailabilityZone::builder().subnet_id("subnet-a").build())
            .state(LoadBalancerState::builder().code(state).build())
            .build()
    }

    fn tag(key: &str, value: &str) -> Tag {
        Tag::builder().key(key).value(value).build()
    }

    #[test]
    fn the_scheme_and_named_subnets_cannot_change_after_creation() {
        let made = nlb(LoadBalancerStateEnum::Active);
        let same = [Subnet::builder().subnet_id("subnet-a").build()];
        assert!(check_immutable(&made, &LbOptions::default(), &[]).is_ok());
        let internal = LbOptions {
            internal: true,
            ..Default::default()
        };
        let Err(CloudError::InvalidArgument(problems)) = check_immutable(&made, &internal, &same)
        else {
            panic!("a scheme change must be refused");
        };
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, annotations::field(annotations::INTERNAL));
        let moved = LbOptions {
            subnets: vec!["subnet-b".into()],
            ..Default::default()
        };
        let other = [Subnet::builder().subnet_id("subnet-b").build()];
        assert!(check_immutable(&made, &moved, &other).is_err());
        assert!(check_immutable(&made, &moved, &same).is_ok());
    }

    #[test]
    fn a_listed_nlb_names_its_service_from_its_tags_and_has_no_status_while_provisioning() {
        let tags = [
            tag(TAG_SERVICE_NAME, "shop/web"),
            tag(TAG_SERVICE_UID, "1234abcd-12ab-34cd-56ef-1234567890ab"),
        ];
        let active = listed(&nlb(LoadBalancerStateEnum::Active), &tags);
        assert_eq!(active.service.namespace, "shop");
        assert_eq!(active.service.name, "web");
        assert_eq!(active.service.uid, "1234abcd-12ab-34cd-56ef-1234567890ab");
        assert_eq!(active.status.ingress[0].hostname, "a1234.elb.example");
        let new = listed(&nlb(LoadBalancerStateEnum::Provisioning), &tags);
        assert_eq!(new.status, LoadBalancerStatus::default());
    }

    #[test]
    fn a_requested_address_and_client_affinity_are_refused_together() {
        assert!(refuse_unsupported(&LoadBalancerSpec::default()).is_ok());
        let spec = LoadBalancerSpec {
            load_balancer_ip: "203.0.113.9".into(),
            session_affinity: SessionAffinity::ClientIp,
            ..Default::default()
        };
        let Err(CloudError::InvalidArgument(problems)) = refuse_unsupported(&spec) else {
            panic!("both must be refused");
        };
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fields, ["spec.load_balancer_ip", "spec.session_affinity"]);
    }

    #[test]
    fn a_failed_nlb_stops_the_ensure_with_its_reason() {
        assert!(check_not_failed(&nlb(LoadBalancerStateEnum::Active), "a").is_ok());
        let err = check_not_failed(&nlb(LoadBalancerStateEnum::Failed), "a").unwrap_err();
        assert!(err.to_string().contains("no reason given"), "{err}");
    }

    #[test]
    fn attributes_follow_the_annotations_and_go_off_without_them() {
        let attr = |k: &str, v: &str| LoadBalancerAttribute::builder().key(k).value(v).build();
        let off = [attr(CROSS_ZONE, "false"), attr(ACCESS_LOGS, "false")];
        assert!(attribute_changes(&LbOptions::default(), &off).is_empty());
        assert!(
            attribute_changes(&LbOptions::default(), &[]).is_empty(),
            "absent is off"
        );
        let logs = LbOptions {
            access_log: Some(crate::annotations::AccessLog {
                enabled: true,
                bucket: Some("logs".into()),
                prefix: Some("nlb".into()),
                interval: None,
            }),
            cross_zone: Some(true),
            ..Default::default()
        };
        let changes = attribute_changes(&logs, &off);
        assert_eq!(
            changes,
            [
                (CROSS_ZONE, "true".to_owned()),
                (ACCESS_LOGS, "true".to_owned()),
                (ACCESS_LOGS_BUCKET, "logs".to_owned()),
                (ACCESS_LOGS_PREFIX, "nlb".to_owned()),
            ]
        );
        let on = [
            attr(CROSS_ZONE, "true"),
            attr(ACCESS_LOGS, "true"),
            attr(ACCESS_LOGS_BUCKET, "logs"),
        ];
        assert_eq!(
            attribute_changes(&LbOptions::default(), &on),
            [
                (CROSS_ZONE, "false".to_owned()),
                (ACCESS_LOGS, "false".to_owned())
            ],
            "the bucket is left once logs are off"
        );
    }
}
