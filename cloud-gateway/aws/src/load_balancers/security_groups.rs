//! Security groups, whatever the kind of load balancer: the load
//! balancer's own group (made, found, deleted), its rules, and the nodes'
//! groups (each instance's group tagged for the cluster, or its only one)
//! opened to it and closed again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_ec2::types::{
    Instance as Ec2Instance, IpPermission, ResourceType, SecurityGroup, Tag, TagSpecification,
};
use ccm_provider::{CloudError, Result, ServiceRef};

use super::cidr_rules::{self, MTU, mtu_rules};
use super::ingress_rules::{Rule, described_rules, permission, rules_from};
use crate::tags::{self, FILTER_VALUES, ServedBy};
use crate::{AwsCloud, errors};

/// The name of a load balancer's own security group.
pub(super) fn security_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

/// Whether the load balancer group `g` (named after a load balancer) is
/// `service`'s: its Service tags name it, or, with none (cloud-provider-aws
/// tags its Classic ELBs' groups for the cluster only), its description
/// ends with the Service's `(namespace/name)`, as upstream writes it.
/// `Err(Conflict)` naming whose it is otherwise.
fn check_group_serves(g: &SecurityGroup, service: &ServiceRef) -> Result<()> {
    let value = |key: &str| {
        g.tags()
            .iter()
            .find(|t| t.key() == Some(key))
            .and_then(|t| t.value())
    };
    let whose = match tags::served_by(
        value(tags::TAG_SERVICE_NAME),
        value(tags::TAG_SERVICE_UID),
        service,
    ) {
        ServedBy::This => return Ok(()),
        ServedBy::Unnamed
            if g.description().is_some_and(|d| {
                d.ends_with(&format!("({}/{})", service.namespace, service.name))
            }) =>
        {
            return Ok(());
        }
        ServedBy::Another(whose) => whose,
        ServedBy::Unnamed => format!(
            "no Service its tags or description name ({:?})",
            g.description().unwrap_or_default()
        ),
    };
    Err(CloudError::Conflict(format!(
        "security group {} ({}) is {whose}'s, not Service {}/{}'s; it is left alone",
        g.group_id().unwrap_or_default(),
        g.group_name().unwrap_or_default(),
        service.namespace,
        service.name
    )))
}

