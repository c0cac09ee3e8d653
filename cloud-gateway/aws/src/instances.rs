//! Instances: nodes to EC2 instances in batches. A node with a provider ID
//! (`aws:///<zone>/<instance-id>`) is found by its instance ID, one without
//! by its name as the instance's private DNS name (the upstream
//! convention), or by instance ID when the name is a resource name
//! (`i-0123...` or `i-0123....<region>.compute.internal`). An EKS Fargate
//! node (`fargate-<address>` as its name or its provider ID's last
//! segment) is its pod's network interface, found by private address with
//! `DescribeNetworkInterfaces`, as upstream finds it.
//!
//! Both kinds go to `DescribeInstances` as filters, never as `InstanceIds`:
//! with a list of IDs, one missing ID fails the whole call, while a filter
//! answers with the instances that exist, so exactly the missing ones are
//! "not found" and every other node still gets its answer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use async_trait::async_trait;
use aws_sdk_ec2::types::{
    AttachmentStatus, Instance as Ec2Instance, InstanceStateName, NetworkInterface,
    NetworkInterfaceStatus, Tag,
};
use ccm_provider::{
    AddressType, CloudError, Instance, Instances, Lookup, NodeAddress, NodeRef, Result, TagOutcome,
};

use super::tags::{FILTER_VALUES, LEGACY_CLUSTER_TAG};
use super::{AwsCloud, NAME};
use crate::settings::IpFamily;

/// The label upstream sets to the zone's ID (the same physical zone in
/// every account, unlike the zone's name).
pub(super) const LABEL_ZONE_ID: &str = "topology.k8s.aws/zone-id";

/// Whether `id` has the form of an EC2 instance ID.
pub(super) fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|rest| {
        (1..=32).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// The instance ID in an AWS provider ID: `aws:///<zone>/<id>`,
/// `aws:////<id>`, `aws:///<id>`, or the bare `<id>` upstream takes too.
pub(super) fn parse_provider_id(provider_id: &str) -> std::result::Result<String, String> {
    let invalid =
        || format!("{provider_id:?} is not an AWS provider ID (aws:///<zone>/<instance-id>)");
    if is_instance_id(provider_id) {
        return Ok(provider_id.to_owned());
    }
    let path = provider_id
        .strip_prefix(NAME)
        .and_then(|s| s.strip_prefix("://"))
        .ok_or_else(invalid)?;
    // The host part is empty: the path starts right after "aws://".
    let path = path.strip_prefix('/').ok_or_else(invalid)?;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let id = match parts.as_slice() {
        [id] | [_, id] => *id,
        _ => return Err(invalid()),
    };
    if is_instance_id(id) {
        Ok(id.to_owned())
    } else {
        Err(invalid())
    }
}

/// The prefix of a Fargate node's name, and of its provider ID's last
/// segment.
const FARGATE_PREFIX: &str = "fargate-";

/// The private IPv4 address a Fargate node's name or provider ID segment
/// names: `fargate-10.0.1.5`, or `fargate-ip-10-0-1-5.<domain>` (as a VPC
/// without DNS support and one with it write it).
pub(super) fn fargate_address(segment: &str) -> Option<Ipv4Addr> {
    let rest = segment.strip_prefix(FARGATE_PREFIX)?;
    match rest.strip_prefix("ip-") {
        Some(name) => name.split('.').next()?.replace('-', ".").parse().ok(),
        None => rest.parse().ok(),
    }
}

/// The address of a Fargate provider ID: `aws:///<zone>/.../fargate-...`,
/// the Fargate segment last (EKS puts one more segment before it).
fn parse_fargate_provider_id(provider_id: &str) -> Option<Ipv4Addr> {
    let path = provider_id.strip_prefix(NAME)?.strip_prefix(":///")?;
    fargate_address(path.rsplit('/').next()?)
}

/// The provider ID of an instance in `zone`.
pub(super) fn provider_id(zone: &str, id: &str) -> String {
    format!("{NAME}:///{zone}/{id}")
}

/// How one node is looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Key {
    /// By instance ID.
    Id(String),
    /// By private DNS name.
    DnsName(String),
    /// A Fargate node, by its network interface's private address; with
    /// the provider ID it has, or the name to make one of.
    Fargate { address: Ipv4Addr, id: FargateId },
}

