//! Where a load balancer goes, whatever its kind: its VPC (the configured
//! one, else that of its targets) and its subnets (those the annotation
//! names, else one per zone as cloud-provider-aws picks them: the
//! cluster's or no cluster's, public for an internet-facing one, the role
//! tag deciding between several).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_ec2::types::{Filter, Instance as Ec2Instance, RouteTable, Subnet};
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

/// The zone type of the zones a Network or Classic load balancer can use
/// (not Local, Wavelength or Outpost zones).
const REGULAR_ZONE: &str = "availability-zone";

/// Whether the subnet `id` routes to an internet gateway, through the route
/// table associated with it or else the VPC's main table: AWS's own meaning
/// of a public subnet, and upstream's test for one.
fn is_public(tables: &[RouteTable], id: &str) -> bool {
    let associated = tables
        .iter()
        .find(|t| t.associations().iter().any(|a| a.subnet_id() == Some(id)));
    let main = || {
        tables
            .iter()
            .find(|t| t.associations().iter().any(|a| a.main() == Some(true)))
    };
    associated.or_else(main).is_some_and(|t| {
        t.routes()
            .iter()
            .any(|r| r.gateway_id().is_some_and(|g| g.starts_with("igw-")))
    })
}

/// One subnet per zone, chosen as cloud-provider-aws chooses: among the
/// subnets tagged for `cluster` or for no cluster at all (and, for an
/// internet-facing load balancer, public by `tables`), the one with the
/// role tag, then the one tagged for the cluster, then the lowest ID.
/// Stricter than upstream: a subnet whose legacy tag names another cluster
/// is that cluster's, and Outpost subnets are left out. `tables` is `None`
/// for an internal load balancer, which takes private and public subnets
/// alike.
fn one_per_zone(
    candidates: Vec<Subnet>,
    tables: Option<&[RouteTable]>,
    cluster: &str,
) -> BTreeMap<String, Subnet> {
    let role = if tables.is_none() {
        ROLE_INTERNAL
    } else {
        ROLE_PUBLIC
    };
    // Per zone: the best so far, ranked (role tag, cluster tag, lower ID).
    type Rank = (bool, bool, Reverse<String>);
    let mut by_zone: BTreeMap<String, (Rank, Subnet)> = BTreeMap::new();
    for s in candidates {
        let tags = s.tags();
        let ours = tags::belongs_to(tags, cluster);
        // No cluster's: upstream reads only the current tag here; a legacy
        // tag naming another cluster makes the subnet that cluster's too.
        let untagged = !tags.iter().any(|t| {
            t.key().is_some_and(|k| {
                k.starts_with(tags::CLUSTER_TAG_PREFIX) || k == tags::LEGACY_CLUSTER_TAG
            })
        });
        let (Some(zone), Some(id)) = (s.availability_zone(), s.subnet_id()) else {
            continue;
        };
        // An Outpost's subnet is in its parent zone, but no NLB or Classic
        // ELB runs there.
        let on_outpost = s.outpost_arn().is_some_and(|a| !a.is_empty());
        if !(ours || untagged) || on_outpost || tables.is_some_and(|t| !is_public(t, id)) {
            continue;
        }
        let has_role = tags.iter().any(|t| t.key() == Some(role));
        let rank = (has_role, ours, Reverse(id.to_owned()));
        if by_zone.get(zone).is_none_or(|(best, _)| rank > *best) {
            by_zone.insert(zone.to_owned(), (rank, s.clone()));
        }
    }
    by_zone.into_iter().map(|(z, (_, s))| (z, s)).collect()
}

