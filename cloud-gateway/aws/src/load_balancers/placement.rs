//! Where a load balancer goes, whatever its kind: its VPC (the configured
//! one, else that of its targets) and its subnets (those the annotation
//! names, else one per zone among the subnets tagged for its scheme).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{Filter, Instance as Ec2Instance, Subnet};
use ccm_provider::{CloudError, Result};

use crate::annotations::{self, LbOptions};
use crate::{AwsCloud, errors, tags};

/// The subnet role tag of internal load balancers.
const ROLE_INTERNAL: &str = "kubernetes.io/role/internal-elb";
/// The subnet role tag of internet-facing load balancers.
const ROLE_PUBLIC: &str = "kubernetes.io/role/elb";

/// A load balancer's VPC and subnets.
#[derive(Clone, Debug)]
pub(super) struct Placement {
    pub(super) vpc: String,
    /// Empty for a load balancer that exists when the annotation names no
    /// subnets: there is nothing to make or to check them against.
    pub(super) subnets: Vec<Subnet>,
}

/// The subnet among `found` with the ID or Name tag `wanted`.
fn named_subnet(found: &[Subnet], wanted: &str, vpc: &str) -> Result<Subnet> {
    let matching: Vec<&Subnet> = found
        .iter()
        .filter(|s| {
            s.subnet_id() == Some(wanted)
                || s.tags()
                    .iter()
                    .any(|t| t.key() == Some("Name") && t.value() == Some(wanted))
        })
        .collect();
    match matching.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(CloudError::invalid(
            annotations::field(annotations::SUBNETS),
            format!("no subnet {wanted:?} in {vpc}"),
        )),
        _ => Err(CloudError::invalid(
            annotations::field(annotations::SUBNETS),
            format!("several subnets in {vpc} are named {wanted:?}; use IDs"),
        )),
    }
}

/// One subnet per zone among `candidates` with the role tag `role` on and
/// no other cluster's tag: one tagged for `cluster` where a zone has one,
/// else the one with the lowest ID.
fn one_per_zone(candidates: Vec<Subnet>, cluster: &str, role: &str) -> Vec<Subnet> {
    let mut by_zone: BTreeMap<String, (bool, String, Subnet)> = BTreeMap::new();
    let ours_key = tags::cluster_key(cluster);
    for s in candidates {
        let tags = s.tags();
        let role_on = tags
            .iter()
            .any(|t| t.key() == Some(role) && matches!(t.value(), Some("" | "1")));
        let other_cluster = tags.iter().any(|t| {
            t.key()
                .is_some_and(|k| k.starts_with(tags::CLUSTER_TAG_PREFIX) && k != ours_key.as_str())
        });
        if !role_on || other_cluster {
            continue;
        }
        let ours = tags::belongs_to(tags, cluster);
        let (Some(zone), Some(id)) = (s.availability_zone(), s.subnet_id()) else {
            continue;
        };
        let better = by_zone.get(zone).is_none_or(|(o, i, _)| {
            (ours, std::cmp::Reverse(id)) > (*o, std::cmp::Reverse(i.as_str()))
        });
        if better {
            by_zone.insert(zone.to_owned(), (ours, id.to_owned(), s.clone()));
        }
    }
    by_zone.into_values().map(|(_, _, s)| s).collect()
}

impl AwsCloud {
    /// Where the load balancer goes. `existing_vpc` is the VPC of the load
    /// balancer when it exists already; its subnets are then read only
    /// when the annotation names them, to check they did not change.
    pub(super) async fn placement(
        &self,
        cluster: &str,
        existing_vpc: Option<&str>,
        targets: &[Ec2Instance],
        o: &LbOptions,
    ) -> Result<Placement> {
        let vpc = match existing_vpc {
            Some(vpc) => vpc.to_owned(),
            None => self.vpc_of(targets)?,
        };
        let subnets = match (existing_vpc, o.subnets.is_empty()) {
            (Some(_), true) => Vec::new(),
            _ => self.subnets(cluster, &vpc, o).await?,
        };
        Ok(Placement { vpc, subnets })
    }

    /// The VPC: the configured one, else that of the targets.
    fn vpc_of(&self, targets: &[Ec2Instance]) -> Result<String> {
        if let Some(vpc) = &self.settings.vpc_id {
            return Ok(vpc.clone());
        }
        let vpcs: BTreeSet<&str> = targets.iter().filter_map(|i| i.vpc_id()).collect();
        match vpcs.len() {
            1 => Ok(vpcs.into_iter().next().unwrap_or_default().to_owned()),
            0 => Err(CloudError::NotConfigured(
                "no running target instance tells the cluster's VPC; set --aws-vpc-id".into(),
            )),
            _ => Err(CloudError::NotConfigured(format!(
                "the targets are in several VPCs ({vpcs:?}); set --aws-vpc-id"
            ))),
        }
    }