/// What a Fargate node's provider ID is: the one it has, kept as it is,
/// or one made of its name and its zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum FargateId {
    Given(String),
    Name(String),
}

impl Key {
    /// How `node` is looked up; its provider ID was checked before.
    pub(super) fn of(node: &NodeRef) -> Result<Self> {
        if node.provider_id.is_empty() {
            return Ok(Self::of_name(&node.name));
        }
        if let Some(address) = parse_fargate_provider_id(&node.provider_id) {
            return Ok(Key::Fargate {
                address,
                id: FargateId::Given(node.provider_id.clone()),
            });
        }
        parse_provider_id(&node.provider_id)
            .map(Key::Id)
            .map_err(|e| CloudError::invalid("provider_id", e))
    }

    /// How a node named `name` is looked up.
    pub(super) fn of_name(name: &str) -> Self {
        if let Some(address) = fargate_address(name) {
            return Key::Fargate {
                address,
                id: FargateId::Name(name.to_owned()),
            };
        }
        // A resource name: the instance ID, alone or as the first label.
        let first = name.split('.').next().unwrap_or_default();
        if is_instance_id(first) {
            Key::Id(first.to_owned())
        } else {
            Key::DnsName(name.to_owned())
        }
    }
}

/// Whether EC2 still counts the instance: a terminated one is gone.
pub(super) fn is_alive(instance: &Ec2Instance) -> bool {
    !matches!(
        instance.state().and_then(|s| s.name()),
        Some(InstanceStateName::Terminated)
    )
}

/// Whether the instance is shut down: `stopped`, as upstream decides it.
/// A `stopping` instance still runs (it may yet be serving, and its Node
/// is not tainted until it has stopped); pending and shutting-down ones
/// exist and are not shut down.
fn is_shut_down(instance: &Ec2Instance) -> bool {
    instance.state().and_then(|s| s.name()) == Some(&InstanceStateName::Stopped)
}

/// Instances found for a batch of keys.
#[derive(Debug, Default)]
pub(super) struct Found {
    by_id: HashMap<String, Ec2Instance>,
    by_name: HashMap<String, Ec2Instance>,
    /// Fargate nodes' attached network interfaces by private address
    /// (several where VPCs overlap and no VPC was named).
    fargate: HashMap<Ipv4Addr, Vec<NetworkInterface>>,
}

impl Found {
    /// The instance for `key`, if EC2 knows it (terminated ones included);
    /// none for a Fargate node, which is no instance.
    pub(super) fn get(&self, key: &Key) -> Option<&Ec2Instance> {
        match key {
            Key::Id(id) => self.by_id.get(id),
            Key::DnsName(name) => self.by_name.get(name),
            Key::Fargate { .. } => None,
        }
    }
}

