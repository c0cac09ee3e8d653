//! What an ensure would do with a Service's load balancer, told without
//! writing anything: the answer of the preflight an operator runs before
//! moving a cluster from cloud-provider-aws. It reads what the ensure
//! reads and makes the ensure's own decisions (annotations, listeners,
//! kind, what cannot change), so its verdict is the ensure's; it then
//! lists what the ensure would change on a load balancer it adopts.

use std::collections::BTreeSet;
use std::fmt;

use aws_sdk_elasticloadbalancing::types::LoadBalancerDescription as Elb;
use aws_sdk_elasticloadbalancingv2::types::{LoadBalancer as Nlb, Tag as ElbTag, TargetGroup};
use ccm_provider::{CloudError, LoadBalancerSpec, Result};

use super::classic::check_classic_immutable;
use super::classic_config::{ClassicListener, classic_listeners, health_check_target};
use super::elb_tags::tag_value;
use super::health_check::{HealthCheck, health_check};
use super::ingress_rules::{Rule, Source, client_rules, rules_of, with_mtu_discovery};
use super::listeners::{Listening, forwarded_groups, listenings};
use super::nlb::{check_immutable, refuse_unsupported};
use super::security_groups::security_group_name;
use super::target_groups::{checks_health_as, is_ours as is_our_target_group};
use crate::annotations::{HcPort, LbKind, LbOptions};
use crate::tags::TAG_SERVICE_UID;
use crate::{AwsCloud, errors};

/// What an ensure of one Service would do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// No load balancer of the Service's name exists: one is made.
    Create,
    /// The name upstream gives the Service's load balancer is held by
    /// another Service's (their UIDs begin alike): that one is left
    /// untouched, and this Service's is found or made under a name of its
    /// own.
    Collision,
    /// The load balancer is ours already (it carries our tags).
    Keep,
    /// cloud-provider-aws made it; it is kept as it is, name and address
    /// and all.
    AdoptInPlace,
    /// cloud-provider-aws made it; it is kept (same name and address) with
    /// the changes listed.
    AdoptWithChanges,
    /// Its load balancer is of the other kind, and the Service allows a
    /// replacement: it is deleted and a new one made (a new address).
    Replace,
    /// Refused, nothing written, for the reasons listed.
    Refuse,
    /// Another controller's to serve (e.g. the AWS Load Balancer
    /// Controller's types).
    ImplementedElsewhere,
    /// The cloud did not answer; nothing can be told.
    Unknown,
}

impl Action {
    /// The action as a word for a table or JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Collision => "collision",
            Self::Keep => "keep",
            Self::AdoptInPlace => "adopt-in-place",
            Self::AdoptWithChanges => "adopt-with-changes",
            Self::Replace => "replace",
            Self::Refuse => "refuse",
            Self::ImplementedElsewhere => "implemented-elsewhere",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The verdict on one Service: the action, the load balancer it concerns
/// (`kind`, name, DNS name, when one exists), and the changes an adoption
/// makes or the reasons for a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub action: Action,
    pub kind: Option<&'static str>,
    pub load_balancer: Option<String>,
    pub dns_name: Option<String>,
    pub details: Vec<String>,
}

impl Verdict {
    fn of(action: Action, details: Vec<String>) -> Self {
        Self {
            action,
            kind: None,
            load_balancer: None,
            dns_name: None,
            details,
        }
    }

    /// Adopt (in place, or with `changes`) or keep a load balancer of
    /// `kind`, ours when its tags carry our UID tag.
    fn existing(
        kind: LbKind,
        name: &str,
        dns: Option<&str>,
        ours: bool,
        changes: Vec<String>,
    ) -> Self {
        let action = match (ours, changes.is_empty()) {
            (true, _) => Action::Keep,
            (false, true) => Action::AdoptInPlace,
            (false, false) => Action::AdoptWithChanges,
        };
        Self {
            action,
            kind: Some(kind.title()),
            load_balancer: Some(name.to_owned()),
            dns_name: dns.map(str::to_owned),
            details: changes,
        }
    }
}