/// The name cloud-provider-aws gives the security group it makes for an
/// NLB in its "Managed" mode: its name prefix and the first 10 hex
/// digits of the SHA-256 of the cluster's name, the Service's name,
/// namespace and UID, written one after the other.
pub(super) fn upstream_nlb_group_name(cluster: &str, service: &ServiceRef) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!(
            "{cluster}{}{}{}",
            service.name, service.namespace, service.uid
        )
        .as_bytes(),
    );
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{}{}", tags::upstream_name_prefix(service), &hex[..10])
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
    /// The own security group of `service`'s load balancer `lb_name` of
    /// the kind `kind` (e.g. `NLB`), made when missing. `Conflict` when a
    /// group of its name is another Service's.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn load_balancer_group(
        &self,
        cluster: &str,
        kind: &str,
        lb_name: &str,
        vpc: &str,
        tags: &[(String, String)],
        service: &ServiceRef,
    ) -> Result<SecurityGroup> {
        let name = security_group_name(lb_name);
        if let Some(group) = self.find_security_group(cluster, vpc, &name).await? {
            check_group_serves(&group, service)?;
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

    /// The group `id`, when it is this cluster's.
    pub(super) async fn owned_group(
        &self,
        cluster: &str,
        id: &str,
    ) -> Result<Option<SecurityGroup>> {
        let answer = self
            .ec2
            .describe_security_groups()
            .filters(tags::filter("group-id", [id]))
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeSecurityGroups", e))?;
        Ok(answer
            .security_groups()
            .first()
            .filter(|g| tags::belongs_to(g.tags(), cluster))
            .cloned())
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

    /// Opens the nodes' groups to an NLB: to its group `by_group` with the
    /// rules given there, and by CIDR with the rules `by_cidr` (those of
    /// an NLB without a group, described as upstream describes them; none
    /// when it has one, which strips upstream's from an NLB now ours).
    pub(super) async fn open_nodes_to_nlb(
        &self,
        cluster: &str,
        lb_name: &str,
        targets: &[Ec2Instance],
        by_group: Option<(&str, &BTreeSet<Rule>)>,
        by_cidr: &BTreeSet<Rule>,
    ) -> Result<()> {
        for group in self.node_groups(cluster, targets).await? {
            let Some(id) = group.group_id() else { continue };
            if let Some((lb_group, want)) = by_group {
                self.sync_rules(id, &rules_from(&group, lb_group), want)
                    .await?;
            }
            self.sync_cidr_rules(&group, lb_name, by_cidr).await?;
        }
        Ok(())
    }

    /// Brings the CIDR rules of the NLB `lb_name` in `group` to `want`, and
    /// with them the group's ICMP rules for path MTU discovery, one per
    /// CIDR any NLB's clients come from.
    async fn sync_cidr_rules(
        &self,
        group: &SecurityGroup,
        lb_name: &str,
        want: &BTreeSet<Rule>,
    ) -> Result<()> {
        let have = described_rules(group, |d| cidr_rules::is_of(d, lb_name));
        if have == *want {
            return Ok(());
        }
        let id = group.group_id().unwrap_or_default();
        self.sync_rules(id, &have, want).await?;
        let others = described_rules(group, |d| {
            cidr_rules::is_client(d) && !cidr_rules::is_of(d, lb_name)
        });
        let clients = want
            .iter()
            .filter(|r| r.description.as_deref().is_some_and(cidr_rules::is_client));
        let mtu = mtu_rules(others.iter().chain(clients));
        self.sync_rules(id, &described_rules(group, |d| d == MTU), &mtu)
            .await
    }

    /// Removes the CIDR rules of the NLB `lb_name` from every group in
    /// `vpc`.
    pub(super) async fn close_cidr_rules(&self, vpc: &str, lb_name: &str) -> Result<()> {
        let groups: Vec<SecurityGroup> = self
            .ec2
            .describe_security_groups()
            .filters(tags::filter("vpc-id", [vpc]))
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| errors::cloud_error("DescribeSecurityGroups", e))?;
        for group in &groups {
            self.sync_cidr_rules(group, lb_name, &BTreeSet::new())
                .await?;
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

    /// Closes the nodes' groups to the own group of `service`'s load
    /// balancer `lb_name` of the kind `kind`, then deletes it; another
    /// cluster's or another Service's group of that name is left alone.
    pub(super) async fn delete_load_balancer_group(
        &self,
        cluster: &str,
        kind: &str,
        lb_name: &str,
        vpc: &str,
        service: &ServiceRef,
    ) -> Result<()> {
        let name = security_group_name(lb_name);
        let Some(group) = self.group_to_delete(cluster, vpc, &name).await? else {
            return Ok(());
        };
        if let Err(CloudError::Conflict(why)) = check_group_serves(&group, service) {
            tracing::warn!(group = %name, "{why}");
            return Ok(());
        }
        self.delete_group(cluster, &group, &format!("{kind} {lb_name}"), vpc)
            .await
    }

    /// Closes the nodes' groups to the group `name` in `vpc` that a load
    /// balancer (`used_by`) had, then deletes it; another cluster's group
    /// of that name is left alone.
    pub(super) async fn delete_group_named(
        &self,
        cluster: &str,
        name: &str,
        used_by: &str,
        vpc: &str,
    ) -> Result<()> {
        match self.group_to_delete(cluster, vpc, name).await? {
            Some(group) => self.delete_group(cluster, &group, used_by, vpc).await,
            None => Ok(()),
        }
    }

    /// The group named `name` in `vpc` when it is this cluster's; another
    /// cluster's is not ours to delete.
    async fn group_to_delete(
        &self,
        cluster: &str,
        vpc: &str,
        name: &str,
    ) -> Result<Option<SecurityGroup>> {
        match self.find_security_group(cluster, vpc, name).await {
            Err(CloudError::Conflict(why)) => {
                tracing::warn!(group = %name, "{why}");
                Ok(None)
            }
            found => found,
        }
    }

    /// Closes the nodes' groups to `group`, that a load balancer
    /// (`used_by`) had, then deletes it.
    async fn delete_group(
        &self,
        cluster: &str,
        group: &SecurityGroup,
        used_by: &str,
        vpc: &str,
    ) -> Result<()> {
        let name = group.group_name().unwrap_or_default();
        let id = group.group_id().unwrap_or_default().to_owned();
        self.close_nodes(vpc, &id).await?;
        match self.ec2.delete_security_group().group_id(&id).send().await {
            Ok(_) => Ok(()),
            Err(e) if errors::code(&e) == Some("InvalidGroup.NotFound") => Ok(()),
            Err(e) if errors::code(&e) == Some("DependencyViolation") => {
                let others = self.release_references(cluster, &id).await?;
                Err(errors::provisioning(if others.is_empty() {
                    // The load balancer's network interfaces go a while after it.
                    format!(
                        "security group {id} ({name}) is still held by the network interfaces of {used_by}, which AWS releases a few minutes after it is deleted"
                    )
                } else {
                    format!(
                        "security group {id} ({name}) is still named by rules of security groups that are not this cluster's to change: {}; remove those rules and the delete goes on",
                        others.join(", ")
                    )
                }))
            }
            Err(e) => Err(errors::cloud_error("DeleteSecurityGroup", e)),
        }
    }

    /// Revokes every rule that names the group `id` in the cluster's
    /// groups, in any VPC and of any shape (the group is going: such a
    /// rule admits nothing any more). Returns the other groups that still
    /// name it, which are not ours to change.
    async fn release_references(&self, cluster: &str, id: &str) -> Result<Vec<String>> {
        let answer = self
            .ec2
            .describe_security_groups()
            .filters(tags::filter("ip-permission.group-id", [id]))
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeSecurityGroups", e))?;
        let mut others = Vec::new();
        for group in answer.security_groups() {
            let Some(gid) = group.group_id() else {
                continue;
            };
            if gid == id {
                continue;
            }
            if !tags::belongs_to(group.tags(), cluster) {
                others.push(gid.to_owned());
                continue;
            }
            let naming: Vec<IpPermission> = group
                .ip_permissions()
                .iter()
                .filter(|p| {
                    p.user_id_group_pairs()
                        .iter()
                        .any(|g| g.group_id() == Some(id))
                })
                .map(|p| {
                    let pairs = p
                        .user_id_group_pairs()
                        .iter()
                        .filter(|g| g.group_id() == Some(id))
                        .cloned()
                        .collect();
                    IpPermission::builder()
                        .set_ip_protocol(p.ip_protocol().map(str::to_owned))
                        .set_from_port(p.from_port())
                        .set_to_port(p.to_port())
                        .set_user_id_group_pairs(Some(pairs))
                        .build()
                })
                .collect();
            match self
                .ec2
                .revoke_security_group_ingress()
                .group_id(gid)
                .set_ip_permissions(Some(naming))
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if errors::code(&e) == Some("InvalidPermission.NotFound") => {}
                Err(e) => return Err(errors::cloud_error("RevokeSecurityGroupIngress", e)),
            }
        }
        Ok(others)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_managed_nlb_group_is_named_from_the_service_as_upstream_names_it() {
        let service = ServiceRef {
            namespace: "default".into(),
            name: "my-web.app".into(),
            uid: "1234abcd-12ab-34cd-56ef-1234567890ab".into(),
        };
        assert_eq!(
            upstream_nlb_group_name("kubernetes", &service),
            "k8s-default-mywebapp-9e053c0d9f"
        );
    }
}
