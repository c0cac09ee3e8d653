//! Load balancers, of the kind the Service's `aws-load-balancer-type`
//! annotation picks (the gateway's default without it: a Classic ELB, as
//! cloud-provider-aws makes, unless the operator chose NLBs). Both are
//! named from the Service UID as upstream names them, so a load balancer
//! upstream made is found and kept in place. The kind cannot change after
//! creation: a Service whose annotation now asks for the other kind is
//! refused with why, and nothing of its load balancer changes, unless it
//! allows a replacement (the old one goes first, its group with it).
//!
//! An NLB has one listener and one target group per Service port (TCP,
//! UDP, or TCP_UDP where a TCP and a UDP port share a number; TLS where
//! the certificate annotations ask), instance targets on the node port,
//! and one security group of its own that admits the Service's source
//! ranges on its ports; the nodes' groups admit that group on the node
//! ports and the health check port. An NLB cloud-provider-aws made keeps
//! what it has: without a group (AWS cannot add one), the nodes admit it
//! by CIDR rules described as upstream describes them (`cidr_rules`);
//! with upstream's "Managed" group, that group is its own. Upstream's
//! target groups are replaced by ours, each registered before its
//! listener moves. A Classic ELB has one listener per
//! port (TCP, or SSL/HTTPS/HTTP as the certificate and backend protocol
//! annotations ask) to the node port, registered instances, one health
//! check, its own group admitting the source ranges (or the groups the
//! Service names) and the nodes' groups admitting all traffic from it.
//!
//! Everything made carries the cluster tag (`owned`) and the Service's
//! tags, and is found again by name and checked by tag: a load balancer
//! with our name but another cluster's tag, or another Service's (UIDs
//! alike in their first 31 digits give one name), is never touched; the
//! Service's own then goes under a name of its own (`slots`). Every step
//! is idempotent, so an ensure that failed half way is finished by the
//! next.
//!
//! This file holds the ensure of both kinds, over the operations beside
//! it. Whatever any kind of load balancer needs: `targets` (the instances
//! behind the selected hosts), `placement` (VPC and subnets),
//! `security_groups` over the pure `ingress_rules`, `health_check`. The
//! NLB's own (ELBv2): `nlb`, `listeners`, `target_groups`, `elb_tags`,
//! `cidr_rules`. The Classic ELB's own (ELB): `classic` over the pure
//! `classic_config`. `preflight` tells what an ensure would do, reading
//! only.

mod cidr_rules;
mod classic;
mod classic_config;
mod elb_tags;
mod health_check;
mod ingress_rules;
mod listeners;
mod nlb;
mod placement;
pub(crate) mod preflight;
mod quotas;
mod security_groups;
mod slots;
mod target_groups;
mod targets;

use async_trait::async_trait;
use ccm_provider::{
    CloudError, Host, LoadBalancer, LoadBalancerSpec, LoadBalancerStatus, LoadBalancers, Result,
    ServiceRef,
};

use std::collections::BTreeSet;

use aws_sdk_ec2::types::Instance as Ec2Instance;
use aws_sdk_elasticloadbalancing::types::LoadBalancerDescription as Elb;
use aws_sdk_elasticloadbalancingv2::types::LoadBalancer as Nlb;

use self::cidr_rules::CidrAccess;
use self::classic::{
    ClassicShape, check_classic_immutable, classic_adoption, classic_listed, classic_status,
};
use self::classic_config::{Attributes, ClassicListener, classic_listeners, health_check_target};
use self::elb_tags::tag_value;
use self::health_check::{HealthCheck, health_check, shared_probe_overrides};
use self::ingress_rules::{Rule, Source, client_rules, node_rules, rules_of, with_mtu_discovery};
use self::listeners::{Listening, listenings};
use self::nlb::{check_immutable, check_not_failed, listed, refuse_unsupported, reported_status};
use self::placement::Placement;
use self::security_groups::upstream_nlb_group_name;
use self::target_groups::GroupSettings;
use self::targets::instance_ids;
use crate::annotations::{LbKind, LbOptions};
use crate::settings::NlbGroups;
use crate::tags::TAG_SERVICE_UID;
use crate::{AwsCloud, annotations, tags};