/// The subnets of `by_zone` in zones whose type (in `types`, by zone name)
/// is a regular availability zone's; a zone of unknown type is kept.
fn in_regular_zones(
    by_zone: BTreeMap<String, Subnet>,
    types: &HashMap<String, String>,
) -> Vec<Subnet> {
    by_zone
        .into_iter()
        .filter(|(zone, _)| types.get(zone).is_none_or(|t| t == REGULAR_ZONE))
        .map(|(_, s)| s)
        .collect()
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
    /// order, or one per regular zone chosen as [`one_per_zone`] tells.
    async fn subnets(&self, cluster: &str, vpc: &str, o: &LbOptions) -> Result<Vec<Subnet>> {
        if !o.subnets.is_empty() {
            return self.named_subnets(vpc, &o.subnets).await;
        }
        let candidates = self
            .describe_subnets(vec![tags::filter("vpc-id", [vpc])])
            .await?;
        let tables = if o.internal {
            None
        } else {
            Some(
                self.route_tables_where(None, vec![tags::filter("vpc-id", [vpc])])
                    .await?,
            )
        };
        let by_zone = one_per_zone(candidates, tables.as_deref(), cluster);
        let types = self
            .zone_types(&by_zone.keys().map(String::as_str).collect())
            .await?;
        let chosen = in_regular_zones(by_zone, &types);
        if chosen.is_empty() {
            let which = if o.internal {
                "a subnet"
            } else {
                "a public subnet (one whose route table sends traffic to an internet gateway)"
            };
            return Err(CloudError::NotConfigured(format!(
                "{vpc} has no {which} in an availability zone that is tagged {} or for no cluster; add one, or name subnets with {}",
                tags::cluster_key(cluster),
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
    use aws_sdk_ec2::types::{Route, RouteTableAssociation, Tag};

    fn subnet(id: &str, zone: &str, tags: &[(&str, &str)]) -> Subnet {
        let mut b = Subnet::builder().subnet_id(id).availability_zone(zone);
        for (k, v) in tags {
            b = b.tags(Tag::builder().key(*k).value(*v).build());
        }
        b.build()
    }

    fn table(subnets: &[&str], main: bool, igw: bool) -> RouteTable {
        let mut b = RouteTable::builder();
        for s in subnets {
            b = b.associations(RouteTableAssociation::builder().subnet_id(*s).build());
        }
        if main {
            b = b.associations(RouteTableAssociation::builder().main(true).build());
        }
        b = b.routes(Route::builder().gateway_id("local").build());
        if igw {
            b = b.routes(Route::builder().gateway_id("igw-1").build());
        }
        b.build()
    }

    fn chosen(by_zone: BTreeMap<String, Subnet>) -> Vec<String> {
        by_zone
            .values()
            .filter_map(|s| s.subnet_id().map(str::to_owned))
            .collect()
    }

    #[test]
    fn each_zone_gets_the_role_tagged_then_the_clusters_then_the_lowest_id() {
        let ours = ("kubernetes.io/cluster/c", "shared");
        let candidates = vec![
            // z1: the role tag wins over the cluster tag and a lower ID
            // (any value: upstream reads the tag's presence).
            subnet("subnet-a", "z1", &[ours]),
            subnet("subnet-b", "z1", &[(ROLE_PUBLIC, "")]),
            // z2: without role tags, the cluster's wins.
            subnet("subnet-c", "z2", &[]),
            subnet("subnet-d", "z2", &[ours]),
            // z3: the lowest ID; another cluster's never, even role-tagged.
            subnet("subnet-f", "z3", &[]),
            subnet("subnet-e", "z3", &[("Name", "x")]),
            subnet(
                "subnet-0",
                "z3",
                &[(ROLE_PUBLIC, "1"), ("kubernetes.io/cluster/other", "owned")],
            ),
            // The legacy tag naming this cluster counts as its tag; one
            // naming another cluster makes the subnet that cluster's.
            subnet("subnet-h", "z4", &[]),
            subnet("subnet-g", "z4", &[("KubernetesCluster", "c")]),
            subnet("subnet-0", "z4", &[("KubernetesCluster", "other")]),
        ];
        let all = table(&[], true, true);
        // An Outpost's subnet is never taken, whatever its tags.
        let mut candidates = candidates;
        let mut outpost = subnet("subnet-00", "z1", &[(ROLE_PUBLIC, "1")]);
        outpost.outpost_arn = Some("arn:aws:outposts:eu-west-1:1:outpost/op-1".into());
        candidates.push(outpost);
        let picked = one_per_zone(candidates.clone(), Some(&[all]), "c");
        assert_eq!(
            chosen(picked),
            ["subnet-b", "subnet-d", "subnet-e", "subnet-g"]
        );
        // Internal load balancers read the internal role tag instead.
        let internal = one_per_zone(candidates, None, "c");
        assert_eq!(
            chosen(internal),
            ["subnet-a", "subnet-d", "subnet-e", "subnet-g"]
        );
    }

    #[test]
    fn an_internet_facing_load_balancer_takes_only_subnets_routed_to_an_internet_gateway() {
        let candidates = vec![
            subnet("subnet-a", "z1", &[(ROLE_PUBLIC, "1")]),
            subnet("subnet-b", "z1", &[]),
            subnet("subnet-c", "z2", &[(ROLE_PUBLIC, "1")]),
            subnet("subnet-d", "z3", &[]),
        ];
        // subnet-a has a private table of its own; subnet-c and subnet-d
        // fall to the main table, public; subnet-b has a public table.
        let tables = [
            table(&["subnet-a"], false, false),
            table(&["subnet-b"], false, true),
            table(&[], true, true),
        ];
        let picked = one_per_zone(candidates.clone(), Some(&tables), "c");
        assert_eq!(chosen(picked), ["subnet-b", "subnet-c", "subnet-d"]);
        // A private main table leaves only the explicitly public subnet.
        let tables = [
            table(&["subnet-a"], false, false),
            table(&["subnet-b"], false, true),
            table(&[], true, false),
        ];
        assert_eq!(
            chosen(one_per_zone(candidates, Some(&tables), "c")),
            ["subnet-b"]
        );
    }

    #[test]
    fn local_and_wavelength_zones_are_skipped() {
        let by_zone: BTreeMap<String, Subnet> = ["z1", "z1-lax-1a", "z1-wl1", "z9"]
            .iter()
            .enumerate()
            .map(|(i, z)| (z.to_string(), subnet(&format!("subnet-{i}"), z, &[])))
            .collect();
        let types: HashMap<String, String> = [
            ("z1", "availability-zone"),
            ("z1-lax-1a", "local-zone"),
            ("z1-wl1", "wavelength-zone"),
        ]
        .iter()
        .map(|(z, t)| (z.to_string(), t.to_string()))
        .collect();
        let kept = in_regular_zones(by_zone, &types);
        let kept: Vec<&str> = kept.iter().filter_map(|s| s.availability_zone()).collect();
        assert_eq!(kept, ["z1", "z9"], "z9's type is unknown: kept");
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
