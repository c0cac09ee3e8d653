//! Between the wire types of `cloudgateway.v1` and the provider API's
//! plain types. A request is converted only after it passed
//! [`super::validate`], so a value the checks refuse (an unknown enum
//! number, a missing reference) never reaches this point; where one could,
//! it is left out rather than guessed.

use ccm_proto::v1 as wire;
use ccm_provider::{
    AddressType, Host, Ingress, Instance, IpFamily, LoadBalancer, LoadBalancerSpec,
    LoadBalancerStatus, NodeAddress, NodeRef, PortStatus, Protocol, Route, ServicePort, ServiceRef,
    SessionAffinity, TrafficPolicy,
};

fn address_type(value: i32) -> Option<AddressType> {
    Some(match wire::NodeAddressType::try_from(value).ok()? {
        wire::NodeAddressType::Hostname => AddressType::Hostname,
        wire::NodeAddressType::InternalIp => AddressType::InternalIp,
        wire::NodeAddressType::ExternalIp => AddressType::ExternalIp,
        wire::NodeAddressType::InternalDns => AddressType::InternalDns,
        wire::NodeAddressType::ExternalDns => AddressType::ExternalDns,
        wire::NodeAddressType::Unspecified => return None,
    })
}

fn address_type_to_wire(kind: AddressType) -> wire::NodeAddressType {
    match kind {
        AddressType::Hostname => wire::NodeAddressType::Hostname,
        AddressType::InternalIp => wire::NodeAddressType::InternalIp,
        AddressType::ExternalIp => wire::NodeAddressType::ExternalIp,
        AddressType::InternalDns => wire::NodeAddressType::InternalDns,
        AddressType::ExternalDns => wire::NodeAddressType::ExternalDns,
    }
}

