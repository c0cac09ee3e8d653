//! The route controller's decisions, pure: from the cluster's nodes and
//! the cloud's routes to the routes to create and delete, and from the
//! outcome to each node's `NetworkUnavailable` condition.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ccm_proto::v1::{NodeAddressType, Route};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;

/// What the route controller keeps of a node (its cache holds only this)
/// and the planner reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub uid: String,
    /// `spec.providerID`; empty until the node is initialised.
    pub provider_id: String,
    /// `spec.podCIDRs`, one route each.
    pub pod_cidrs: Vec<String>,
    /// `(type, address)` pairs of `status.addresses`.
    pub addresses: Vec<(String, String)>,
    /// The `NetworkUnavailable` condition's status and reason, if any.
    pub network: Option<(String, String)>,
}

impl NodeInfo {
    /// What routing needs of `node`.
    pub fn of(node: &Node) -> Self {
        let spec = node.spec.as_ref();
        let mut pod_cidrs = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
        if pod_cidrs.is_empty() {
            pod_cidrs.extend(spec.and_then(|s| s.pod_cidr.clone()));
        }
        Self {
            name: node.name_any(),
            uid: node.metadata.uid.clone().unwrap_or_default(),
            provider_id: spec.and_then(|s| s.provider_id.clone()).unwrap_or_default(),
            pod_cidrs,
            addresses: node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .map(|a| {
                    a.iter()
                        .map(|a| (a.type_.clone(), a.address.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            network: node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "NetworkUnavailable"))
                .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default())),
        }
    }

    /// What of a node makes its routes change.
    pub fn routing(&self) -> (&[String], &[(String, String)], &str) {
        (&self.pod_cidrs, &self.addresses, &self.provider_id)
    }

    /// A reference to the Node, for its events.
    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        ccm_runtime::view::node_reference(&self.name, &self.uid)
    }
}

/// A route to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Create {
    pub node: String,
    /// The name hint: the node's UID.
    pub uid: String,
    /// The node's provider ID, by which the cloud finds its instance.
    pub provider_id: String,
    pub cidr: String,
    pub addresses: Vec<(String, String)>,
}

/// What to do, for the whole cluster at once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Routes to delete first.
    pub delete: Vec<Route>,
    /// Routes to create after the deletes.
    pub create: Vec<Create>,
    /// Nodes whose `NetworkUnavailable` condition the outcome decides:
    /// every node with pod CIDRs or routes, with its number of CIDRs.
    pub nodes: BTreeMap<String, usize>,
}

/// Whether `route` is this cluster's to delete: its destination parses and
/// its first or last address lies in a cluster CIDR. Anything else is
/// never touched.
pub fn is_responsible(route: &Route, cluster_cidrs: &[IpNet]) -> bool {
    let Ok(net) = route.destination_cidr.parse::<IpNet>() else {
        return false;
    };
    let ends = [net.network(), net.broadcast()];
    cluster_cidrs
        .iter()
        .any(|c| ends.iter().any(|ip: &IpAddr| c.contains(ip)))
}