impl AwsCloud {
    /// Finds the instances for `keys` in at most one request per 200 IDs
    /// and one per 200 names (and their pages).
    pub(super) async fn find(&self, keys: &[Key]) -> Result<Found> {
        let mut ids = BTreeSet::new();
        let mut names = BTreeSet::new();
        let mut addresses = BTreeSet::new();
        for key in keys {
            match key {
                Key::Id(id) => ids.insert(id.as_str()),
                Key::DnsName(name) => names.insert(name.as_str()),
                Key::Fargate { address, .. } => addresses.insert(*address),
            };
        }
        let mut found = Found {
            fargate: self.fargate_interfaces(&addresses).await?,
            ..Found::default()
        };
        let ids: Vec<&str> = ids.into_iter().collect();
        for chunk in ids.chunks(FILTER_VALUES) {
            for instance in self
                .describe_instances(vec![super::tags::filter(
                    "instance-id",
                    chunk.iter().copied(),
                )])
                .await?
            {
                if let Some(id) = instance.instance_id() {
                    found.by_id.insert(id.to_owned(), instance);
                }
            }
        }
        let names: Vec<&str> = names.into_iter().collect();
        for chunk in names.chunks(FILTER_VALUES) {
            let mut filters = vec![super::tags::filter(
                "private-dns-name",
                chunk.iter().copied(),
            )];
            // Private DNS names repeat across VPCs; the cluster's VPC,
            // when known, decides.
            if let Some(vpc) = &self.settings.vpc_id {
                filters.push(super::tags::filter("vpc-id", [vpc.as_str()]));
            }
            for instance in self.describe_instances(filters).await? {
                let Some(name) = instance.private_dns_name().map(str::to_owned) else {
                    continue;
                };
                match found.by_name.get(&name) {
                    // A live instance wins over a terminated one that had
                    // the same address.
                    Some(existing) if is_alive(existing) && !is_alive(&instance) => {}
                    Some(existing) if is_alive(existing) && is_alive(&instance) => {
                        return Err(CloudError::NotConfigured(format!(
                            "two live instances ({} and {}) have the private DNS name {name}; \
                             set --aws-vpc-id to the cluster's VPC",
                            existing.instance_id().unwrap_or_default(),
                            instance.instance_id().unwrap_or_default()
                        )));
                    }
                    _ => {
                        found.by_name.insert(name, instance);
                    }
                }
            }
        }
        Ok(found)
    }

    /// The attached network interfaces with the private `addresses`, in
    /// the cluster's VPC when it is known (one request per 200).
    async fn fargate_interfaces(
        &self,
        addresses: &BTreeSet<Ipv4Addr>,
    ) -> Result<HashMap<Ipv4Addr, Vec<NetworkInterface>>> {
        let mut out: HashMap<Ipv4Addr, Vec<NetworkInterface>> = HashMap::new();
        let addresses: Vec<String> = addresses.iter().map(Ipv4Addr::to_string).collect();
        for chunk in addresses.chunks(FILTER_VALUES) {
            let mut filters = vec![super::tags::filter(
                "private-ip-address",
                chunk.iter().map(String::as_str),
            )];
            if let Some(vpc) = &self.settings.vpc_id {
                filters.push(super::tags::filter("vpc-id", [vpc.as_str()]));
            }
            // Attached ones only: a detached interface is a pod gone.
            let interfaces = self.describe_network_interfaces(filters).await?;
            for interface in interfaces.into_iter().filter(|i| {
                i.attachment().and_then(|a| a.status()) == Some(&AttachmentStatus::Attached)
            }) {
                let Some(address) = interface
                    .private_ip_address()
                    .and_then(|a| a.parse::<Ipv4Addr>().ok())
                else {
                    continue;
                };
                out.entry(address).or_default().push(interface);
            }
        }
        Ok(out)
    }