/// `v`, the verdict on a Service whose load balancer has or gets the name
/// `lb_name` because upstream's is `held` by another's: a collision, said
/// before whatever else `v` says (a refusal stays one).
fn collided(v: Verdict, lb_name: &str, held: &str) -> Verdict {
    let said = format!(
        "{held}: it is left untouched; this Service's load balancer is {lb_name}, a name of its own"
    );
    let action = match v.action {
        Action::Refuse | Action::Unknown | Action::ImplementedElsewhere => v.action,
        _ => Action::Collision,
    };
    Verdict {
        action,
        details: std::iter::once(said).chain(v.details).collect(),
        ..v
    }
}

/// A rule as a person reads it.
fn rule_text(r: &Rule) -> String {
    let source = match &r.source {
        Source::Cidr(c) | Source::Cidr6(c) | Source::Group(c) => c,
    };
    match r.proto.as_str() {
        "-1" => format!("all traffic from {source}"),
        "icmp" => format!("ICMP {}-{} from {source}", r.from, r.to),
        p => format!("{p} {} from {source}", r.from),
    }
}

/// The changes to the load balancer's own group `id` holding `have` when
/// it must hold `want`.
fn group_changes(id: &str, have: &BTreeSet<Rule>, want: &BTreeSet<Rule>) -> Vec<String> {
    let mut out: Vec<String> = want
        .difference(have)
        .map(|r| format!("security group {id} admits {}", rule_text(r)))
        .collect();
    out.extend(
        have.difference(want)
            .map(|r| format!("security group {id} no longer admits {}", rule_text(r))),
    );
    out
}

/// A health check as a person reads it.
fn check_text(protocol: &str, port: &str, interval: i32, healthy: i32, unhealthy: i32) -> String {
    format!(
        "{protocol} on {port} every {interval} s, healthy after {healthy}, unhealthy after {unhealthy}"
    )
}

/// `hc` as a person reads it.
fn wanted_check(hc: &HealthCheck) -> String {
    let port = match hc.port {
        HcPort::TrafficPort => "the traffic port".to_owned(),
        HcPort::Port(p) => format!("port {p}"),
    };
    let protocol = format!("{:?}", hc.protocol).to_uppercase();
    check_text(&protocol, &port, hc.interval, hc.healthy, hc.unhealthy)
}