#[async_trait]
impl LoadBalancers for AwsCloud {
    async fn get(&self, cluster: &str, service: &ServiceRef) -> Result<Option<LoadBalancerStatus>> {
        if let Some((nlb, _)) = self.nlb_slot(cluster, service).await?.own {
            return Ok(Some(reported_status(&nlb)));
        }
        let classic = self.classic_slot(cluster, service).await?.own;
        Ok(classic.map(|(elb, _)| classic_status(&elb)))
    }

    async fn ensure(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<LoadBalancerStatus> {
        let o = self.options(spec)?;
        match o.kind {
            LbKind::Nlb => self.ensure_nlb(cluster, spec, hosts, &o).await,
            LbKind::Classic => self.ensure_classic(cluster, spec, hosts, &o).await,
        }
    }

    async fn update_hosts(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<()> {
        let o = self.options(spec)?;
        match o.kind {
            LbKind::Nlb => self.update_nlb_hosts(cluster, spec, hosts, &o).await,
            LbKind::Classic => self.update_classic_hosts(cluster, spec, hosts, &o).await,
        }
    }

    /// Deletes only what is the Service's: a load balancer of its name
    /// that another Service's tags name is left, with what it uses.
    async fn delete(&self, cluster: &str, service: &ServiceRef) -> Result<()> {
        let nlb = self.nlb_slot(cluster, service).await?;
        let classic = self.classic_slot(cluster, service).await?;
        let mut vpc = self.settings.vpc_id.clone();
        if let Some((lb, _)) = &nlb.own {
            vpc = lb.vpc_id().map(str::to_owned).or(vpc);
            self.delete_nlb(lb, lb.load_balancer_name().unwrap_or_default())
                .await?;
        }
        if let Some((elb, _)) = &classic.own {
            vpc = elb.vpc_id().map(str::to_owned).or(vpc);
            self.delete_classic(elb.load_balancer_name().unwrap_or_default())
                .await?;
        }
        let groups_vpc = self.delete_service_target_groups(cluster, service).await?;
        let Some(vpc) = vpc.or(groups_vpc) else {
            return Ok(());
        };
        if classic.own.is_some() {
            let lb_name = classic.name()?;
            return self
                .delete_load_balancer_group(
                    cluster,
                    LbKind::Classic.title(),
                    &lb_name,
                    &vpc,
                    service,
                )
                .await;
        }
        // An NLB, or one gone already: whatever an NLB of ours or of
        // cloud-provider-aws may have left under a name that is the
        // Service's (an NLB made without a group has CIDR rules on the
        // nodes' groups, one in "Managed" mode a group named its way).
        for lb_name in nlb.cleanable() {
            if !self.settings.disable_security_group_ingress {
                self.close_cidr_rules(&vpc, lb_name).await?;
            }
            self.delete_load_balancer_group(cluster, LbKind::Nlb.title(), lb_name, &vpc, service)
                .await?;
        }
        let used_by = format!(
            "the {} of Service {}/{}",
            LbKind::Nlb.title(),
            service.namespace,
            service.name
        );
        self.delete_group_named(
            cluster,
            &upstream_nlb_group_name(cluster, service),
            &used_by,
            &vpc,
        )
        .await
    }

    fn host_label_annotations(&self) -> &'static [&'static str] {
        &[annotations::TARGET_NODE_LABELS]
    }

    async fn host_limits(&self) -> Result<Vec<ccm_provider::HostLimits>> {
        self.read_host_limits().await
    }

    async fn list(&self, cluster: &str) -> Result<Vec<LoadBalancer>> {
        let nlbs = self.owned_nlbs(cluster).await?;
        let classics = self.owned_classics(cluster).await?;
        Ok(nlbs
            .iter()
            .map(|(nlb, t)| listed(nlb, t))
            .chain(classics.iter().map(|(elb, t)| classic_listed(elb, t)))
            .collect())
    }
}

/// What an ensure that took over `nlb` (made by cloud-provider-aws) says
/// of it.
fn adoption_of(nlb: &Nlb, group: Option<&str>) -> String {
    let how = match group {
        Some(g) => format!("its security group {g} now admitted by the nodes' groups"),
        None => "no security group, its nodes' CIDR rules kept in step".to_owned(),
    };
    format!(
        "adopted the NLB {} ({}) in place: {how}; its target groups replaced by ours once their targets are registered",
        nlb.load_balancer_name().unwrap_or_default(),
        nlb.dns_name().unwrap_or_default(),
    )
}

/// The answer of a host update for a Service without a load balancer.
fn not_found(service: &ServiceRef) -> CloudError {
    CloudError::NotFound(format!(
        "the load balancer of Service {}/{}",
        service.namespace, service.name
    ))
}

/// The group a Classic ELB's traffic to the nodes comes from: the first
/// of `named` (the Service's groups, or the gateway's shared one), else
/// the first that is not an extra one (its own).
fn classic_source_group<'a>(
    elb: &'a Elb,
    named: &'a [String],
    o: &'a LbOptions,
) -> Option<&'a str> {
    named.first().map(String::as_str).or_else(|| {
        elb.security_groups()
            .iter()
            .find(|g| !o.classic.extra_security_groups.contains(g))
            .map(String::as_str)
    })
}