    /// Every network interface matching `filters`, every page.
    async fn describe_network_interfaces(
        &self,
        filters: Vec<aws_sdk_ec2::types::Filter>,
    ) -> Result<Vec<NetworkInterface>> {
        let filters = &filters;
        super::every_page(|token| async move {
            let page = self
                .ec2
                .describe_network_interfaces()
                .set_filters(Some(filters.clone()))
                .max_results(1000)
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| super::errors::cloud_error("DescribeNetworkInterfaces", e))?;
            let interfaces = page.network_interfaces().to_vec();
            Ok((interfaces, page.next_token().map(str::to_owned)))
        })
        .await
    }

    /// What the cloud says about a Fargate node: running while its
    /// network interface is attached, gone once it is not. Where VPCs
    /// overlap (no `--aws-vpc-id`), the interface whose private DNS name is
    /// in the node's name decides, as upstream compares them; one that
    /// cannot be told apart is an error, never a guess.
    fn fargate_lookup(
        &self,
        address: &Ipv4Addr,
        id: &FargateId,
        found: &Found,
        zone_ids: &HashMap<String, String>,
    ) -> Result<Lookup> {
        let candidates = found.fargate.get(address).map(Vec::as_slice);
        let interface = match candidates.unwrap_or_default() {
            [] => return Ok(Lookup::NotFound),
            [one] => one,
            several => {
                let name = match id {
                    FargateId::Given(given) => given.rsplit('/').next().unwrap_or_default(),
                    FargateId::Name(name) => name.as_str(),
                };
                let dns = name.strip_prefix(FARGATE_PREFIX).unwrap_or(name);
                let named: Vec<&NetworkInterface> = several
                    .iter()
                    .filter(|i| i.private_dns_name() == Some(dns))
                    .collect();
                match named.as_slice() {
                    [one] => *one,
                    _ => {
                        return Err(CloudError::NotConfigured(format!(
                            "{} network interfaces in different VPCs have the private address {address}; set --aws-vpc-id to the cluster's VPC",
                            several.len()
                        )));
                    }
                }
            }
        };
        let zone = interface.availability_zone().unwrap_or_default();
        let mut labels = HashMap::new();
        if let Some(zone_id) = zone_ids.get(zone) {
            labels.insert(LABEL_ZONE_ID.to_owned(), zone_id.clone());
        }
        Ok(Lookup::Running(Instance {
            provider_id: match id {
                FargateId::Given(given) => given.clone(),
                FargateId::Name(name) => provider_id(zone, name),
            },
            // Upstream reports none: Fargate has no instance types.
            instance_type: String::new(),
            zone: zone.to_owned(),
            region: self.region.clone(),
            addresses: fargate_addresses(interface, &self.settings.node_ip_families),
            additional_labels: labels,
        }))
    }

    /// What the cloud says about `instance`.
    fn lookup(&self, instance: Option<&Ec2Instance>, zone_ids: &HashMap<String, String>) -> Lookup {
        let Some(instance) = instance.filter(|i| is_alive(i)) else {
            return Lookup::NotFound;
        };
        let metadata = self.metadata(instance, zone_ids);
        if is_shut_down(instance) {
            Lookup::Shutdown(metadata)
        } else {
            Lookup::Running(metadata)
        }
    }

    fn metadata(&self, instance: &Ec2Instance, zone_ids: &HashMap<String, String>) -> Instance {
        let zone = instance
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default();
        let id = instance.instance_id().unwrap_or_default();
        let mut labels: HashMap<String, String> = self.topologies.labels(id).into_iter().collect();
        if let Some(zone_id) = zone_ids.get(zone) {
            labels.insert(LABEL_ZONE_ID.to_owned(), zone_id.clone());
        }
        Instance {
            provider_id: provider_id(zone, id),
            instance_type: instance
                .instance_type()
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
            zone: zone.to_owned(),
            region: self.region.clone(),
            addresses: addresses(instance, &self.settings.node_ip_families),
            additional_labels: labels,
        }
    }
}

fn address(kind: AddressType, address: &str) -> NodeAddress {
    NodeAddress::new(kind, address)
}

