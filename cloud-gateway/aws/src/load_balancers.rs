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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::types::{
    Filter, Instance as Ec2Instance, IpPermission, IpRange, Ipv6Range, ResourceType, SecurityGroup,
    Subnet, Tag as Ec2Tag, TagSpecification, UserIdGroupPair,
};
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, IpAddressType, LoadBalancer as Nlb, LoadBalancerAttribute,
    LoadBalancerSchemeEnum, LoadBalancerStateEnum, LoadBalancerTypeEnum, ProtocolEnum,
    SubnetMapping, Tag, TargetDescription, TargetGroup, TargetGroupAttribute, TargetTypeEnum,
};
use ccm_provider::{
    CloudError, Host, Ingress, LoadBalancer, LoadBalancerSpec, LoadBalancerStatus, LoadBalancers,
    Protocol, Result, ServiceRef, TrafficPolicy, load_balancer_name,
};

use super::annotations::{self, HcPort, HcProtocol, NlbOptions, TlsPorts};
use super::instances::parse_provider_id;
use super::tags::{TAG_SERVICE_NAME, TAG_SERVICE_UID};
use super::{AwsCloud, errors, tags};

/// The most listeners one NLB has (an AWS quota).
const MAX_LISTENERS: usize = 50;
/// How long to wait before asking again about an NLB being provisioned.
const PROVISIONING_RETRY: Duration = Duration::from_secs(15);
/// How many ARNs one `DescribeTags` takes.
const TAGS_PER_CALL: usize = 20;
/// The most values one EC2 filter takes.
const FILTER_VALUES: usize = 200;

fn invalid(field: &str, problem: impl Into<String>) -> CloudError {
    CloudError::invalid(field, problem)
}

fn annotation(key: &str) -> String {
    format!("spec.annotations[{key:?}]")
}

/// One listener and its target group.
#[derive(Clone, Debug, PartialEq)]
struct Listening {
    port: i32,
    listener: ProtocolEnum,
    target: ProtocolEnum,
    node_port: i32,
    tls: bool,
}

/// The health check of every target group of one NLB.
#[derive(Clone, Debug, PartialEq)]
struct HealthCheck {
    protocol: ProtocolEnum,
    /// A port number, or `traffic-port`.
    port: String,
    path: Option<String>,
    interval: i32,
    timeout: i32,
    healthy: i32,
    unhealthy: i32,
}

/// The listeners of `spec`: TCP and UDP ports with the same number share
/// one TCP_UDP listener.
fn listenings(spec: &LoadBalancerSpec, o: &NlbOptions) -> Result<Vec<Listening>> {
    let mut by_port: BTreeMap<i32, Vec<(Protocol, i32, &str)>> = BTreeMap::new();
    for p in &spec.ports {
        let protocol = p.protocol;
        if protocol == Protocol::Sctp {
            return Err(invalid(
                "spec.ports",
                format!("port {}: NLBs do not carry SCTP", p.port),
            ));
        }
        if p.node_port == 0 {
            return Err(invalid(
                "spec.ports",
                format!(
                    "port {}: has no node port; NLB instance targets need one (allocateLoadBalancerNodePorts must not be false)",
                    p.port
                ),
            ));
        }
        by_port
            .entry(p.port)
            .or_default()
            .push((protocol, p.node_port, p.name.as_str()));
    }
    if by_port.len() > MAX_LISTENERS {
        return Err(invalid(
            "spec.ports",
            format!(
                "{} distinct ports; an NLB has at most {MAX_LISTENERS} listeners",
                by_port.len()
            ),
        ));
    }
    let tls_port = |port: i32, name: &str| match o.tls.as_ref().map(|t| &t.ports) {
        None => false,
        Some(TlsPorts::All) => true,
        Some(TlsPorts::Some(list)) => list
            .iter()
            .any(|p| p == name || p.parse::<i32>() == Ok(port)),
    };
    let mut out = Vec::new();
    for (port, entries) in by_port {
        let node_ports: BTreeSet<i32> = entries.iter().map(|e| e.1).collect();
        let has = |p: Protocol| entries.iter().any(|e| e.0 == p);
        let (listener, target) = match (has(Protocol::Tcp), has(Protocol::Udp)) {
            (true, true) => {
                if node_ports.len() > 1 {
                    return Err(invalid(
                        "spec.ports",
                        format!(
                            "port {port}: TCP and UDP share one NLB listener (TCP_UDP), so they need the same node port, not {node_ports:?}"
                        ),
                    ));
                }
                (ProtocolEnum::TcpUdp, ProtocolEnum::TcpUdp)
            }
            (false, true) => (ProtocolEnum::Udp, ProtocolEnum::Udp),
            _ => (ProtocolEnum::Tcp, ProtocolEnum::Tcp),
        };
        let tls = entries.iter().any(|(_, _, name)| tls_port(port, name));
        if tls && listener != ProtocolEnum::Tcp {
            return Err(invalid(
                &annotation(annotations::SSL_PORTS),
                format!("port {port} carries UDP; only TCP ports can be TLS listeners"),
            ));
        }
        out.push(Listening {
            port,
            listener: if tls { ProtocolEnum::Tls } else { listener },
            target,
            node_port: entries[0].1,
            tls,
        });
    }
    if let Some(TlsPorts::Some(list)) = o.tls.as_ref().map(|t| &t.ports) {
        for wanted in list {
            let known = spec
                .ports
                .iter()
                .any(|p| &p.name == wanted || wanted.parse::<i32>() == Ok(p.port));
            if !known {
                return Err(invalid(
                    &annotation(annotations::SSL_PORTS),
                    format!("{wanted:?} names no port of the Service"),
                ));
            }
        }
    }
    Ok(out)
}