impl AwsCloud {
    /// The Service's options: its annotations read, with a sentence for
    /// each that the gateway's settings leave without effect.
    pub(crate) fn options(&self, spec: &LoadBalancerSpec) -> Result<LbOptions> {
        let mut o =
            annotations::parse(&spec.annotations, self.settings.default_load_balancer_type)?;
        let probe = self.settings.shared_health_probe.as_ref();
        o.no_effect.extend(shared_probe_overrides(spec, &o, probe));
        Ok(o)
    }

    /// The Service's load balancer of the other kind than `wanted`, if
    /// any: its kind and name.
    pub(super) async fn other_kind(
        &self,
        cluster: &str,
        service: &ServiceRef,
        wanted: LbKind,
    ) -> Result<Option<(LbKind, String)>> {
        Ok(match wanted {
            LbKind::Classic => self.nlb_slot(cluster, service).await?.own.map(|(nlb, _)| {
                let name = nlb.load_balancer_name().unwrap_or_default();
                (LbKind::Nlb, name.to_owned())
            }),
            LbKind::Nlb => self
                .classic_slot(cluster, service)
                .await?
                .own
                .map(|(elb, _)| {
                    let name = elb.load_balancer_name().unwrap_or_default();
                    (LbKind::Classic, name.to_owned())
                }),
        })
    }

    /// Refuses a Service whose load balancer is of the other kind than
    /// `wanted`: as upstream, the type cannot change after creation,
    /// unless the Service allows a replacement.
    pub(super) async fn refuse_other_kind(
        &self,
        cluster: &str,
        service: &ServiceRef,
        wanted: LbKind,
    ) -> Result<()> {
        let Some((other, lb_name)) = self.other_kind(cluster, service, wanted).await? else {
            return Ok(());
        };
        Err(CloudError::invalid(
            annotations::field(annotations::TYPE),
            format!(
                "the Service's load balancer {lb_name} is a{} {}; the type cannot change after creation: set {} back to {}, or allow a replacement (a new {} with a new address) with {}: \"true\"",
                if other == LbKind::Nlb { "n" } else { "" },
                other.title(),
                annotations::TYPE,
                other.as_str(),
                wanted.title(),
                annotations::ALLOW_REPLACEMENT,
            ),
        ))
    }

    /// Before a new load balancer of `wanted` is made: one of the other
    /// kind is refused, or, where the Service allows a replacement,
    /// deleted with everything of it (its group as well: the next ensure
    /// goes on once that is gone, so a group is never shared by two kinds).
    async fn make_way(
        &self,
        cluster: &str,
        service: &ServiceRef,
        wanted: LbKind,
        o: &LbOptions,
    ) -> Result<()> {
        if !o.allow_replacement {
            return self.refuse_other_kind(cluster, service, wanted).await;
        }
        let Some((other, lb_name)) = self.other_kind(cluster, service, wanted).await? else {
            return Ok(());
        };
        tracing::info!(lb = %lb_name, from = other.title(), to = wanted.title(), "replacing the load balancer, as the Service allows");
        self.delete(cluster, service).await
    }