/// A node's addresses, as upstream orders them: per family in `families`'
/// order; for IPv4 the private addresses of attached interfaces by device
/// index (each interface's primary first), the public address, then the
/// private DNS name (as InternalDNS and Hostname) and the public one; for
/// IPv6 every address of each attached interface as InternalIP.
pub(super) fn addresses(instance: &Ec2Instance, families: &[IpFamily]) -> Vec<NodeAddress> {
    let mut interfaces: Vec<_> = instance
        .network_interfaces()
        .iter()
        .filter(|i| i.status() == Some(&NetworkInterfaceStatus::InUse))
        .collect();
    interfaces.sort_by_key(|i| {
        i.attachment()
            .and_then(|a| a.device_index())
            .unwrap_or(i32::MAX)
    });
    let mut out = Vec::new();
    for family in families {
        match family {
            IpFamily::V4 => {
                for interface in &interfaces {
                    let mut ips: Vec<_> = interface.private_ip_addresses().iter().collect();
                    ips.sort_by_key(|ip| !ip.primary().unwrap_or(false));
                    out.extend(
                        ips.iter()
                            .filter_map(|ip| ip.private_ip_address())
                            .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
                            .map(|ip| address(AddressType::InternalIp, ip)),
                    );
                }
                if let Some(ip) = instance
                    .public_ip_address()
                    .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
                {
                    out.push(address(AddressType::ExternalIp, ip));
                }
                if let Some(name) = instance.private_dns_name().filter(|n| !n.is_empty()) {
                    out.push(address(AddressType::InternalDns, name));
                    out.push(address(AddressType::Hostname, name));
                }
                if let Some(name) = instance.public_dns_name().filter(|n| !n.is_empty()) {
                    out.push(address(AddressType::ExternalDns, name));
                }
            }
            IpFamily::V6 => {
                for interface in &interfaces {
                    let mut ips: Vec<_> = interface.ipv6_addresses().iter().collect();
                    ips.sort_by_key(|ip| !ip.is_primary_ipv6().unwrap_or(false));
                    out.extend(
                        ips.iter()
                            .filter_map(|ip| ip.ipv6_address())
                            .filter_map(|ip| ip.parse::<std::net::Ipv6Addr>().ok())
                            .map(|ip| address(AddressType::InternalIp, &ip.to_string())),
                    );
                }
            }
        }
    }
    out
}

/// A Fargate node's addresses, as upstream gives them: per family, the
/// interface's private address (IPv4) or its first IPv6 address as
/// InternalIP, each followed by its private DNS name as InternalDNS when
/// the VPC has one (once here, where upstream repeats it per family).
fn fargate_addresses(interface: &NetworkInterface, families: &[IpFamily]) -> Vec<NodeAddress> {
    let dns = interface.private_dns_name().filter(|n| !n.is_empty());
    let mut out = Vec::new();
    for family in families {
        let ip = match family {
            IpFamily::V4 => interface.private_ip_address().map(str::to_owned),
            IpFamily::V6 => interface
                .ipv6_addresses()
                .first()
                .and_then(|a| a.ipv6_address())
                .and_then(|a| a.parse::<std::net::Ipv6Addr>().ok())
                .map(|a| a.to_string()),
        };
        if let Some(ip) = ip {
            out.push(address(AddressType::InternalIp, &ip));
        }
    }
    if let Some(name) = dns {
        out.push(address(AddressType::InternalDns, name));
    }
    out
}

#[async_trait]
impl Instances for AwsCloud {
    async fn get_instances(&self, nodes: &[NodeRef]) -> Result<Vec<Lookup>> {
        let keys = nodes.iter().map(Key::of).collect::<Result<Vec<_>>>()?;
        let found = self.find(&keys).await?;
        let zones: BTreeSet<&str> = keys
            .iter()
            .filter_map(|k| found.get(k))
            .filter_map(|i| i.placement().and_then(|p| p.availability_zone()))
            .chain(
                found
                    .fargate
                    .values()
                    .flatten()
                    .filter_map(|i| i.availability_zone()),
            )
            .collect();
        let zone_ids = self.zone_ids(&zones).await;
        let alive: Vec<&Ec2Instance> = keys
            .iter()
            .filter_map(|k| found.get(k))
            .filter(|i| is_alive(i))
            .collect();
        self.learn_topologies(&alive).await?;
        keys.iter()
            .map(|key| match key {
                Key::Fargate { address, id } => self.fargate_lookup(address, id, &found, &zone_ids),
                _ => Ok(self.lookup(found.get(key), &zone_ids)),
            })
            .collect()
    }