fn same_addresses(route: &Route, node: &NodeInfo) -> bool {
    let have: BTreeSet<(String, String)> = route
        .target_node_addresses
        .iter()
        .map(|a| {
            (
                NodeAddressType::kubernetes_name_of(a.r#type).to_owned(),
                a.address.clone(),
            )
        })
        .collect();
    let want: BTreeSet<(String, String)> = node.addresses.iter().cloned().collect();
    have == want
}

/// Plans routes. One route per pod CIDR (two for dual-stack), named after
/// the node's UID. A route is deleted when it is this cluster's
/// ([`is_responsible`]) and either a blackhole or not wanted by any node;
/// a blackhole or an outdated address route that is still wanted is
/// replaced (deleted, then created).
pub fn plan<N: std::borrow::Borrow<NodeInfo>>(
    nodes: &[N],
    routes: &[Route],
    cluster_cidrs: &[IpNet],
) -> Plan {
    let nodes = nodes.iter().map(N::borrow);
    let mut out = Plan::default();
    // A route names its node by provider ID where the cloud knows it: node
    // names need not be the names the cloud gives its instances.
    let by_provider_id: HashMap<&str, &str> = nodes
        .clone()
        .filter(|n| !n.provider_id.is_empty())
        .map(|n| (n.provider_id.as_str(), n.name.as_str()))
        .collect();
    let target = |route: &Route| -> String {
        by_provider_id
            .get(route.target_provider_id.as_str())
            .map_or_else(|| route.target_node.clone(), |name| (*name).to_owned())
    };
    let mut by_node: BTreeMap<String, Vec<&Route>> = BTreeMap::new();
    for route in routes {
        let node = target(route);
        if !node.is_empty() {
            by_node.entry(node).or_default().push(route);
        }
    }
    // (node, cidr) pairs whose existing route stays.
    let mut kept: BTreeSet<(&str, &str)> = BTreeSet::new();
    for node in nodes {
        let existing = by_node.get(&node.name).cloned().unwrap_or_default();
        if node.pod_cidrs.is_empty() && existing.is_empty() {
            continue;
        }
        out.nodes.insert(node.name.clone(), node.pod_cidrs.len());
        for cidr in &node.pod_cidrs {
            let current = existing.iter().find(|r| r.destination_cidr == *cidr);
            let keep = current.is_some_and(|r| {
                !r.blackhole && (!r.enable_node_addresses || same_addresses(r, node))
            });
            if keep {
                kept.insert((&node.name, cidr));
            } else {
                out.create.push(Create {
                    node: node.name.clone(),
                    uid: node.uid.clone(),
                    provider_id: node.provider_id.clone(),
                    cidr: cidr.clone(),
                    addresses: node.addresses.clone(),
                });
            }
        }
    }
    out.delete = routes
        .iter()
        .filter(|r| is_responsible(r, cluster_cidrs))
        .filter(|r| {
            r.blackhole || !kept.contains(&(target(r).as_str(), r.destination_cidr.as_str()))
        })
        .cloned()
        .collect();
    out
}

/// The `NetworkUnavailable` condition a node gets: `(status, reason,
/// message)`. A node with routes but no CIDRs, or with a create that
/// failed, is unavailable.
pub fn condition(
    cidrs: usize,
    failed_creates: usize,
) -> (&'static str, &'static str, &'static str) {
    if cidrs == 0 || failed_creates > 0 {
        (
            "True",
            "NoRouteCreated",
            "RouteController failed to create a route",
        )
    } else {
        ("False", "RouteCreated", "RouteController created a route")
    }
}

/// Whether the node's current condition differs from the wanted one in
/// status or reason (only then is it written).
pub fn condition_changed(current: Option<(&str, &str)>, wanted: (&str, &str)) -> bool {
    current != Some(wanted)
}

/// Parses `--cluster-cidr`: one CIDR, or two of different families.
pub fn parse_cluster_cidrs(value: &str) -> Result<Vec<IpNet>, String> {
    let nets = value
        .split(',')
        .map(str::trim)
        .map(|s| {
            if s.is_empty() {
                Err("is required: the pod network's CIDR, e.g. 10.244.0.0/16".to_owned())
            } else {
                s.parse::<IpNet>()
                    .map_err(|_| format!("{s:?} is not a CIDR"))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    match nets.as_slice() {
        [_] => Ok(nets),
        [a, b] if matches!(a, IpNet::V4(_)) != matches!(b, IpNet::V4(_)) => Ok(nets),
        [_, _] => Err("two CIDRs must be one IPv4 and one IPv6 (dual-stack)".into()),
        _ => Err("at most two CIDRs (one IPv4 and one IPv6)".into()),
    }
}

#[cfg(test)]
mod tests {
    use ccm_proto::v1::NodeAddress;

    use super::*;

    fn node(name: &str, cidrs: &[&str]) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            uid: format!("uid-{name}"),
            provider_id: String::new(),
            pod_cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            addresses: vec![("InternalIP".into(), format!("10.0.0.{}", name.len()))],
            network: None,
        }
    }

    fn route(node: &str, cidr: &str) -> Route {
        Route {
            name: format!("r-{node}-{cidr}"),
            target_node: node.into(),
            destination_cidr: cidr.into(),
            ..Default::default()
        }
    }

    fn cluster() -> Vec<IpNet> {
        parse_cluster_cidrs("10.244.0.0/16,fd00:10::/56").unwrap()
    }

    fn cidrs(creates: &[Create]) -> Vec<(&str, &str)> {
        creates
            .iter()
            .map(|c| (c.node.as_str(), c.cidr.as_str()))
            .collect()
    }

    #[test]
    fn a_node_without_a_route_gets_one_named_after_its_uid() {
        let p = plan(&[node("a", &["10.244.1.0/24"])], &[], &cluster());
        assert_eq!(cidrs(&p.create), [("a", "10.244.1.0/24")]);
        assert_eq!(p.create[0].uid, "uid-a");
        assert!(p.delete.is_empty());
        assert_eq!(p.nodes.get("a"), Some(&1));
    }

    #[test]
    fn dual_stack_nodes_get_two_routes() {
        let p = plan(
            &[node("a", &["10.244.1.0/24", "fd00:10::100/120"])],
            &[],
            &cluster(),
        );
        assert_eq!(p.create.len(), 2);
    }

    #[test]
    fn existing_routes_are_kept() {
        let p = plan(
            &[node("a", &["10.244.1.0/24"])],
            &[route("a", "10.244.1.0/24")],
            &cluster(),
        );
        assert_eq!(
            p,
            Plan {
                nodes: [("a".into(), 1)].into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn routes_match_nodes_by_provider_id_where_the_cloud_names_instances_otherwise() {
        let mut n = node("web-1", &["10.244.1.0/24"]);
        n.provider_id = "aws:///z/i-1".into();
        let listed = Route {
            target_provider_id: "aws:///z/i-1".into(),
            ..route("ip-10-0-1-5.ec2.internal", "10.244.1.0/24")
        };
        let p = plan(
            std::slice::from_ref(&n),
            std::slice::from_ref(&listed),
            &cluster(),
        );
        assert!(p.delete.is_empty() && p.create.is_empty(), "{p:?}");
        // Without the node, the same route is unwanted.
        let p = plan::<NodeInfo>(&[], &[listed], &cluster());
        assert_eq!(p.delete.len(), 1);
        // A create carries the provider ID.
        let p = plan(&[n], &[], &cluster());
        assert_eq!(p.create[0].provider_id, "aws:///z/i-1");
    }

    #[test]
    fn only_this_clusters_unwanted_routes_are_deleted() {
        let routes = [
            route("gone", "10.244.9.0/24"),
            route("gone", "192.168.0.0/24"),
            route("", "10.244.8.0/24"),
            Route {
                destination_cidr: "garbage".into(),
                ..route("gone", "")
            },
            // Contains the cluster range, but both ends lie outside it.
            route("gone", "10.0.0.0/8"),
            // The cluster range itself is the cluster's.
            route("gone", "10.244.0.0/16"),
        ];
        let p = plan::<NodeInfo>(&[], &routes, &cluster());
        let deleted: Vec<_> = p
            .delete
            .iter()
            .map(|r| r.destination_cidr.as_str())
            .collect();
        assert_eq!(deleted, ["10.244.9.0/24", "10.244.8.0/24", "10.244.0.0/16"]);
    }

    #[test]
    fn a_changed_pod_cidr_replaces_the_route() {
        let p = plan(
            &[node("a", &["10.244.2.0/24"])],
            &[route("a", "10.244.1.0/24")],
            &cluster(),
        );
        assert_eq!(cidrs(&p.create), [("a", "10.244.2.0/24")]);
        assert_eq!(p.delete, [route("a", "10.244.1.0/24")]);
    }

    #[test]
    fn blackholes_in_range_are_deleted_and_replaced_when_still_wanted() {
        let hole = Route {
            blackhole: true,
            ..route("a", "10.244.1.0/24")
        };
        let p = plan(
            &[node("a", &["10.244.1.0/24"])],
            std::slice::from_ref(&hole),
            &cluster(),
        );
        assert_eq!(p.delete, [hole]);
        assert_eq!(cidrs(&p.create), [("a", "10.244.1.0/24")]);
    }

    #[test]
    fn address_routes_are_replaced_when_the_addresses_change() {
        let n = node("a", &["10.244.1.0/24"]);
        let stale = Route {
            enable_node_addresses: true,
            target_node_addresses: vec![NodeAddress {
                r#type: NodeAddressType::InternalIp as i32,
                address: "10.9.9.9".into(),
            }],
            ..route("a", "10.244.1.0/24")
        };
        let p = plan(
            std::slice::from_ref(&n),
            std::slice::from_ref(&stale),
            &cluster(),
        );
        assert_eq!((p.delete.len(), p.create.len()), (1, 1));
        let current = Route {
            target_node_addresses: vec![NodeAddress {
                r#type: NodeAddressType::InternalIp as i32,
                address: "10.0.0.1".into(),
            }],
            ..stale
        };
        let p = plan(&[n], &[current], &cluster());
        assert!(p.delete.is_empty() && p.create.is_empty());
    }

    #[test]
    fn a_node_with_routes_but_no_cidrs_is_unavailable() {
        let p = plan(
            &[node("a", &[])],
            &[route("a", "10.244.1.0/24")],
            &cluster(),
        );
        assert_eq!(p.nodes.get("a"), Some(&0));
        assert_eq!(condition(0, 0).0, "True");
        assert_eq!(p.delete.len(), 1);
        let untouched = plan(&[node("b", &[])], &[], &cluster());
        assert!(
            untouched.nodes.is_empty(),
            "no CIDRs and no routes: not touched"
        );
    }

    #[test]
    fn conditions_follow_the_outcome_and_are_written_only_on_change() {
        assert_eq!(
            condition(1, 0),
            ("False", "RouteCreated", "RouteController created a route")
        );
        assert_eq!(condition(2, 1).1, "NoRouteCreated");
        assert!(!condition_changed(
            Some(("False", "RouteCreated")),
            ("False", "RouteCreated")
        ));
        assert!(condition_changed(
            Some(("False", "CalicoIsUp")),
            ("False", "RouteCreated")
        ));
        assert!(condition_changed(None, ("False", "RouteCreated")));
    }

    #[test]
    fn cluster_cidrs_are_one_or_a_dual_stack_pair() {
        assert!(parse_cluster_cidrs("10.244.0.0/16").is_ok());
        assert!(parse_cluster_cidrs(" 10.244.0.0/16 , fd00::/56").is_ok());
        for bad in [
            "",
            "10.0.0.0/8,10.1.0.0/16",
            "x",
            "10.0.0.0/8,fd00::/56,fd01::/56",
        ] {
            assert!(parse_cluster_cidrs(bad).is_err(), "{bad}");
        }
    }
}