    /// What an ensure of either kind needs before it makes or changes
    /// anything: the way made for a new load balancer of `kind` named
    /// `lb_name` (one of the other kind refused or replaced, a group it
    /// left cleared), the target instances, and the placement
    /// (`existing_vpc`: that of the load balancer there is).
    #[allow(clippy::too_many_arguments)]
    async fn prepare(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
        o: &LbOptions,
        kind: LbKind,
        lb_name: &str,
        existing_vpc: Option<&str>,
    ) -> Result<(Vec<Ec2Instance>, Placement)> {
        if existing_vpc.is_none() {
            self.make_way(cluster, &spec.service, kind, o).await?;
        }
        let targets = self.target_instances(hosts, o).await?;
        let place = self.placement(cluster, existing_vpc, &targets, o).await?;
        if existing_vpc.is_none() {
            self.clear_leftover_group(cluster, &spec.service, lb_name, &place.vpc, o)
                .await?;
        }
        Ok((targets, place))
    }

    /// Where a replacement is allowed, a group of the load balancer's
    /// name left when none exists (by the kind replaced, or a failed
    /// attempt) is deleted before one is made: `Provisioning` while the
    /// replaced load balancer's interfaces still hold it.
    async fn clear_leftover_group(
        &self,
        cluster: &str,
        service: &ServiceRef,
        lb_name: &str,
        vpc: &str,
        o: &LbOptions,
    ) -> Result<()> {
        if !o.allow_replacement {
            return Ok(());
        }
        self.delete_load_balancer_group(cluster, "replaced load balancer", lb_name, vpc, service)
            .await
    }