    fn check_provider_id(&self, provider_id: &str) -> std::result::Result<(), String> {
        if parse_fargate_provider_id(provider_id).is_some() {
            return Ok(());
        }
        parse_provider_id(provider_id).map(drop)
    }

    fn accepts_bare_provider_id(&self, provider_id: &str) -> bool {
        is_instance_id(provider_id)
    }

    fn tags_instances(&self) -> bool {
        true
    }

    /// Tags the EC2 instances behind `nodes`, as upstream's tagging
    /// controller does: those that exist and carry the cluster's tag (either
    /// form), found first (a tag request naming a missing instance fails
    /// as a whole), then one `CreateTags` or `DeleteTags` per 200. A
    /// Fargate node, another cluster's instance or a provider ID of another
    /// form is not taggable. The cluster's own tags and AWS's (`aws:`) are
    /// never given or taken away here.
    async fn tag_instances(
        &self,
        cluster: &str,
        nodes: &[NodeRef],
        tags: &BTreeMap<String, String>,
        remove: bool,
    ) -> Result<Vec<TagOutcome>> {
        if let Some(key) = tags
            .keys()
            .find(|k| k.to_ascii_lowercase().starts_with("aws:"))
        {
            return Err(CloudError::invalid(
                "tags",
                format!("{key} starts with aws:, which AWS keeps for itself"),
            ));
        }
        if let Some(key) = tags
            .keys()
            .find(|k| k.starts_with(super::tags::CLUSTER_TAG_PREFIX) || *k == LEGACY_CLUSTER_TAG)
        {
            return Err(CloudError::invalid(
                "tags",
                format!(
                    "{key} says which cluster an instance is in: it is not a tag to set on nodes"
                ),
            ));
        }
        let ids: Vec<Option<String>> = nodes
            .iter()
            .map(|n| parse_provider_id(&n.provider_id).ok())
            .collect();
        let keys: Vec<Key> = ids.iter().flatten().cloned().map(Key::Id).collect();
        let found = self.find(&keys).await?;
        let live: BTreeSet<&str> = keys
            .iter()
            .filter_map(|k| found.get(k))
            .filter(|i| is_alive(i))
            .filter_map(|i| i.instance_id())
            .collect();
        // Only the cluster's: another's is not ours to tag (nor, by the
        // IAM policy, allowed), and one refusal would fail the whole request.
        let ours: BTreeSet<&str> = keys
            .iter()
            .filter_map(|k| found.get(k))
            .filter(|i| super::tags::belongs_to(i.tags(), cluster))
            .filter_map(|i| i.instance_id())
            .collect();
        let taggable: Vec<&str> = live.intersection(&ours).copied().collect();
        let tags: Vec<Tag> = tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        for chunk in taggable.chunks(FILTER_VALUES) {
            let resources: Vec<String> = chunk.iter().map(|s| s.to_string()).collect();
            let sent = if remove {
                self.ec2
                    .delete_tags()
                    .set_resources(Some(resources))
                    .set_tags(Some(tags.clone()))
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| super::errors::cloud_error("DeleteTags", e))
            } else {
                self.ec2
                    .create_tags()
                    .set_resources(Some(resources))
                    .set_tags(Some(tags.clone()))
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| super::errors::cloud_error("CreateTags", e))
            };
            sent?;
        }
        Ok(ids
            .iter()
            .map(|id| match id {
                None => TagOutcome::NotTaggable,
                Some(id) if !live.contains(id.as_str()) => TagOutcome::NotFound,
                Some(id) if ours.contains(id.as_str()) => TagOutcome::Done,
                Some(_) => TagOutcome::NotTaggable,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::{
        InstanceIpv6Address, InstanceNetworkInterface, InstanceNetworkInterfaceAttachment,
        InstancePrivateIpAddress,
    };

    use super::*;

    #[test]
    fn only_a_stopped_instance_is_shut_down_as_upstream_decides() {
        let in_state = |name| {
            Ec2Instance::builder()
                .state(
                    aws_sdk_ec2::types::InstanceState::builder()
                        .name(name)
                        .build(),
                )
                .build()
        };
        assert!(is_shut_down(&in_state(InstanceStateName::Stopped)));
        for running in [
            InstanceStateName::Stopping,
            InstanceStateName::Pending,
            InstanceStateName::Running,
            InstanceStateName::ShuttingDown,
        ] {
            assert!(!is_shut_down(&in_state(running.clone())), "{running:?}");
        }
    }

    #[test]
    fn provider_ids_of_every_upstream_form_parse() {
        for id in [
            "aws:///eu-west-1a/i-0123456789abcdef0",
            "aws:////i-0123456789abcdef0",
            "aws:///i-0123456789abcdef0",
            "i-0123456789abcdef0",
        ] {
            assert_eq!(
                parse_provider_id(id).as_deref(),
                Ok("i-0123456789abcdef0"),
                "{id}"
            );
        }
        for bad in [
            "aws://host/zone/i-0123",
            "aws:///zone/vol-0123",
            "aws:///a/b/i-0123",
            "aws:///",
            "sim://i-1",
            "i-",
            "vol-0123",
        ] {
            assert!(parse_provider_id(bad).is_err(), "{bad}");
        }
        assert_eq!(
            provider_id("eu-west-1a", "i-1"),
            "aws:///eu-west-1a/i-1".to_owned()
        );
    }

    #[test]
    fn node_names_are_dns_names_unless_they_are_resource_names() {
        let by_name = |name: &str| {
            Key::of(&NodeRef {
                name: name.into(),
                provider_id: String::new(),
            })
            .unwrap()
        };
        assert_eq!(
            by_name("ip-10-0-1-5.eu-west-1.compute.internal"),
            Key::DnsName("ip-10-0-1-5.eu-west-1.compute.internal".into())
        );
        assert_eq!(
            by_name("i-0123456789abcdef0.eu-west-1.compute.internal"),
            Key::Id("i-0123456789abcdef0".into())
        );
        assert_eq!(
            by_name("i-0123456789abcdef0"),
            Key::Id("i-0123456789abcdef0".into())
        );
    }

    fn interface(
        index: i32,
        status: NetworkInterfaceStatus,
        ips: &[(&str, bool)],
        v6: &[&str],
    ) -> InstanceNetworkInterface {
        InstanceNetworkInterface::builder()
            .status(status)
            .attachment(
                InstanceNetworkInterfaceAttachment::builder()
                    .device_index(index)
                    .build(),
            )
            .set_private_ip_addresses(Some(
                ips.iter()
                    .map(|(ip, primary)| {
                        InstancePrivateIpAddress::builder()
                            .private_ip_address(*ip)
                            .primary(*primary)
                            .build()
                    })
                    .collect(),
            ))
            .set_ipv6_addresses(Some(
                v6.iter()
                    .map(|ip| InstanceIpv6Address::builder().ipv6_address(*ip).build())
                    .collect(),
            ))
            .build()
    }

    #[test]
    fn addresses_list_interfaces_by_device_primary_first_then_public_then_names() {
        let instance = Ec2Instance::builder()
            .network_interfaces(interface(
                1,
                NetworkInterfaceStatus::InUse,
                &[("10.0.2.7", true)],
                &["2600:1f18::7"],
            ))
            .network_interfaces(interface(
                0,
                NetworkInterfaceStatus::InUse,
                &[("10.0.1.9", false), ("10.0.1.5", true)],
                &[],
            ))
            .network_interfaces(interface(
                2,
                NetworkInterfaceStatus::Detaching,
                &[("10.0.3.3", true)],
                &[],
            ))
            .public_ip_address("54.1.2.3")
            .private_dns_name("ip-10-0-1-5.ec2.internal")
            .public_dns_name("ec2-54-1-2-3.compute-1.amazonaws.com")
            .build();
        let got: Vec<(String, String)> = addresses(&instance, &[IpFamily::V4, IpFamily::V6])
            .into_iter()
            .map(|a| (a.kind.as_str().to_owned(), a.address))
            .collect();
        let want: Vec<(String, String)> = [
            ("InternalIP", "10.0.1.5"),
            ("InternalIP", "10.0.1.9"),
            ("InternalIP", "10.0.2.7"),
            ("ExternalIP", "54.1.2.3"),
            ("InternalDNS", "ip-10-0-1-5.ec2.internal"),
            ("Hostname", "ip-10-0-1-5.ec2.internal"),
            ("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
            ("InternalIP", "2600:1f18::7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(got, want);
        let v4_only = addresses(&instance, &[IpFamily::V4]);
        assert!(v4_only.iter().all(|a| !a.address.contains(':')));
    }

    #[test]
    fn fargate_nodes_are_found_by_the_address_in_their_name_or_provider_id() {
        let v4 = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(fargate_address("fargate-10.0.1.5"), Some(v4("10.0.1.5")));
        assert_eq!(
            fargate_address("fargate-ip-192-168-150-148.eu-west-1.compute.internal"),
            Some(v4("192.168.150.148"))
        );
        assert_eq!(fargate_address("fargate-ip-10-0-1"), None);
        assert_eq!(fargate_address("ip-10-0-1-5.ec2.internal"), None);
        // EKS writes a segment between the zone and the node's name.
        let eks =
            "aws:///eu-west-1b/0123456789abcdef/fargate-ip-10-0-1-5.eu-west-1.compute.internal";
        let node = NodeRef {
            name: "fargate-ip-10-0-1-5.eu-west-1.compute.internal".into(),
            provider_id: eks.into(),
        };
        assert_eq!(
            Key::of(&node).unwrap(),
            Key::Fargate {
                address: v4("10.0.1.5"),
                id: FargateId::Given(eks.into())
            }
        );
        assert!(parse_fargate_provider_id("aws:///eu-west-1a/fargate-10.0.1.5").is_some());
        assert!(parse_fargate_provider_id("gce:///z/fargate-10.0.1.5").is_none());
        assert_eq!(
            Key::of_name("fargate-10.0.2.9"),
            Key::Fargate {
                address: v4("10.0.2.9"),
                id: FargateId::Name("fargate-10.0.2.9".into())
            }
        );
        // Not an EC2 instance: never an NLB target or a route's.
        assert!(parse_provider_id(eks).is_err());
    }

    #[test]
    fn a_fargate_nodes_addresses_are_its_interfaces() {
        let interface = NetworkInterface::builder()
            .private_ip_address("10.0.1.5")
            .private_dns_name("ip-10-0-1-5.ec2.internal")
            .ipv6_addresses(
                aws_sdk_ec2::types::NetworkInterfaceIpv6Address::builder()
                    .ipv6_address("2600:1f18:0::7")
                    .build(),
            )
            .build();
        let got: Vec<(String, String)> =
            fargate_addresses(&interface, &[IpFamily::V4, IpFamily::V6])
                .into_iter()
                .map(|a| (a.kind.as_str().to_owned(), a.address))
                .collect();
        let want = [
            ("InternalIP", "10.0.1.5"),
            ("InternalIP", "2600:1f18::7"),
            ("InternalDNS", "ip-10-0-1-5.ec2.internal"),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for ((k, v), (wk, wv)) in got.iter().zip(want) {
            assert_eq!((k.as_str(), v.as_str()), (wk, wv));
        }
    }
}