/// The health check: HTTP on the health check node port at `/healthz`
/// for the Local traffic policy, TCP on the traffic port otherwise, with
/// the annotations' overrides.
fn health_check(spec: &LoadBalancerSpec, o: &NlbOptions) -> Result<HealthCheck> {
    let local = spec.external_traffic_policy == TrafficPolicy::Local;
    let h = &o.health_check;
    let (default_protocol, default_port, default_path) = if local {
        if spec.health_check_node_port <= 0 {
            return Err(invalid(
                "spec.health_check_node_port",
                "the Local traffic policy needs a health check node port",
            ));
        }
        (
            HcProtocol::Http,
            HcPort::Port(spec.health_check_node_port as u16),
            Some("/healthz".to_owned()),
        )
    } else {
        (HcProtocol::Tcp, HcPort::TrafficPort, None)
    };
    let protocol = h.protocol.unwrap_or(default_protocol);
    let path = match protocol {
        HcProtocol::Tcp => None,
        _ => h.path.clone().or(default_path).or(Some("/".to_owned())),
    };
    let interval = h.interval.unwrap_or(10);
    let default_timeout = if protocol == HcProtocol::Http { 6 } else { 10 };
    let timeout = h.timeout.unwrap_or(default_timeout.min(interval));
    if timeout > interval {
        return Err(invalid(
            &annotation(annotations::HC_TIMEOUT),
            format!("{timeout}s is longer than the interval ({interval}s)"),
        ));
    }
    Ok(HealthCheck {
        protocol: match protocol {
            HcProtocol::Tcp => ProtocolEnum::Tcp,
            HcProtocol::Http => ProtocolEnum::Http,
            HcProtocol::Https => ProtocolEnum::Https,
        },
        port: match h.port.unwrap_or(default_port) {
            HcPort::TrafficPort => "traffic-port".to_owned(),
            HcPort::Port(p) => p.to_string(),
        },
        path,
        interval,
        timeout,
        healthy: h.healthy.unwrap_or(2),
        unhealthy: h.unhealthy.unwrap_or(2),
    })
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

fn target_group_prefix(lb_name: &str) -> String {
    format!("k8s-{}-", &lb_name[1..lb_name.len().min(13)])
}

/// The security group name of an NLB.
fn security_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

fn elb_tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

fn ec2_tag(key: &str, value: &str) -> Ec2Tag {
    Ec2Tag::builder().key(key).value(value).build()
}

/// The tags of everything made for `service`.
fn service_tags(cluster: &str, service: &ServiceRef, o: &NlbOptions) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        o.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    out.push((tags::cluster_key(cluster), tags::OWNED.to_owned()));
    out.push((
        TAG_SERVICE_NAME.to_owned(),
        format!("{}/{}", service.namespace, service.name),
    ));
    out.push((TAG_SERVICE_UID.to_owned(), service.uid.clone()));
    out
}

fn elb_belongs(tags: &[Tag], cluster: &str) -> bool {
    let key = tags::cluster_key(cluster);
    tags.iter().any(|t| {
        t.key() == Some(key.as_str()) && matches!(t.value(), Some(tags::OWNED | tags::SHARED))
    })
}

fn tag_value<'a>(tags: &'a [Tag], key: &str) -> Option<&'a str> {
    tags.iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
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
    }
}

fn is_provisioning(nlb: &Nlb) -> bool {
    nlb.state().and_then(|s| s.code()) == Some(&LoadBalancerStateEnum::Provisioning)
}

fn is_failed(nlb: &Nlb) -> bool {
    nlb.state().and_then(|s| s.code()) == Some(&LoadBalancerStateEnum::Failed)
}

/// One ingress rule: protocol (`tcp`/`udp`), port, source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Cidr(String),
    Cidr6(String),
    Group(String),
}

type Rule = (String, i32, Source);

fn rules_of(group: &SecurityGroup) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for p in group.ip_permissions() {
        let (Some(proto), Some(from), Some(to)) = (p.ip_protocol(), p.from_port(), p.to_port())
        else {
            continue;
        };
        if from != to {
            continue;
        }
        for r in p.ip_ranges() {
            if let Some(c) = r.cidr_ip() {
                out.insert((proto.to_owned(), from, Source::Cidr(c.to_owned())));
            }
        }
        for r in p.ipv6_ranges() {
            if let Some(c) = r.cidr_ipv6() {
                out.insert((proto.to_owned(), from, Source::Cidr6(c.to_owned())));
            }
        }
        for g in p.user_id_group_pairs() {
            if let Some(id) = g.group_id() {
                out.insert((proto.to_owned(), from, Source::Group(id.to_owned())));
            }
        }
    }
    out
}