    async fn ensure_nlb(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
        o: &LbOptions,
    ) -> Result<LoadBalancerStatus> {
        let service = &spec.service;
        let ls = listenings(spec, o)?;
        let hc = health_check(spec, o, self.settings.shared_health_probe.as_ref())?;
        refuse_unsupported(spec)?;
        let mut slot = self.nlb_slot(cluster, service).await?;
        let lb_name = slot.name()?;
        let existing = slot.own.take();
        let existing_vpc = existing
            .as_ref()
            .map(|(n, _)| n.vpc_id().unwrap_or_default());
        let (targets, place) = self
            .prepare(cluster, spec, hosts, o, LbKind::Nlb, &lb_name, existing_vpc)
            .await?;
        if let Some((nlb, _)) = &existing {
            check_immutable(nlb, o, &place.subnets)?;
        }
        let tags = tags::service_tags(cluster, service, &o.tags);

        let mut no_effect = o.no_effect.clone();
        // The NLB's groups: those the Service names (nothing in them
        // changed), else its own, kept to the source ranges; none for one
        // made without any (as upstream makes them by default), which AWS
        // cannot give one, nor for a new one when the operator wants none.
        let (groups, own) = match &existing {
            None if self.settings.nlb_security_groups == NlbGroups::None => {
                if !o.security_groups.is_empty() {
                    no_effect.push(format!(
                        "{} has no effect on a new NLB: the gateway makes NLBs without security groups (--aws-nlb-security-group-mode none, as cloud-provider-aws's default), and AWS cannot add any later; set the mode to managed to use the groups named",
                        annotations::short(annotations::SECURITY_GROUPS)
                    ));
                }
                (Vec::new(), None)
            }
            Some((nlb, _)) if nlb.security_groups().is_empty() => {
                if !o.security_groups.is_empty() {
                    no_effect.push(format!(
                        "{} has no effect on this NLB: it was made without security groups (as cloud-provider-aws makes them), and AWS cannot give it any; recreate the Service to have them",
                        annotations::short(annotations::SECURITY_GROUPS)
                    ));
                }
                (Vec::new(), None)
            }
            _ if !o.security_groups.is_empty() => (o.security_groups.clone(), None),
            _ => {
                let have: Vec<String> = existing
                    .as_ref()
                    .map(|(nlb, _)| nlb.security_groups().to_vec())
                    .unwrap_or_default();
                let kept = match have.first() {
                    Some(id) => self.owned_group(cluster, id).await?,
                    None => None,
                };
                match kept {
                    Some(group) => (have, Some(group)),
                    None => {
                        let group = self
                            .load_balancer_group(
                                cluster,
                                LbKind::Nlb.title(),
                                &lb_name,
                                &place.vpc,
                                &tags,
                                service,
                            )
                            .await?;
                        (
                            vec![group.group_id().unwrap_or_default().to_owned()],
                            Some(group),
                        )
                    }
                }
            }
        };
        if let Some(group) = &own {
            let clients = client_rules(
                &spec.source_ranges,
                o.dualstack,
                ls.iter().map(Listening::client_opening),
            );
            let id = group.group_id().unwrap_or_default();
            self.sync_rules(id, &rules_of(group), &with_mtu_discovery(clients))
                .await?;
        }
        let group_id = groups.first().map(String::as_str);
        let nlb = match &existing {
            Some((nlb, _)) => {
                if !groups.is_empty() && nlb.security_groups() != groups.as_slice() {
                    self.set_nlb_groups(nlb.load_balancer_arn().unwrap_or_default(), &groups)
                        .await?;
                }
                nlb.clone()
            }
            None => {
                if let Some(held) = slot.held_name() {
                    tracing::warn!(nlb = %lb_name, service = %format!("{}/{}", service.namespace, service.name), "upstream's name for this Service's NLB is taken ({held}): it gets a name of its own");
                }
                tracing::info!(nlb = %lb_name, service = %format!("{}/{}", service.namespace, service.name), "creating NLB");
                self.create_nlb(&lb_name, o, &place.subnets, &groups, &tags)
                    .await?
            }
        };
        self.open_nodes_to_nlb_of(cluster, spec, o, &nlb, group_id, &targets, &ls, &hc)
            .await?;
        check_not_failed(&nlb, &lb_name)?;
        let arn = nlb.load_balancer_arn().unwrap_or_default();
        self.sync_attributes(arn, o).await?;
        let settings = GroupSettings {
            lb_name: &lb_name,
            lb_arn: arn,
            service,
            vpc: &place.vpc,
            health_check: &hc,
            attributes: &o.target_group_attributes,
            tags: &tags,
        };
        let wanted = self
            .ensure_target_groups(&settings, &ls, &instance_ids(&targets))
            .await?;
        // Each listener moves to a group whose targets are registered;
        // only then are the groups it used before deleted (those of a
        // failed attempt are found by the Service's delete).
        let before = self.sync_listeners(arn, &wanted, o).await?;
        self.delete_stale_target_groups(&before, &wanted).await?;
        if !o.security_groups.is_empty() {
            // The Service names its groups now: a group we made before goes.
            self.delete_load_balancer_group(
                cluster,
                LbKind::Nlb.title(),
                &lb_name,
                &place.vpc,
                service,
            )
            .await?;
        }
        // One cloud-provider-aws made is ours once it carries our tags;
        // they go on last, so an ensure that failed before adopts again.
        // Tags the Service adds or changes later are applied too.
        let have_tags = existing
            .as_ref()
            .map(|(_, t)| t.as_slice())
            .unwrap_or_default();
        let adopted = match &existing {
            Some((nlb, have)) if tag_value(have, TAG_SERVICE_UID).is_none() => {
                Some(adoption_of(nlb, group_id))
            }
            _ => None,
        };
        if existing.is_some() {
            self.sync_elb_tags(arn, have_tags, &tags, &o.tags).await?;
        }
        let status = self.status_when_active(&nlb, &lb_name).await?;
        Ok(LoadBalancerStatus {
            adopted,
            no_effect,
            ..status
        })
    }

