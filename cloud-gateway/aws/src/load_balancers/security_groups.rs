//! Security groups, whatever the kind of load balancer: the load
//! balancer's own group (made, found, deleted), its rules, and the nodes'
//! groups (each instance's group tagged for the cluster, or its only one)
//! opened to it and closed again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_ec2::types::{
    Instance as Ec2Instance, IpPermission, ResourceType, SecurityGroup, Tag, TagSpecification,
};
use ccm_provider::{CloudError, Result};

use super::ingress_rules::{Rule, permission, rules_from};
use crate::tags::{self, FILTER_VALUES};
use crate::{AwsCloud, errors};

/// The name of a load balancer's own security group.
fn security_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

/// The groups among `groups` that admit load balancer traffic to
/// `targets`: each instance's group tagged for the cluster, or its only
/// group. An instance with neither is left out, with a warning.
fn node_groups_of(
    cluster: &str,
    targets: &[Ec2Instance],
    groups: &[SecurityGroup],
) -> Vec<SecurityGroup> {
    let by_id: HashMap<&str, &SecurityGroup> = groups
        .iter()
        .filter_map(|g| Some((g.group_id()?, g)))
        .collect();
    let mut chosen: BTreeMap<String, SecurityGroup> = BTreeMap::new();
    for instance in targets {
        let mine: Vec<&SecurityGroup> = instance
            .security_groups()
            .iter()
            .filter_map(|g| by_id.get(g.group_id()?).copied())
            .collect();
        let tagged: Vec<&&SecurityGroup> = mine
            .iter()
            .filter(|g| tags::belongs_to(g.tags(), cluster))
            .collect();
        let pick = match (tagged.as_slice(), mine.as_slice()) {
            ([one], _) => Some(**one),
            ([], [only]) => Some(*only),
            _ => {
                tracing::warn!(
                    instance = instance.instance_id().unwrap_or_default(),
                    "no single security group of the instance is tagged for the cluster; load balancer traffic to it is not opened"
                );
                None
            }
        };
        if let Some(g) = pick
            && let Some(id) = g.group_id()
        {
            chosen.insert(id.to_owned(), g.clone());
        }
    }
    chosen.into_values().collect()
}