fn permission((proto, port, source): &Rule) -> IpPermission {
    let b = IpPermission::builder()
        .ip_protocol(proto)
        .from_port(*port)
        .to_port(*port);
    match source {
        Source::Cidr(c) => b.ip_ranges(IpRange::builder().cidr_ip(c).build()),
        Source::Cidr6(c) => b.ipv6_ranges(Ipv6Range::builder().cidr_ipv6(c).build()),
        Source::Group(g) => b.user_id_group_pairs(UserIdGroupPair::builder().group_id(g).build()),
    }
    .build()
}

fn ip_protocols(p: &ProtocolEnum) -> &'static [&'static str] {
    match p {
        ProtocolEnum::Udp => &["udp"],
        ProtocolEnum::TcpUdp => &["tcp", "udp"],
        _ => &["tcp"],
    }
}

/// The NLB security group's rules: each source range on each listener.
fn client_rules(spec: &LoadBalancerSpec, o: &NlbOptions, ls: &[Listening]) -> BTreeSet<Rule> {
    let mut sources: Vec<Source> = spec
        .source_ranges
        .iter()
        .filter_map(|r| r.parse::<ipnet::IpNet>().ok())
        .map(|n| match n.trunc() {
            ipnet::IpNet::V4(n) => Source::Cidr(n.to_string()),
            ipnet::IpNet::V6(n) => Source::Cidr6(n.to_string()),
        })
        .collect();
    if sources.is_empty() {
        sources.push(Source::Cidr("0.0.0.0/0".into()));
        if o.dualstack {
            sources.push(Source::Cidr6("::/0".into()));
        }
    }
    let mut out = BTreeSet::new();
    for l in ls {
        for proto in ip_protocols(&l.listener) {
            for s in &sources {
                out.insert(((*proto).to_owned(), l.port, s.clone()));
            }
        }
    }
    out
}

/// The rules the nodes' groups need for the NLB's group: the node ports
/// and the health check port.
fn node_rules(nlb_group: &str, ls: &[Listening], hc: &HealthCheck) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for l in ls {
        for proto in ip_protocols(&l.target) {
            out.insert((
                (*proto).to_owned(),
                l.node_port,
                Source::Group(nlb_group.to_owned()),
            ));
        }
    }
    if let Ok(port) = hc.port.parse::<i32>() {
        out.insert(("tcp".into(), port, Source::Group(nlb_group.to_owned())));
    }
    out
}

impl AwsCloud {
    /// The NLB named `name`, if any.
    async fn find_nlb(&self, name: &str) -> Result<Option<Nlb>> {
        match self.elb.describe_load_balancers().names(name).send().await {
            Ok(answer) => Ok(answer.load_balancers().first().cloned()),
            Err(e) if errors::code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(errors::cloud_error("DescribeLoadBalancers", e)),
        }
    }