    /// Opens the nodes to `nlb`: to its group `group` when it has one
    /// (stripping the CIDR rules upstream wrote for it), else by CIDR as
    /// upstream does for an NLB without a group, kept in step; nothing
    /// when the operator opens the nodes.
    #[allow(clippy::too_many_arguments)]
    async fn open_nodes_to_nlb_of(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        o: &LbOptions,
        nlb: &Nlb,
        group: Option<&str>,
        targets: &[Ec2Instance],
        ls: &[Listening],
        hc: &HealthCheck,
    ) -> Result<()> {
        if self.settings.disable_security_group_ingress {
            return Ok(());
        }
        let lb_name = nlb.load_balancer_name().unwrap_or_default();
        let node = ls.iter().map(Listening::node_opening);
        if let Some(group) = group {
            let want = node_rules(group, node, hc.own_port());
            return self
                .open_nodes_to_nlb(
                    cluster,
                    lb_name,
                    targets,
                    Some((group, &want)),
                    &BTreeSet::new(),
                )
                .await;
        }
        let access = CidrAccess::new(&spec.source_ranges, o.dualstack, node, hc.own_port());
        let subnets = if access.needs_health_rules() {
            self.subnet_cidrs(nlb).await?
        } else {
            Vec::new()
        };
        self.open_nodes_to_nlb(
            cluster,
            lb_name,
            targets,
            None,
            &access.rules(lb_name, &subnets),
        )
        .await
    }

    async fn update_nlb_hosts(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
        o: &LbOptions,
    ) -> Result<()> {
        let ls = listenings(spec, o)?;
        let hc = health_check(spec, o, self.settings.shared_health_probe.as_ref())?;
        let Some((nlb, _)) = self.nlb_slot(cluster, &spec.service).await?.own else {
            return Err(not_found(&spec.service));
        };
        let lb_name = nlb.load_balancer_name().unwrap_or_default();
        let targets = self.target_instances(hosts, o).await?;
        let group = nlb.security_groups().first().map(String::as_str);
        self.open_nodes_to_nlb_of(cluster, spec, o, &nlb, group, &targets, &ls, &hc)
            .await?;
        let arn = nlb.load_balancer_arn().unwrap_or_default();
        self.update_targets(lb_name, arn, &spec.service, &ls, &instance_ids(&targets))
            .await
    }

    async fn ensure_classic(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
        o: &LbOptions,
    ) -> Result<LoadBalancerStatus> {
        let service = &spec.service;
        let listeners = classic_listeners(spec, o)?;
        let hc = health_check(spec, o, self.settings.shared_health_probe.as_ref())?;
        refuse_unsupported(spec)?;
        let mut slot = self.classic_slot(cluster, service).await?;
        let lb_name = slot.name()?;
        let existing = slot.own.take();
        let existing_vpc = existing
            .as_ref()
            .map(|(e, _)| e.vpc_id().unwrap_or_default());
        let (targets, place) = self
            .prepare(
                cluster,
                spec,
                hosts,
                o,
                LbKind::Classic,
                &lb_name,
                existing_vpc,
            )
            .await?;
        if let Some((elb, _)) = &existing {
            check_classic_immutable(elb, o)?;
        }
        let tags = tags::service_tags(cluster, service, &o.tags);
        let groups = self
            .classic_groups(cluster, &lb_name, &place.vpc, &tags, spec, &listeners, o)
            .await?;
        self.open_nodes_to_classic(cluster, &groups[0], &targets)
            .await?;
        let subnets: Vec<String> = place
            .subnets
            .iter()
            .filter_map(|s| s.subnet_id().map(str::to_owned))
            .collect();
        let shape = ClassicShape {
            listeners: &listeners,
            subnets: &subnets,
            groups: &groups,
            tags: &tags,
            internal: o.internal,
        };
        let adopted = existing
            .as_ref()
            .and_then(|(elb, have_tags)| classic_adoption(elb, have_tags));
        let elb = match existing {
            Some((elb, have_tags)) => {
                if self.sync_classic(&elb, &have_tags, &shape).await? {
                    // Read again: policies go on listeners just made.
                    self.find_classic(&lb_name).await?.unwrap_or(elb)
                } else {
                    elb
                }
            }
            None => {
                if let Some(held) = slot.held_name() {
                    tracing::warn!(elb = %lb_name, service = %format!("{}/{}", service.namespace, service.name), "upstream's name for this Service's Classic ELB is taken ({held}): it gets a name of its own");
                }
                tracing::info!(elb = %lb_name, service = %format!("{}/{}", service.namespace, service.name), "creating Classic ELB");
                self.create_classic(&lb_name, &shape).await?
            }
        };
        self.sync_classic_health_check(&elb, &health_check_target(&hc, &listeners, o), &hc)
            .await?;
        self.sync_classic_attributes(&lb_name, &Attributes::of(o))
            .await?;
        self.sync_classic_policies(&elb, &listeners, o).await?;
        self.sync_classic_instances(&elb, &instance_ids(&targets))
            .await?;
        if !self.classic_named_groups(o).is_empty() {
            // The Service names its groups now: a group we made before goes.
            self.delete_load_balancer_group(
                cluster,
                LbKind::Classic.title(),
                &lb_name,
                &place.vpc,
                service,
            )
            .await?;
        }
        Ok(LoadBalancerStatus {
            adopted,
            no_effect: o.no_effect.clone(),
            ..classic_status(&elb)
        })
    }