    /// The load balancer's subnets: those named by the annotation, in its
    /// order, or one per zone among the VPC's subnets with the role tag for
    /// the scheme, preferring those tagged for this cluster and never those
    /// tagged for another.
    async fn subnets(&self, cluster: &str, vpc: &str, o: &LbOptions) -> Result<Vec<Subnet>> {
        if !o.subnets.is_empty() {
            return self.named_subnets(vpc, &o.subnets).await;
        }
        let role = if o.internal {
            ROLE_INTERNAL
        } else {
            ROLE_PUBLIC
        };
        let candidates = self
            .describe_subnets(vec![
                tags::filter("vpc-id", [vpc]),
                tags::filter("tag-key", [role]),
            ])
            .await?;
        let chosen = one_per_zone(candidates, cluster, role);
        if chosen.is_empty() {
            return Err(CloudError::NotConfigured(format!(
                "no subnet in {vpc} carries the tag {role}=1 (and no other cluster's tag); tag one per zone, or name them with {}",
                annotations::SUBNETS
            )));
        }
        Ok(chosen)
    }

    /// The subnets of `vpc` that `wanted` names by ID or Name tag, in its
    /// order.
    async fn named_subnets(&self, vpc: &str, wanted: &[String]) -> Result<Vec<Subnet>> {
        let vpc_filter = tags::filter("vpc-id", [vpc]);
        let (ids, names): (Vec<&String>, Vec<&String>) =
            wanted.iter().partition(|s| s.starts_with("subnet-"));
        let mut found = Vec::new();
        if !ids.is_empty() {
            found.extend(
                self.describe_subnets(vec![
                    vpc_filter.clone(),
                    tags::filter("subnet-id", ids.iter().map(|s| s.as_str())),
                ])
                .await?,
            );
        }
        if !names.is_empty() {
            found.extend(
                self.describe_subnets(vec![
                    vpc_filter.clone(),
                    tags::filter("tag:Name", names.iter().map(|s| s.as_str())),
                ])
                .await?,
            );
        }
        wanted
            .iter()
            .map(|w| named_subnet(&found, w, vpc))
            .collect()
    }

    /// The subnets matching `filters`.
    async fn describe_subnets(&self, filters: Vec<Filter>) -> Result<Vec<Subnet>> {
        self.ec2
            .describe_subnets()
            .set_filters(Some(filters))
            .send()
            .await
            .map(|a| a.subnets().to_vec())
            .map_err(|e| errors::cloud_error("DescribeSubnets", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::Tag;

    fn subnet(id: &str, zone: &str, tags: &[(&str, &str)]) -> Subnet {
        let mut b = Subnet::builder().subnet_id(id).availability_zone(zone);
        for (k, v) in tags {
            b = b.tags(Tag::builder().key(*k).value(*v).build());
        }
        b.build()
    }

    fn ids(subnets: &[Subnet]) -> Vec<&str> {
        subnets.iter().filter_map(|s| s.subnet_id()).collect()
    }

    #[test]
    fn each_zone_gets_the_clusters_subnet_else_the_lowest_id_never_another_clusters() {
        let role = (ROLE_PUBLIC, "1");
        let candidates = vec![
            subnet("subnet-b", "z1", &[role]),
            subnet("subnet-a", "z1", &[role]),
            subnet("subnet-c", "z2", &[role]),
            subnet(
                "subnet-d",
                "z2",
                &[role, ("kubernetes.io/cluster/c", "owned")],
            ),
            subnet(
                "subnet-0",
                "z3",
                &[role, ("kubernetes.io/cluster/other", "owned")],
            ),
            subnet("subnet-1", "z3", &[(ROLE_PUBLIC, "0")]),
        ];
        let chosen = one_per_zone(candidates, "c", ROLE_PUBLIC);
        assert_eq!(ids(&chosen), ["subnet-a", "subnet-d"]);
    }

    #[test]
    fn a_named_subnet_is_found_by_id_or_name_and_must_be_one() {
        let found = vec![
            subnet("subnet-a", "z1", &[("Name", "web")]),
            subnet("subnet-b", "z2", &[("Name", "db")]),
            subnet("subnet-c", "z3", &[("Name", "db")]),
        ];
        let by_name = named_subnet(&found, "web", "vpc-1").unwrap();
        assert_eq!(by_name.subnet_id(), Some("subnet-a"));
        let by_id = named_subnet(&found, "subnet-b", "vpc-1").unwrap();
        assert_eq!(by_id.subnet_id(), Some("subnet-b"));
        let err = named_subnet(&found, "db", "vpc-1").unwrap_err();
        assert!(err.to_string().contains("use IDs"), "{err}");
        let err = named_subnet(&found, "nope", "vpc-1").unwrap_err();
        assert!(err.to_string().contains("no subnet"), "{err}");
    }
}