    /// Tags of each ARN.
    async fn elb_tags(&self, arns: &[String]) -> Result<HashMap<String, Vec<Tag>>> {
        let mut out = HashMap::new();
        for chunk in arns.chunks(TAGS_PER_CALL) {
            let answer = self
                .elb
                .describe_tags()
                .set_resource_arns(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeTags", e))?;
            for d in answer.tag_descriptions() {
                if let Some(arn) = d.resource_arn() {
                    out.insert(arn.to_owned(), d.tags().to_vec());
                }
            }
        }
        Ok(out)
    }

    /// The Service's NLB when it is this cluster's. `Err(Conflict)` when an
    /// NLB of that name is someone else's.
    async fn owned_nlb(&self, cluster: &str, name: &str) -> Result<Option<Nlb>> {
        let Some(nlb) = self.find_nlb(name).await? else {
            return Ok(None);
        };
        let arn = nlb.load_balancer_arn().unwrap_or_default().to_owned();
        let tags = self.elb_tags(std::slice::from_ref(&arn)).await?;
        if tags.get(&arn).is_some_and(|t| elb_belongs(t, cluster)) {
            Ok(Some(nlb))
        } else {
            Err(CloudError::Conflict(format!(
                "a load balancer named {name} exists without the tag {}=owned; it is not this cluster's and is left alone",
                tags::cluster_key(cluster)
            )))
        }
    }

    /// The running target instances among `hosts` that the Service selects.
    async fn target_instances(&self, hosts: &[Host], o: &NlbOptions) -> Result<Vec<Ec2Instance>> {
        let ids: Vec<String> = hosts
            .iter()
            .filter(|h| o.selects(&h.labels))
            .filter_map(|h| match parse_provider_id(&h.provider_id) {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::debug!(host = %h.name, error = %e, "host is no NLB target");
                    None
                }
            })
            .collect();
        let mut out = Vec::new();
        for chunk in ids.chunks(FILTER_VALUES) {
            out.extend(
                self.describe_instances(vec![
                    tags::filter("instance-id", chunk.iter().cloned()),
                    tags::filter("instance-state-name", ["pending", "running"]),
                ])
                .await?,
            );
        }
        Ok(out)
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

    /// The NLB's subnets: those named by the annotation, in its order, or
    /// one per zone among the VPC's subnets with the role tag for the
    /// scheme, preferring those tagged for this cluster and never those
    /// tagged for another.
    async fn subnets(&self, cluster: &str, vpc: &str, o: &NlbOptions) -> Result<Vec<Subnet>> {
        let describe = |filters: Vec<Filter>| async move {
            self.ec2
                .describe_subnets()
                .set_filters(Some(filters))
                .send()
                .await
                .map(|a| a.subnets().to_vec())
                .map_err(|e| errors::cloud_error("DescribeSubnets", e))
        };
        let vpc_filter = tags::filter("vpc-id", [vpc]);
        if !o.subnets.is_empty() {
            let (ids, names): (Vec<&String>, Vec<&String>) =
                o.subnets.iter().partition(|s| s.starts_with("subnet-"));
            let mut found = Vec::new();
            if !ids.is_empty() {
                found.extend(
                    describe(vec![
                        vpc_filter.clone(),
                        tags::filter("subnet-id", ids.iter().map(|s| s.as_str())),
                    ])
                    .await?,
                );
            }
            if !names.is_empty() {
                found.extend(
                    describe(vec![
                        vpc_filter.clone(),
                        tags::filter("tag:Name", names.iter().map(|s| s.as_str())),
                    ])
                    .await?,
                );
            }
            let mut out = Vec::new();
            for wanted in &o.subnets {
                let matching: Vec<&Subnet> = found
                    .iter()
                    .filter(|s| {
                        s.subnet_id() == Some(wanted.as_str())
                            || s.tags()
                                .iter()
                                .any(|t| t.key() == Some("Name") && t.value() == Some(wanted))
                    })
                    .collect();
                match matching.as_slice() {
                    [one] => out.push((*one).clone()),
                    [] => {
                        return Err(invalid(
                            &annotation(annotations::SUBNETS),
                            format!("no subnet {wanted:?} in {vpc}"),
                        ));
                    }
                    _ => {
                        return Err(invalid(
                            &annotation(annotations::SUBNETS),
                            format!("several subnets in {vpc} are named {wanted:?}; use IDs"),
                        ));
                    }
                }
            }
            return Ok(out);
        }
        let role = if o.internal {
            "kubernetes.io/role/internal-elb"
        } else {
            "kubernetes.io/role/elb"
        };
        let candidates = describe(vec![vpc_filter, tags::filter("tag-key", [role])]).await?;
        let mut by_zone: BTreeMap<String, (bool, String, Subnet)> = BTreeMap::new();
        let ours_key = tags::cluster_key(cluster);
        for s in candidates {
            let tags = s.tags();
            let role_on = tags
                .iter()
                .any(|t| t.key() == Some(role) && matches!(t.value(), Some("" | "1")));
            let other_cluster = tags.iter().any(|t| {
                t.key().is_some_and(|k| {
                    k.starts_with(tags::CLUSTER_TAG_PREFIX) && k != ours_key.as_str()
                })
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
        if by_zone.is_empty() {
            return Err(CloudError::NotConfigured(format!(
                "no subnet in {vpc} carries the tag {role}=1 (and no other cluster's tag); tag one per zone, or name them with {}",
                annotations::SUBNETS
            )));
        }
        Ok(by_zone.into_values().map(|(_, _, s)| s).collect())
    }

    /// The NLB's security group, made when missing.
    async fn nlb_security_group(
        &self,
        cluster: &str,
        lb_name: &str,
        vpc: &str,
        tags: &[(String, String)],
    ) -> Result<SecurityGroup> {
        let name = security_group_name(lb_name);
        if let Some(group) = self.find_security_group(cluster, vpc, &name).await? {
            return Ok(group);
        }
        self.ec2
            .create_security_group()
            .group_name(&name)
            .description(format!("NLB {lb_name} of Kubernetes cluster {cluster}"))
            .vpc_id(vpc)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::SecurityGroup)
                    .set_tags(Some(tags.iter().map(|(k, v)| ec2_tag(k, v)).collect()))
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
    async fn sync_rules(
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
                        "no single security group of the instance is tagged for the cluster; NLB traffic to it is not opened"
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
        Ok(chosen.into_values().collect())
    }

    /// Opens the nodes' groups to the NLB's group (and closes what they
    /// open to it that is no longer needed).
    async fn open_nodes(
        &self,
        cluster: &str,
        nlb_group: &str,
        targets: &[Ec2Instance],
        want: &BTreeSet<Rule>,
    ) -> Result<()> {
        for group in self.node_groups(cluster, targets).await? {
            let Some(id) = group.group_id() else { continue };
            let have: BTreeSet<Rule> = rules_of(&group)
                .into_iter()
                .filter(|r| r.2 == Source::Group(nlb_group.to_owned()))
                .collect();
            self.sync_rules(id, &have, want).await?;
        }
        Ok(())
    }

    /// Removes every rule in the VPC's groups that names `nlb_group`.
    async fn close_nodes(&self, vpc: &str, nlb_group: &str) -> Result<()> {
        let answer = self
            .ec2
            .describe_security_groups()
            .filters(tags::filter("vpc-id", [vpc]))
            .filters(tags::filter("ip-permission.group-id", [nlb_group]))
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeSecurityGroups", e))?;
        for group in answer.security_groups() {
            let Some(id) = group.group_id() else { continue };
            if id == nlb_group {
                continue;
            }
            let have: BTreeSet<Rule> = rules_of(group)
                .into_iter()
                .filter(|r| r.2 == Source::Group(nlb_group.to_owned()))
                .collect();
            self.sync_rules(id, &have, &BTreeSet::new()).await?;
        }
        Ok(())
    }

    /// The target group for `l`, made when missing, with the wanted health
    /// check and proxy protocol setting.
    async fn target_group(
        &self,
        lb_name: &str,
        vpc: &str,
        l: &Listening,
        hc: &HealthCheck,
        o: &NlbOptions,
        tags: &[(String, String)],
    ) -> Result<TargetGroup> {
        let name = target_group_name(lb_name, l);
        let existing = match self.elb.describe_target_groups().names(&name).send().await {
            Ok(a) => a.target_groups().first().cloned(),
            Err(e) if errors::code(&e) == Some("TargetGroupNotFound") => None,
            Err(e) => return Err(errors::cloud_error("DescribeTargetGroups", e)),
        };
        let group = match existing {
            Some(g) => {
                let same = g.health_check_protocol() == Some(&hc.protocol)
                    && g.health_check_port() == Some(hc.port.as_str())
                    && g.health_check_path() == hc.path.as_deref()
                    && g.health_check_interval_seconds() == Some(hc.interval)
                    && g.health_check_timeout_seconds() == Some(hc.timeout)
                    && g.healthy_threshold_count() == Some(hc.healthy)
                    && g.unhealthy_threshold_count() == Some(hc.unhealthy);
                if same {
                    g
                } else {
                    let answer = self
                        .elb
                        .modify_target_group()
                        .target_group_arn(g.target_group_arn().unwrap_or_default())
                        .health_check_protocol(hc.protocol.clone())
                        .health_check_port(&hc.port)
                        .set_health_check_path(hc.path.clone())
                        .health_check_interval_seconds(hc.interval)
                        .health_check_timeout_seconds(hc.timeout)
                        .healthy_threshold_count(hc.healthy)
                        .unhealthy_threshold_count(hc.unhealthy)
                        .send()
                        .await
                        .map_err(|e| errors::cloud_error("ModifyTargetGroup", e))?;
                    answer.target_groups().first().cloned().unwrap_or(g)
                }
            }
            None => {
                let answer = self
                    .elb
                    .create_target_group()
                    .name(&name)
                    .protocol(l.target.clone())
                    .port(l.node_port)
                    .vpc_id(vpc)
                    .target_type(TargetTypeEnum::Instance)
                    .health_check_protocol(hc.protocol.clone())
                    .health_check_port(&hc.port)
                    .set_health_check_path(hc.path.clone())
                    .health_check_interval_seconds(hc.interval)
                    .health_check_timeout_seconds(hc.timeout)
                    .healthy_threshold_count(hc.healthy)
                    .unhealthy_threshold_count(hc.unhealthy)
                    .set_tags(Some(tags.iter().map(|(k, v)| elb_tag(k, v)).collect()))
                    .send()
                    .await
                    .map_err(|e| errors::cloud_error("CreateTargetGroup", e))?;
                answer.target_groups().first().cloned().ok_or_else(|| {
                    CloudError::Internal("CreateTargetGroup answered no group".into())
                })?
            }
        };
        let arn = group.target_group_arn().unwrap_or_default();
        let proxy = self
            .elb
            .describe_target_group_attributes()
            .target_group_arn(arn)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeTargetGroupAttributes", e))?
            .attributes()
            .iter()
            .any(|a| a.key() == Some("proxy_protocol_v2.enabled") && a.value() == Some("true"));
        if proxy != o.proxy_protocol {
            self.elb
                .modify_target_group_attributes()
                .target_group_arn(arn)
                .attributes(
                    TargetGroupAttribute::builder()
                        .key("proxy_protocol_v2.enabled")
                        .value(o.proxy_protocol.to_string())
                        .build(),
                )
                .send()
                .await
                .map_err(|e| errors::cloud_error("ModifyTargetGroupAttributes", e))?;
        }
        Ok(group)
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

    /// Refuses a change to what an NLB cannot change after creation.
    fn check_immutable(nlb: &Nlb, o: &NlbOptions, subnets: &[Subnet]) -> Result<()> {
        let mut problems = Vec::new();
        let internal = nlb.scheme() == Some(&LoadBalancerSchemeEnum::Internal);
        if internal != o.internal {
            problems.push((
                annotation(annotations::INTERNAL),
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
                annotation(annotations::SUBNETS),
                format!(
                    "the NLB is in {have:?}; this provider does not move an NLB to other subnets: recreate the Service to change them"
                ),
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(CloudError::InvalidArgument(problems))
        }
    }

    async fn create_nlb(
        &self,
        lb_name: &str,
        o: &NlbOptions,
        subnets: &[Subnet],
        group: &str,
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
            .security_groups(group)
            .set_tags(Some(tags.iter().map(|(k, v)| elb_tag(k, v)).collect()))
            .send()
            .await
            .map_err(|e| errors::cloud_error("CreateLoadBalancer", e))?;
        answer.load_balancers().first().cloned().ok_or_else(|| {
            CloudError::Internal("CreateLoadBalancer answered no load balancer".into())
        })
    }

    /// Cross-zone load balancing as asked (left as it is when not asked).
    async fn sync_attributes(&self, arn: &str, o: &NlbOptions) -> Result<()> {
        let Some(cross_zone) = o.cross_zone else {
            return Ok(());
        };
        let have = self
            .elb
            .describe_load_balancer_attributes()
            .load_balancer_arn(arn)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeLoadBalancerAttributes", e))?
            .attributes()
            .iter()
            .any(|a| {
                a.key() == Some("load_balancing.cross_zone.enabled") && a.value() == Some("true")
            });
        if have != cross_zone {
            self.elb
                .modify_load_balancer_attributes()
                .load_balancer_arn(arn)
                .attributes(
                    LoadBalancerAttribute::builder()
                        .key("load_balancing.cross_zone.enabled")
                        .value(cross_zone.to_string())
                        .build(),
                )
                .send()
                .await
                .map_err(|e| errors::cloud_error("ModifyLoadBalancerAttributes", e))?;
        }
        Ok(())
    }

    /// Listeners as wanted: each forwards to its target group; others go.
    /// Returns the target groups the listeners forwarded to before.
    async fn sync_listeners(
        &self,
        arn: &str,
        wanted: &[(Listening, String)],
        o: &NlbOptions,
    ) -> Result<BTreeSet<String>> {
        let listeners = self
            .elb
            .describe_listeners()
            .load_balancer_arn(arn)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeListeners", e))?
            .listeners()
            .to_vec();
        let before: BTreeSet<String> = listeners
            .iter()
            .flat_map(|l| l.default_actions())
            .filter_map(|a| a.target_group_arn().map(str::to_owned))
            .collect();
        let forward = |tg: &str| {
            Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(tg)
                .build()
        };
        let certificates = o.tls.as_ref().map(|t| {
            vec![
                Certificate::builder()
                    .certificate_arn(&t.certificate_arn)
                    .build(),
            ]
        });
        let policy = o.tls.as_ref().map(|t| {
            t.policy
                .clone()
                .unwrap_or_else(|| "ELBSecurityPolicy-TLS13-1-2-2021-06".to_owned())
        });
        for (l, tg) in wanted {
            let existing = listeners.iter().find(|x| x.port() == Some(l.port));
            let forward_action = forward(tg);
            match existing {
                Some(x) => {
                    let targets_ok = x
                        .default_actions()
                        .iter()
                        .any(|a| a.target_group_arn() == Some(tg));
                    let cert_ok = !l.tls
                        || (x.certificates().first().and_then(|c| c.certificate_arn())
                            == o.tls.as_ref().map(|t| t.certificate_arn.as_str())
                            && x.ssl_policy() == policy.as_deref());
                    if x.protocol() == Some(&l.listener) && targets_ok && cert_ok {
                        continue;
                    }
                    let mut m = self
                        .elb
                        .modify_listener()
                        .listener_arn(x.listener_arn().unwrap_or_default())
                        .protocol(l.listener.clone())
                        .port(l.port)
                        .default_actions(forward_action);
                    if l.tls {
                        m = m
                            .set_certificates(certificates.clone())
                            .set_ssl_policy(policy.clone());
                    }
                    m.send()
                        .await
                        .map_err(|e| errors::cloud_error("ModifyListener", e))?;
                }
                None => {
                    let mut c = self
                        .elb
                        .create_listener()
                        .load_balancer_arn(arn)
                        .protocol(l.listener.clone())
                        .port(l.port)
                        .default_actions(forward_action);
                    if l.tls {
                        c = c
                            .set_certificates(certificates.clone())
                            .set_ssl_policy(policy.clone());
                    }
                    c.send()
                        .await
                        .map_err(|e| errors::cloud_error("CreateListener", e))?;
                }
            }
        }
        for x in &listeners {
            if !wanted.iter().any(|(l, _)| x.port() == Some(l.port)) {
                match self
                    .elb
                    .delete_listener()
                    .listener_arn(x.listener_arn().unwrap_or_default())
                    .send()
                    .await
                {
                    Ok(_) => {}
                    Err(e) if errors::code(&e) == Some("ListenerNotFound") => {}
                    Err(e) => return Err(errors::cloud_error("DeleteListener", e)),
                }
            }
        }
        Ok(before)
    }

    /// This Service's target groups (by name prefix, confirmed by tag).
    async fn service_target_groups(
        &self,
        cluster: &str,
        service: &ServiceRef,
    ) -> Result<Vec<TargetGroup>> {
        let prefix = target_group_prefix(&load_balancer_name(&service.uid));
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
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .collect();
        Ok(self
            .owned_by(cluster, groups, TargetGroup::target_group_arn)
            .await?
            .into_iter()
            .filter(|(_, t)| tag_value(t, TAG_SERVICE_UID) == Some(service.uid.as_str()))
            .map(|(g, _)| g)
            .collect())
    }

    /// Those of `items` tagged for `cluster`, each with its tags.
    async fn owned_by<T>(
        &self,
        cluster: &str,
        items: Vec<T>,
        arn: fn(&T) -> Option<&str>,
    ) -> Result<Vec<(T, Vec<Tag>)>> {
        let arns: Vec<String> = items
            .iter()
            .filter_map(|i| arn(i).map(str::to_owned))
            .collect();
        let mut tags = self.elb_tags(&arns).await?;
        Ok(items
            .into_iter()
            .filter_map(|i| {
                let t = tags.remove(arn(&i)?)?;
                elb_belongs(&t, cluster).then_some((i, t))
            })
            .collect())
    }

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
            Err(e) if errors::code(&e) == Some("ResourceInUse") => Err(CloudError::Provisioning {
                retry_after: PROVISIONING_RETRY,
                message: format!("target group {arn} is still in use while its NLB goes"),
            }),
            Err(e) => Err(errors::cloud_error("DeleteTargetGroup", e)),
        }
    }
}

#[async_trait]
impl LoadBalancers for AwsCloud {
    async fn get(&self, cluster: &str, service: &ServiceRef) -> Result<Option<LoadBalancerStatus>> {
        match self
            .owned_nlb(cluster, &load_balancer_name(&service.uid))
            .await
        {
            Ok(Some(nlb)) if is_provisioning(&nlb) => Ok(Some(LoadBalancerStatus::default())),
            Ok(Some(nlb)) => Ok(Some(status_of(&nlb))),
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
        let service = spec.service.clone();
        let o = annotations::parse(&spec.annotations)?;
        let ls = listenings(spec, &o)?;
        let hc = health_check(spec, &o)?;
        if !spec.load_balancer_ip.is_empty() {
            return Err(invalid(
                "spec.load_balancer_ip",
                format!(
                    "NLBs take no requested address; use {} or {}",
                    annotations::EIP_ALLOCATIONS,
                    annotations::PRIVATE_IPV4
                ),
            ));
        }
        let lb_name = load_balancer_name(&service.uid);
        let existing = self.owned_nlb(cluster, &lb_name).await?;
        let targets = self.target_instances(hosts, &o).await?;
        let vpc = match &existing {
            Some(nlb) => nlb.vpc_id().unwrap_or_default().to_owned(),
            None => self.vpc_of(&targets)?,
        };
        let subnets = match (&existing, o.subnets.is_empty()) {
            (Some(_), true) => Vec::new(),
            _ => self.subnets(cluster, &vpc, &o).await?,
        };
        if let Some(nlb) = &existing {
            Self::check_immutable(nlb, &o, &subnets)?;
        }
        let tags = service_tags(cluster, &service, &o);
        let group = self
            .nlb_security_group(cluster, &lb_name, &vpc, &tags)
            .await?;
        let group_id = group.group_id().unwrap_or_default().to_owned();
        self.sync_rules(&group_id, &rules_of(&group), &client_rules(spec, &o, &ls))
            .await?;
        self.open_nodes(
            cluster,
            &group_id,
            &targets,
            &node_rules(&group_id, &ls, &hc),
        )
        .await?;
        let nlb = match existing {
            Some(nlb) => nlb,
            None => {
                tracing::info!(nlb = %lb_name, service = %format!("{}/{}", service.namespace, service.name), "creating NLB");
                self.create_nlb(&lb_name, &o, &subnets, &group_id, &tags)
                    .await?
            }
        };
        if is_failed(&nlb) {
            return Err(CloudError::Unavailable(format!(
                "NLB {lb_name} is in the failed state: {}",
                nlb.state()
                    .and_then(|s| s.reason())
                    .unwrap_or("no reason given")
            )));
        }
        let arn = nlb.load_balancer_arn().unwrap_or_default().to_owned();
        self.sync_attributes(&arn, &o).await?;
        let ids: BTreeSet<String> = targets
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        let mut wanted = Vec::new();
        for l in &ls {
            let tg = self.target_group(&lb_name, &vpc, l, &hc, &o, &tags).await?;
            let tg_arn = tg.target_group_arn().unwrap_or_default().to_owned();
            self.sync_targets(&tg_arn, &ids, l.node_port).await?;
            wanted.push((l.clone(), tg_arn));
        }
        let before = self.sync_listeners(&arn, &wanted, &o).await?;
        // Groups no listener uses any more (a port or node port changed).
        // One left by a failed attempt is found by the Service's delete,
        // which looks for every group of the Service.
        let in_use: BTreeSet<&str> = wanted.iter().map(|(_, a)| a.as_str()).collect();
        for stale in before.iter().filter(|a| !in_use.contains(a.as_str())) {
            self.delete_target_group(stale).await?;
        }
        if is_provisioning(&nlb) {
            // Ask once more: the NLB may have become active meanwhile.
            if let Some(now) = self.find_nlb(&lb_name).await?
                && !is_provisioning(&now)
            {
                return Ok(status_of(&now));
            }
            return Err(CloudError::Provisioning {
                retry_after: PROVISIONING_RETRY,
                message: format!("NLB {lb_name} is being provisioned"),
            });
        }
        Ok(status_of(&nlb))
    }

    async fn update_hosts(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<()> {
        let service = spec.service.clone();
        let o = annotations::parse(&spec.annotations)?;
        let ls = listenings(spec, &o)?;
        let lb_name = load_balancer_name(&service.uid);
        let Some(nlb) = self.owned_nlb(cluster, &lb_name).await? else {
            return Err(CloudError::NotFound(format!("load balancer {lb_name}")));
        };
        let targets = self.target_instances(hosts, &o).await?;
        let ids: BTreeSet<String> = targets
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        if let Some(group) = nlb.security_groups().first() {
            let hc = health_check(spec, &o)?;
            self.open_nodes(cluster, group, &targets, &node_rules(group, &ls, &hc))
                .await?;
        }
        // The groups by name: one that is missing means the ports changed,
        // and only a full ensure makes new groups.
        let names: Vec<String> = ls.iter().map(|l| target_group_name(&lb_name, l)).collect();
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
        for (l, name) in ls.iter().zip(&names) {
            let Some(tg) = groups
                .iter()
                .find(|g| g.target_group_name() == Some(name.as_str()))
            else {
                return Err(CloudError::NotFound(format!("target group {name}")));
            };
            self.sync_targets(tg.target_group_arn().unwrap_or_default(), &ids, l.node_port)
                .await?;
        }
        Ok(())
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
        }
        for g in self.service_target_groups(cluster, service).await? {
            if let Some(arn) = g.target_group_arn() {
                self.delete_target_group(arn).await?;
            }
            vpc = vpc.or_else(|| g.vpc_id().map(str::to_owned));
        }
        let name = security_group_name(&lb_name);
        let Some(vpc) = vpc else {
            return Ok(());
        };
        let group = match self.find_security_group(cluster, &vpc, &name).await {
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
        self.close_nodes(&vpc, &id).await?;
        match self.ec2.delete_security_group().group_id(&id).send().await {
            Ok(_) => Ok(()),
            Err(e) if errors::code(&e) == Some("InvalidGroup.NotFound") => Ok(()),
            // The NLB's network interfaces go a while after the NLB.
            Err(e) if errors::code(&e) == Some("DependencyViolation") => {
                Err(CloudError::Provisioning {
                    retry_after: PROVISIONING_RETRY,
                    message: format!(
                        "security group {id} is still in use while NLB {lb_name} goes"
                    ),
                })
            }
            Err(e) => Err(errors::cloud_error("DeleteSecurityGroup", e)),
        }
    }

    fn host_label_annotations(&self) -> &'static [&'static str] {
        &[annotations::TARGET_NODE_LABELS]
    }

    async fn list(&self, cluster: &str) -> Result<Vec<LoadBalancer>> {
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
        let mut out = Vec::new();
        for (nlb, t) in self.owned_by(cluster, nlbs, Nlb::load_balancer_arn).await? {
            let t = &t;
            let (namespace, name) = tag_value(t, TAG_SERVICE_NAME)
                .and_then(|v| v.split_once('/'))
                .unwrap_or_default();
            out.push(LoadBalancer {
                name: nlb.load_balancer_name().unwrap_or_default().to_owned(),
                service: ServiceRef {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    uid: tag_value(t, TAG_SERVICE_UID).unwrap_or_default().to_owned(),
                },
                status: if is_provisioning(&nlb) {
                    LoadBalancerStatus::default()
                } else {
                    status_of(&nlb)
                },
                hosts: Vec::new(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_provider::ServicePort;

    fn port(name: &str, protocol: Protocol, port: i32, node_port: i32) -> ServicePort {
        ServicePort {
            name: name.into(),
            protocol,
            port,
            node_port,
        }
    }

    fn spec(ports: Vec<ServicePort>) -> LoadBalancerSpec {
        LoadBalancerSpec {
            ports,
            ..Default::default()
        }
    }

    #[test]
    fn tcp_and_udp_on_one_port_share_a_tcp_udp_listener() {
        let s = spec(vec![
            port("dns-tcp", Protocol::Tcp, 53, 30053),
            port("dns-udp", Protocol::Udp, 53, 30053),
            port("web", Protocol::Tcp, 80, 30080),
        ]);
        let ls = listenings(&s, &NlbOptions::default()).unwrap();
        assert_eq!(ls.len(), 2);
        assert_eq!(ls[0].listener, ProtocolEnum::TcpUdp);
        assert_eq!(ls[1].listener, ProtocolEnum::Tcp);
    }

    #[test]
    fn ports_an_nlb_cannot_carry_are_refused_with_why() {
        let sctp = spec(vec![port("", Protocol::Sctp, 9, 30009)]);
        assert!(listenings(&sctp, &NlbOptions::default()).is_err());
        let split = spec(vec![
            port("a", Protocol::Tcp, 53, 30053),
            port("b", Protocol::Udp, 53, 30054),
        ]);
        let err = listenings(&split, &NlbOptions::default()).unwrap_err();
        assert!(err.to_string().contains("same node port"), "{err}");
        let many = spec(
            (1..=51)
                .map(|p| port("", Protocol::Tcp, p, 30000 + p))
                .collect(),
        );
        let err = listenings(&many, &NlbOptions::default()).unwrap_err();
        assert!(err.to_string().contains("at most 50 listeners"), "{err}");
    }

    #[test]
    fn local_traffic_checks_healthz_on_the_health_check_node_port() {
        let mut s = spec(vec![port("", Protocol::Tcp, 80, 30080)]);
        s.external_traffic_policy = TrafficPolicy::Local;
        s.health_check_node_port = 32000;
        let hc = health_check(&s, &NlbOptions::default()).unwrap();
        assert_eq!(hc.protocol, ProtocolEnum::Http);
        assert_eq!(hc.port, "32000");
        assert_eq!(hc.path.as_deref(), Some("/healthz"));
        s.external_traffic_policy = TrafficPolicy::Cluster;
        let hc = health_check(&s, &NlbOptions::default()).unwrap();
        assert_eq!(hc.protocol, ProtocolEnum::Tcp);
        assert_eq!(hc.port, "traffic-port");
        assert_eq!(hc.path, None);
    }

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
}