/// The NLB listener changes from `have` (port, protocol) to `want`.
fn listener_changes(have: &[(i32, String)], want: &[(i32, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (port, protocol) in want {
        match have.iter().find(|(p, _)| p == port) {
            None => out.push(format!("a {protocol} listener on port {port} is added")),
            Some((_, was)) if was != protocol => out.push(format!(
                "the listener on port {port} becomes {protocol} (was {was})"
            )),
            Some(_) => {}
        }
    }
    for (port, _) in have {
        if !want.iter().any(|(p, _)| p == port) {
            out.push(format!("the listener on port {port} is removed"));
        }
    }
    out
}

impl AwsCloud {
    /// What an ensure of `spec` would do, read without writing.
    pub async fn preflight(&self, cluster: &str, spec: &LoadBalancerSpec) -> Verdict {
        match self.judge(cluster, spec).await {
            Ok(v) => v,
            Err(CloudError::ImplementedElsewhere(why)) => {
                Verdict::of(Action::ImplementedElsewhere, vec![why])
            }
            Err(CloudError::InvalidArgument(problems)) => Verdict::of(
                Action::Refuse,
                problems
                    .into_iter()
                    .map(|(f, why)| format!("{f}: {why}"))
                    .collect(),
            ),
            Err(CloudError::Conflict(why)) => Verdict::of(Action::Refuse, vec![why]),
            Err(e) => Verdict::of(Action::Unknown, vec![e.to_string()]),
        }
    }

    /// The verdict of [`Self::judge_kind`], with the annotations that
    /// would have no effect.
    async fn judge(&self, cluster: &str, spec: &LoadBalancerSpec) -> Result<Verdict> {
        let o = self.options(spec)?;
        let mut verdict = self.judge_kind(cluster, spec, &o).await?;
        verdict.details.extend(o.no_effect.iter().cloned());
        Ok(verdict)
    }

    async fn judge_kind(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        o: &LbOptions,
    ) -> Result<Verdict> {
        let hc = health_check(spec, o, self.settings.shared_health_probe.as_ref())?;
        refuse_unsupported(spec)?;
        let service = &spec.service;
        let verdict = match o.kind {
            LbKind::Nlb => {
                let ls = listenings(spec, o)?;
                let mut slot = self.nlb_slot(cluster, service).await?;
                let (lb_name, held) = (slot.name()?, slot.held_name());
                let verdict = match slot.own.take() {
                    Some((nlb, tags)) => {
                        self.judge_nlb(cluster, spec, o, &ls, &hc, &nlb, &tags)
                            .await?
                    }
                    None => {
                        self.judge_new(cluster, spec, &lb_name, LbKind::Nlb, o)
                            .await?
                    }
                };
                (verdict, lb_name, held)
            }
            LbKind::Classic => {
                let listeners = classic_listeners(spec, o)?;
                let mut slot = self.classic_slot(cluster, service).await?;
                let (lb_name, held) = (slot.name()?, slot.held_name());
                let verdict = match slot.own.take() {
                    Some((elb, tags)) => {
                        check_classic_immutable(&elb, o)?;
                        let changes = self
                            .classic_changes(cluster, spec, o, &listeners, &hc, &elb)
                            .await?;
                        let ours = tags.iter().any(|t| t.key() == TAG_SERVICE_UID);
                        Verdict::existing(LbKind::Classic, &lb_name, elb.dns_name(), ours, changes)
                    }
                    None => {
                        self.judge_new(cluster, spec, &lb_name, LbKind::Classic, o)
                            .await?
                    }
                };
                (verdict, lb_name, held)
            }
        };
        Ok(match verdict {
            (v, lb_name, Some(held)) => collided(v, &lb_name, &held),
            (v, _, None) => v,
        })
    }

    /// No load balancer of `kind` of the Service's: one is made, named
    /// `lb_name`, unless the Service has one of the other kind (refused,
    /// or replaced where the Service allows it).
    async fn judge_new(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        lb_name: &str,
        kind: LbKind,
        o: &LbOptions,
    ) -> Result<Verdict> {
        let service = &spec.service;
        let action = match self.other_kind(cluster, service, kind).await? {
            None => Action::Create,
            Some((other, lb_name)) if o.allow_replacement => {
                return Ok(Verdict {
                    kind: Some(kind.title()),
                    load_balancer: Some(lb_name.to_owned()),
                    ..Verdict::of(
                        Action::Replace,
                        vec![format!(
                            "the {} {lb_name} is deleted with its groups and rules, then a new {} is made: the Service's address changes",
                            other.title(),
                            kind.title()
                        )],
                    )
                });
            }
            Some(_) => {
                self.refuse_other_kind(cluster, service, kind).await?;
                Action::Create
            }
        };
        Ok(Verdict {
            kind: Some(kind.title()),
            load_balancer: Some(lb_name.to_owned()),
            ..Verdict::of(action, Vec::new())
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn judge_nlb(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        o: &LbOptions,
        ls: &[Listening],
        hc: &HealthCheck,
        nlb: &Nlb,
        tags: &[ElbTag],
    ) -> Result<Verdict> {
        let vpc = nlb.vpc_id().unwrap_or_default();
        let place = self.placement(cluster, Some(vpc), &[], o).await?;
        check_immutable(nlb, o, &place.subnets)?;
        let lb_name = nlb.load_balancer_name().unwrap_or_default();
        let arn = nlb.load_balancer_arn().unwrap_or_default();
        let listeners = self.listeners_of(arn).await?;
        let have: Vec<(i32, String)> = listeners
            .iter()
            .map(|l| {
                (
                    l.port().unwrap_or_default(),
                    l.protocol()
                        .map(|p| p.as_str().to_owned())
                        .unwrap_or_default(),
                )
            })
            .collect();
        let want: Vec<(i32, String)> = ls
            .iter()
            .map(|l| (l.port, l.listener.as_str().to_owned()))
            .collect();
        let mut changes = listener_changes(&have, &want);

        let arns = forwarded_groups(&listeners);
        let groups: Vec<TargetGroup> = if arns.is_empty() {
            Vec::new()
        } else {
            self.elb
                .describe_target_groups()
                .set_target_group_arns(Some(arns))
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeTargetGroups", e))?
                .target_groups()
                .to_vec()
        };
        let theirs: Vec<&TargetGroup> = groups
            .iter()
            .filter(|g| {
                !g.target_group_name()
                    .is_some_and(|n| is_our_target_group(lb_name, n))
            })
            .collect();
        if !theirs.is_empty() {
            let names: Vec<&str> = theirs
                .iter()
                .filter_map(|g| g.target_group_name())
                .collect();
            changes.push(format!(
                "target groups {} are replaced by ours, each listener moving once the new group has its targets registered",
                names.join(", ")
            ));
        }
        if let Some(g) = theirs.iter().find(|g| !checks_health_as(g, hc)) {
            let was = check_text(
                g.health_check_protocol()
                    .map(|p| p.as_str())
                    .unwrap_or_default(),
                g.health_check_port().unwrap_or_default(),
                g.health_check_interval_seconds().unwrap_or_default(),
                g.healthy_threshold_count().unwrap_or_default(),
                g.unhealthy_threshold_count().unwrap_or_default(),
            );
            changes.push(format!(
                "the health check becomes {} (was {was})",
                wanted_check(hc)
            ));
        }

        match nlb.security_groups().first() {
            None => {}
            Some(id) => {
                if let Some(group) = self.owned_group(cluster, id).await? {
                    if group.group_name() != Some(security_group_name(lb_name).as_str())
                        && !self.settings.disable_security_group_ingress
                    {
                        changes.push(format!(
                            "the nodes' groups admit its security group {id} in place of cloud-provider-aws's CIDR rules"
                        ));
                    }
                    let clients = client_rules(
                        &spec.source_ranges,
                        o.dualstack,
                        ls.iter().map(Listening::client_opening),
                    );
                    changes.extend(group_changes(
                        id,
                        &rules_of(&group),
                        &with_mtu_discovery(clients),
                    ));
                }
            }
        }
        let ours = tag_value(tags, TAG_SERVICE_UID).is_some();
        Ok(Verdict::existing(
            LbKind::Nlb,
            lb_name,
            nlb.dns_name(),
            ours,
            changes,
        ))
    }

    /// What an ensure changes on the Classic ELB `elb`: its listeners,
    /// its own group's rules, its health check.
    async fn classic_changes(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        o: &LbOptions,
        listeners: &[ClassicListener],
        hc: &HealthCheck,
        elb: &Elb,
    ) -> Result<Vec<String>> {
        let have: Vec<_> = elb
            .listener_descriptions()
            .iter()
            .filter_map(|d| d.listener())
            .collect();
        let mut changes = Vec::new();
        for l in listeners {
            if !have.iter().any(|h| l.is(h)) {
                changes.push(format!(
                    "a listener {} {} to the nodes' {} {} is made{}",
                    l.protocol,
                    l.port,
                    l.instance_protocol,
                    l.instance_port,
                    if have.iter().any(|h| h.load_balancer_port() == l.port) {
                        " in place of the one on that port"
                    } else {
                        ""
                    }
                ));
            }
        }
        for h in &have {
            if !listeners.iter().any(|l| l.port == h.load_balancer_port()) {
                changes.push(format!(
                    "the listener on port {} is removed",
                    h.load_balancer_port()
                ));
            }
        }
        let target = health_check_target(hc, listeners, o);
        if let Some(h) = elb.health_check()
            && !(h.target() == target
                && h.interval() == hc.interval
                && h.timeout() == hc.timeout
                && h.healthy_threshold() == hc.healthy
                && h.unhealthy_threshold() == hc.unhealthy)
        {
            changes.push(format!(
                "the health check becomes {target} every {} s, healthy after {}, unhealthy after {} (was {} every {} s, healthy after {}, unhealthy after {})",
                hc.interval,
                hc.healthy,
                hc.unhealthy,
                h.target(),
                h.interval(),
                h.healthy_threshold(),
                h.unhealthy_threshold()
            ));
        }
        let named = self.classic_named_groups(o);
        if !named.is_empty() && elb.security_groups().first() != named.first() {
            changes.push(format!(
                "its security groups become {} in place of {}",
                named.join(", "),
                elb.security_groups().join(", ")
            ));
        }
        if named.is_empty() {
            let own = security_group_name(elb.load_balancer_name().unwrap_or_default());
            for id in elb.security_groups() {
                if let Some(group) = self.owned_group(cluster, id).await?
                    && group.group_name() == Some(own.as_str())
                {
                    let clients = client_rules(
                        &spec.source_ranges,
                        false,
                        listeners.iter().map(ClassicListener::client_opening),
                    );
                    changes.extend(group_changes(
                        id,
                        &rules_of(&group),
                        &with_mtu_discovery(clients),
                    ));
                }
            }
        }
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_changes_name_each_port_added_changed_or_removed() {
        let have = [(80, "TCP".to_owned()), (443, "TCP".to_owned())];
        let want = [
            (80, "TCP".to_owned()),
            (443, "TLS".to_owned()),
            (53, "UDP".to_owned()),
        ];
        assert_eq!(
            listener_changes(&have, &want),
            [
                "the listener on port 443 becomes TLS (was TCP)",
                "a UDP listener on port 53 is added"
            ]
        );
        assert_eq!(listener_changes(&want, &have).len(), 2);
        assert!(listener_changes(&have, &have).is_empty());
    }

    #[test]
    fn a_health_check_reads_as_a_sentence() {
        let hc = HealthCheck {
            protocol: crate::annotations::HcProtocol::Http,
            port: HcPort::Port(32000),
            path: Some("/healthz".into()),
            interval: 10,
            timeout: 6,
            healthy: 2,
            unhealthy: 2,
        };
        assert_eq!(
            wanted_check(&hc),
            "HTTP on port 32000 every 10 s, healthy after 2, unhealthy after 2"
        );
    }

    #[test]
    fn group_changes_read_as_sentences() {
        let world = Rule::port("tcp", 80, Source::Cidr("0.0.0.0/0".into()));
        let office = Rule::port("tcp", 80, Source::Cidr("192.168.0.0/24".into()));
        let changes = group_changes("sg-1", &BTreeSet::from([world]), &BTreeSet::from([office]));
        assert_eq!(
            changes,
            [
                "security group sg-1 admits tcp 80 from 192.168.0.0/24",
                "security group sg-1 no longer admits tcp 80 from 0.0.0.0/0"
            ]
        );
    }

    #[test]
    fn an_existing_load_balancer_is_kept_when_ours_and_adopted_otherwise() {
        let ours = Verdict::existing(LbKind::Nlb, "a1", None, true, vec!["x".into()]);
        assert_eq!(ours.action, Action::Keep);
        let same = Verdict::existing(LbKind::Nlb, "a1", None, false, Vec::new());
        assert_eq!(same.action, Action::AdoptInPlace);
        let changed = Verdict::existing(LbKind::Classic, "a1", None, false, vec!["x".into()]);
        assert_eq!(changed.action, Action::AdoptWithChanges);
        assert_eq!(changed.kind, Some("Classic ELB"));
    }
}