    /// The groups a Classic ELB uses in place of one of its own (nothing
    /// in them changed): those the Service names, else the gateway's
    /// shared ELB group; none.
    fn classic_named_groups(&self, o: &LbOptions) -> Vec<String> {
        if o.security_groups.is_empty() {
            self.settings.elb_security_group.iter().cloned().collect()
        } else {
            o.security_groups.clone()
        }
    }

    /// The groups of a Classic ELB, the one its traffic to the nodes comes
    /// from first: [`Self::classic_named_groups`], else its own (made when
    /// missing, admitting the source ranges on each port and ICMP for path
    /// MTU discovery); then the extra ones the Service names.
    #[allow(clippy::too_many_arguments)]
    async fn classic_groups(
        &self,
        cluster: &str,
        lb_name: &str,
        vpc: &str,
        tags: &[(String, String)],
        spec: &LoadBalancerSpec,
        listeners: &[ClassicListener],
        o: &LbOptions,
    ) -> Result<Vec<String>> {
        let mut groups = self.classic_named_groups(o);
        if groups.is_empty() {
            let group = self
                .load_balancer_group(
                    cluster,
                    LbKind::Classic.title(),
                    lb_name,
                    vpc,
                    tags,
                    &spec.service,
                )
                .await?;
            let id = group.group_id().unwrap_or_default();
            let clients = client_rules(
                &spec.source_ranges,
                false,
                listeners.iter().map(ClassicListener::client_opening),
            );
            self.sync_rules(id, &rules_of(&group), &with_mtu_discovery(clients))
                .await?;
            groups.push(id.to_owned());
        }
        for extra in &o.classic.extra_security_groups {
            if !groups.contains(extra) {
                groups.push(extra.clone());
            }
        }
        Ok(groups)
    }

    /// The nodes' groups admit all traffic from `source`, the Classic
    /// ELB's group, as upstream opens them; only such rules are ours.
    /// Nothing when the operator opens the nodes.
    async fn open_nodes_to_classic(
        &self,
        cluster: &str,
        source: &str,
        targets: &[Ec2Instance],
    ) -> Result<()> {
        if self.settings.disable_security_group_ingress {
            return Ok(());
        }
        let want = BTreeSet::from([Rule::all_traffic(Source::Group(source.to_owned()))]);
        self.open_nodes(cluster, source, targets, &want, Rule::is_all_traffic)
            .await
    }

    async fn update_classic_hosts(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
        o: &LbOptions,
    ) -> Result<()> {
        classic_listeners(spec, o)?;
        let Some((elb, _)) = self.classic_slot(cluster, &spec.service).await?.own else {
            return Err(not_found(&spec.service));
        };
        let targets = self.target_instances(hosts, o).await?;
        let named = self.classic_named_groups(o);
        if let Some(source) = classic_source_group(&elb, &named, o) {
            self.open_nodes_to_classic(cluster, source, &targets)
                .await?;
        }
        self.sync_classic_instances(&elb, &instance_ids(&targets))
            .await
    }
}

/// What the pure modules' tests share: a Service's ports and spec.
#[cfg(test)]
mod test_support {
    use ccm_provider::{LoadBalancerSpec, Protocol, ServicePort};

    pub(super) fn port(name: &str, protocol: Protocol, port: i32, node_port: i32) -> ServicePort {
        ServicePort {
            name: name.into(),
            protocol,
            port,
            node_port,
        }
    }

    pub(super) fn spec(ports: Vec<ServicePort>) -> LoadBalancerSpec {
        LoadBalancerSpec {
            ports,
            ..Default::default()
        }
    }
}