/// Addresses from the wire; one of no known kind is left out.
pub fn addresses(addresses: Vec<wire::NodeAddress>) -> Vec<NodeAddress> {
    addresses
        .into_iter()
        .filter_map(|a| Some(NodeAddress::new(address_type(a.r#type)?, a.address)))
        .collect()
}

/// Addresses for the wire.
pub fn addresses_to_wire(addresses: Vec<NodeAddress>) -> Vec<wire::NodeAddress> {
    addresses
        .into_iter()
        .map(|a| wire::NodeAddress {
            r#type: address_type_to_wire(a.kind) as i32,
            address: a.address,
        })
        .collect()
}

/// A node reference from the wire.
pub fn node(node: wire::NodeRef) -> NodeRef {
    NodeRef {
        name: node.name,
        provider_id: node.provider_id,
    }
}

/// A node reference for the wire.
pub fn node_to_wire(node: NodeRef) -> wire::NodeRef {
    wire::NodeRef {
        name: node.name,
        provider_id: node.provider_id,
    }
}

/// An instance for the wire.
pub fn instance_to_wire(instance: Instance) -> wire::Instance {
    wire::Instance {
        provider_id: instance.provider_id,
        instance_type: instance.instance_type,
        zone: instance.zone,
        region: instance.region,
        addresses: addresses_to_wire(instance.addresses),
        additional_labels: instance.additional_labels,
    }
}

/// A Service reference from the wire; a missing one is empty, which the
/// checks refuse before this point.
pub fn service(service: Option<wire::ServiceRef>) -> ServiceRef {
    let service = service.unwrap_or_default();
    ServiceRef {
        namespace: service.namespace,
        name: service.name,
        uid: service.uid,
    }
}

fn service_to_wire(service: ServiceRef) -> wire::ServiceRef {
    wire::ServiceRef {
        namespace: service.namespace,
        name: service.name,
        uid: service.uid,
    }
}

fn protocol(value: i32) -> Option<Protocol> {
    match wire::Protocol::try_from(value).ok()? {
        wire::Protocol::Tcp => Some(Protocol::Tcp),
        wire::Protocol::Udp => Some(Protocol::Udp),
        wire::Protocol::Sctp => Some(Protocol::Sctp),
        wire::Protocol::Unspecified => None,
    }
}

fn protocol_to_wire(protocol: Protocol) -> wire::Protocol {
    match protocol {
        Protocol::Tcp => wire::Protocol::Tcp,
        Protocol::Udp => wire::Protocol::Udp,
        Protocol::Sctp => wire::Protocol::Sctp,
    }
}

/// A load balancer spec from the wire.
pub fn spec(spec: Option<wire::LoadBalancerSpec>) -> LoadBalancerSpec {
    let spec = spec.unwrap_or_default();
    LoadBalancerSpec {
        service: service(spec.service),
        ports: spec
            .ports
            .into_iter()
            .filter_map(|p| {
                Some(ServicePort {
                    protocol: protocol(p.protocol)?,
                    name: p.name,
                    port: p.port,
                    node_port: p.node_port,
                })
            })
            .collect(),
        load_balancer_class: spec.load_balancer_class,
        load_balancer_ip: spec.load_balancer_ip,
        source_ranges: spec.source_ranges,
        ip_families: spec
            .ip_families
            .into_iter()
            .filter_map(|f| match wire::IpFamily::try_from(f).ok()? {
                wire::IpFamily::Ipv4 => Some(IpFamily::Ipv4),
                wire::IpFamily::Ipv6 => Some(IpFamily::Ipv6),
                wire::IpFamily::Unspecified => None,
            })
            .collect(),
        external_traffic_policy: match wire::TrafficPolicy::try_from(spec.external_traffic_policy) {
            Ok(wire::TrafficPolicy::Local) => TrafficPolicy::Local,
            _ => TrafficPolicy::Cluster,
        },
        health_check_node_port: spec.health_check_node_port,
        session_affinity: match wire::SessionAffinity::try_from(spec.session_affinity) {
            Ok(wire::SessionAffinity::ClientIp) => SessionAffinity::ClientIp,
            _ => SessionAffinity::None,
        },
        annotations: spec.annotations,
    }
}

/// Load balancer hosts from the wire.
pub fn hosts(hosts: Vec<wire::Host>) -> Vec<Host> {
    hosts
        .into_iter()
        .map(|h| Host {
            name: h.name,
            provider_id: h.provider_id,
            addresses: addresses(h.addresses),
            labels: h.labels,
            zone: h.zone,
        })
        .collect()
}

/// A provider's host limits for the wire.
pub fn host_limits_to_wire(limits: ccm_provider::HostLimits) -> wire::HostLimits {
    wire::HostLimits {
        kind: limits.kind,
        annotation: limits.annotation,
        values: limits.values,
        per_load_balancer: limits.per_load_balancer,
        per_zone: limits.per_zone,
        cross_zone_annotation: limits.cross_zone_annotation,
        source: limits.source,
    }
}

/// A load balancer status for the wire.
pub fn status_to_wire(status: LoadBalancerStatus) -> wire::LoadBalancerStatus {
    wire::LoadBalancerStatus {
        ingress: status.ingress.into_iter().map(ingress_to_wire).collect(),
    }
}

fn ingress_to_wire(ingress: Ingress) -> wire::Ingress {
    wire::Ingress {
        ip: ingress.ip,
        hostname: ingress.hostname,
        ip_mode: ingress.ip_mode,
        ports: ingress.ports.into_iter().map(port_status_to_wire).collect(),
    }
}

fn port_status_to_wire(port: PortStatus) -> wire::PortStatus {
    wire::PortStatus {
        port: port.port,
        protocol: protocol_to_wire(port.protocol) as i32,
        error: port.error,
    }
}

/// A listed load balancer for the wire.
pub fn load_balancer_to_wire(lb: LoadBalancer) -> wire::LoadBalancer {
    wire::LoadBalancer {
        name: lb.name,
        service: Some(service_to_wire(lb.service)),
        status: Some(status_to_wire(lb.status)),
        hosts: lb.hosts,
    }
}

/// A route from the wire; a missing one is empty, which the checks refuse
/// before this point.
pub fn route(route: Option<wire::Route>) -> Route {
    let route = route.unwrap_or_default();
    Route {
        name: route.name,
        target_node: route.target_node,
        target_node_addresses: addresses(route.target_node_addresses),
        destination_cidr: route.destination_cidr,
        blackhole: route.blackhole,
        enable_node_addresses: route.enable_node_addresses,
        target_provider_id: route.target_provider_id,
    }
}

/// A route for the wire.
pub fn route_to_wire(route: Route) -> wire::Route {
    wire::Route {
        name: route.name,
        target_node: route.target_node,
        target_node_addresses: addresses_to_wire(route.target_node_addresses),
        destination_cidr: route.destination_cidr,
        blackhole: route.blackhole,
        enable_node_addresses: route.enable_node_addresses,
        target_provider_id: route.target_provider_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_crosses_to_plain_types_and_its_status_back() {
        let spec = spec(Some(wire::LoadBalancerSpec {
            service: Some(wire::ServiceRef {
                namespace: "ns".into(),
                name: "web".into(),
                uid: "u-1".into(),
            }),
            ports: vec![wire::ServicePort {
                name: "http".into(),
                protocol: wire::Protocol::Udp as i32,
                port: 80,
                node_port: 30080,
            }],
            ip_families: vec![
                wire::IpFamily::Unspecified as i32,
                wire::IpFamily::Ipv6 as i32,
            ],
            external_traffic_policy: wire::TrafficPolicy::Local as i32,
            session_affinity: wire::SessionAffinity::ClientIp as i32,
            ..Default::default()
        }));
        assert_eq!(spec.service.uid, "u-1");
        assert_eq!(spec.ports[0].protocol, Protocol::Udp);
        assert_eq!(spec.ip_families, vec![IpFamily::Ipv6]);
        assert_eq!(spec.external_traffic_policy, TrafficPolicy::Local);
        assert_eq!(spec.session_affinity, SessionAffinity::ClientIp);

        let status = status_to_wire(LoadBalancerStatus {
            ingress: vec![Ingress {
                ip: "203.0.113.1".into(),
                ports: vec![PortStatus {
                    port: 80,
                    protocol: Protocol::Udp,
                    error: String::new(),
                }],
                ..Default::default()
            }],
            adopted: None,
            no_effect: Vec::new(),
        });
        assert_eq!(
            status.ingress[0].ports[0].protocol,
            wire::Protocol::Udp as i32
        );
    }

    #[test]
    fn every_address_kind_round_trips() {
        let all: Vec<NodeAddress> = AddressType::ALL
            .into_iter()
            .map(|kind| NodeAddress::new(kind, "x"))
            .collect();
        assert_eq!(addresses(addresses_to_wire(all.clone())), all);
        let unspecified = wire::NodeAddress {
            r#type: 0,
            address: "x".into(),
        };
        assert!(addresses(vec![unspecified]).is_empty());
    }
}