impl AwsCloud {
    /// The own security group of the load balancer `lb_name` of the kind
    /// `kind` (e.g. `NLB`), made when missing.
    pub(super) async fn load_balancer_group(
        &self,
        cluster: &str,
        kind: &str,
        lb_name: &str,
        vpc: &str,
        tags: &[(String, String)],
    ) -> Result<SecurityGroup> {
        let name = security_group_name(lb_name);
        if let Some(group) = self.find_security_group(cluster, vpc, &name).await? {
            return Ok(group);
        }
        let tags: Vec<Tag> = tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        self.ec2
            .create_security_group()
            .group_name(&name)
            .description(format!("{kind} {lb_name} of Kubernetes cluster {cluster}"))
            .vpc_id(vpc)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::SecurityGroup)
                    .set_tags(Some(tags))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| errors::cloud_error("CreateSecurityGroup", e))?;
        self.find_security_group(cluster, vpc, &name)
            .await?
            .ok_or_else(|| {
                CloudError::Unavailable(format!("security group {name} not visible yet"))
            })
    }

    /// The group named `name` in `vpc`, when it is this cluster's.
    async fn find_security_group(
        &self,
        cluster: &str,
        vpc: &str,
        name: &str,
    ) -> Result<Option<SecurityGroup>> {
        let answer = self
            .ec2
            .describe_security_groups()
            .filters(tags::filter("vpc-id", [vpc]))
            .filters(tags::filter("group-name", [name]))
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeSecurityGroups", e))?;
        match answer.security_groups().first() {
            Some(g) if tags::belongs_to(g.tags(), cluster) => Ok(Some(g.clone())),
            Some(_) => Err(CloudError::Conflict(format!(
                "security group {name} in {vpc} is not tagged for cluster {cluster}; it is left alone"
            ))),
            None => Ok(None),
        }
    }

    /// Brings `group`'s rules from `have` to `want`. Callers pass as
    /// `have` only rules that are theirs to revoke.
    pub(super) async fn sync_rules(
        &self,
        group: &str,
        have: &BTreeSet<Rule>,
        want: &BTreeSet<Rule>,
    ) -> Result<()> {
        let add: Vec<IpPermission> = want.difference(have).map(permission).collect();
        let remove: Vec<IpPermission> = have.difference(want).map(permission).collect();
        if !add.is_empty() {
            match self
                .ec2
                .authorize_security_group_ingress()
                .group_id(group)
                .set_ip_permissions(Some(add))
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if errors::code(&e) == Some("InvalidPermission.Duplicate") => {}
                Err(e) => return Err(errors::cloud_error("AuthorizeSecurityGroupIngress", e)),
            }
        }
        if !remove.is_empty() {
            match self
                .ec2
                .revoke_security_group_ingress()
                .group_id(group)
                .set_ip_permissions(Some(remove))
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if errors::code(&e) == Some("InvalidPermission.NotFound") => {}
                Err(e) => return Err(errors::cloud_error("RevokeSecurityGroupIngress", e)),
            }
        }
        Ok(())
    }

    /// The groups of the targets that admit load balancer traffic: each
    /// instance's group tagged for the cluster, or its only group.
    async fn node_groups(
        &self,
        cluster: &str,
        targets: &[Ec2Instance],
    ) -> Result<Vec<SecurityGroup>> {
        let ids: BTreeSet<&str> = targets
            .iter()
            .flat_map(|i| i.security_groups().iter().filter_map(|g| g.group_id()))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut groups = Vec::new();
        let ids: Vec<&str> = ids.into_iter().collect();
        for chunk in ids.chunks(FILTER_VALUES) {
            let answer = self
                .ec2
                .describe_security_groups()
                .filters(tags::filter("group-id", chunk.iter().copied()))
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeSecurityGroups", e))?;
            groups.extend(answer.security_groups().iter().cloned());
        }
        Ok(node_groups_of(cluster, targets, &groups))
    }

    /// Opens the nodes' groups to the load balancer's group `lb_group`
    /// (and closes what they open to it that is no longer needed, among
    /// the rules `ours` says the caller manages).
    pub(super) async fn open_nodes(
        &self,
        cluster: &str,
        lb_group: &str,
        targets: &[Ec2Instance],
        want: &BTreeSet<Rule>,
        ours: fn(&Rule) -> bool,
    ) -> Result<()> {
        for group in self.node_groups(cluster, targets).await? {
            let Some(id) = group.group_id() else { continue };
            let have: BTreeSet<Rule> = rules_from(&group, lb_group)
                .into_iter()
                .filter(ours)
                .collect();
            self.sync_rules(id, &have, want).await?;
        }
        Ok(())
    }

    /// Removes every rule in the VPC's groups that names `lb_group`.
    async fn close_nodes(&self, vpc: &str, lb_group: &str) -> Result<()> {
        let answer = self
            .ec2
            .describe_security_groups()
            .filters(tags::filter("vpc-id", [vpc]))
            .filters(tags::filter("ip-permission.group-id", [lb_group]))
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeSecurityGroups", e))?;
        for group in answer.security_groups() {
            let Some(id) = group.group_id() else { continue };
            if id == lb_group {
                continue;
            }
            self.sync_rules(id, &rules_from(group, lb_group), &BTreeSet::new())
                .await?;
        }
        Ok(())
    }

    /// Closes the nodes' groups to the own group of the load balancer
    /// `lb_name` of the kind `kind`, then deletes it; another cluster's
    /// group of that name is left alone.
    pub(super) async fn delete_load_balancer_group(
        &self,
        cluster: &str,
        kind: &str,
        lb_name: &str,
        vpc: &str,
    ) -> Result<()> {
        let name = security_group_name(lb_name);
        let group = match self.find_security_group(cluster, vpc, &name).await {
            Ok(Some(group)) => group,
            Ok(None) => return Ok(()),
            // Another cluster's: not ours to delete.
            Err(CloudError::Conflict(why)) => {
                tracing::warn!(group = %name, "{why}");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let id = group.group_id().unwrap_or_default().to_owned();
        self.close_nodes(vpc, &id).await?;
        match self.ec2.delete_security_group().group_id(&id).send().await {
            Ok(_) => Ok(()),
            Err(e) if errors::code(&e) == Some("InvalidGroup.NotFound") => Ok(()),
            // The load balancer's network interfaces go a while after it.
            Err(e) if errors::code(&e) == Some("DependencyViolation") => Err(errors::provisioning(
                format!("security group {id} is still in use while {kind} {lb_name} goes"),
            )),
            Err(e) => Err(errors::cloud_error("DeleteSecurityGroup", e)),
        }
    }
}
