//! Routes: one VPC route per pod CIDR (IPv4 or IPv6) to the node's
//! instance, in every route table tagged for the cluster, or in those named
//! by `--aws-route-table-ids`, tagged or not (as upstream's
//! `RouteTableIDs`). No other route table is changed.
//!
//! Several tables act as one: a route is listed as healthy only when every
//! table sends its CIDR to the same live instance; anything else (missing
//! somewhere, a blackhole, a gone instance, tables that disagree) is listed
//! as a blackhole, which the route controller replaces or deletes, and
//! create and delete bring every table in line. Routes to anything but an
//! instance (the local route, gateways, NAT) are never listed, replaced or
//! deleted, unless they are blackholes, as upstream lists them.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use aws_sdk_ec2::types::{
    AttributeBooleanValue, Filter, Instance as Ec2Instance, Route as Ec2Route, RouteState,
    RouteTable,
};
use ccm_provider::{CloudError, Result, Route, Routes};
use ipnet::IpNet;

use super::instances::{Key, is_alive, is_instance_id, parse_provider_id, provider_id};
use super::{AwsCloud, errors, tags};

/// A route's destination: an IPv4 or IPv6 CIDR, canonical.
fn destination(route: &Ec2Route) -> Option<IpNet> {
    route
        .destination_cidr_block()
        .or(route.destination_ipv6_cidr_block())
        .and_then(|c| c.parse::<IpNet>().ok())
        .map(|n| n.trunc())
}

/// The name a route is listed under; routes have no names in AWS.
fn route_name(cluster: &str, cidr: &IpNet) -> String {
    format!("{cluster}-{cidr}")
}

/// What one table says about one destination.
#[derive(Clone, Debug, PartialEq)]
enum Entry {
    /// Sends it to an instance.
    Instance { id: String, active: bool },
    /// Sends it somewhere else (a gateway, an interface, the VPC).
    Other { active: bool },
}

impl Entry {
    fn of(route: &Ec2Route) -> Self {
        let active = route.state() != Some(&RouteState::Blackhole);
        match route.instance_id() {
            Some(id) if !id.is_empty() => Entry::Instance {
                id: id.to_owned(),
                active,
            },
            _ => Entry::Other { active },
        }
    }
}

/// How the cluster's tables route one destination, one entry per table
/// (`None` where a table has no route for it).
type Destinations = BTreeMap<IpNet, Vec<Option<Entry>>>;

fn destinations(tables: &[RouteTable]) -> Destinations {
    let mut out: Destinations = BTreeMap::new();
    for (i, table) in tables.iter().enumerate() {
        for route in table.routes() {
            let Some(cidr) = destination(route) else {
                continue;
            };
            out.entry(cidr).or_insert_with(|| vec![None; tables.len()])[i] = Some(Entry::of(route));
        }
    }
    out
}

/// What the route tables hold for a destination, as one route: `None`
/// when it is not ours to list (a route to a gateway or the VPC).
fn listed(
    cluster: &str,
    cidr: &IpNet,
    entries: &[Option<Entry>],
    instances: &HashMap<String, Ec2Instance>,
) -> Option<Route> {
    let mut target = None;
    let mut healthy = true;
    let mut ours = false;
    for entry in entries {
        match entry {
            Some(Entry::Instance { id, active }) => {
                ours = true;
                let alive = instances.get(id).is_some_and(is_alive);
                if !active || !alive || target.as_ref().is_some_and(|t| t != id) {
                    healthy = false;
                }
                target.get_or_insert_with(|| id.clone());
            }
            Some(Entry::Other { active: false }) => {
                ours = true;
                healthy = false;
            }
            Some(Entry::Other { active: true }) => return None,
            None => healthy = false,
        }
    }
    if !ours {
        return None;
    }
    let instance = target.as_ref().and_then(|id| instances.get(id));
    Some(Route {
        name: route_name(cluster, cidr),
        target_node: instance
            .and_then(|i| i.private_dns_name())
            .unwrap_or_default()
            .to_owned(),
        target_provider_id: instance
            .map(|i| {
                provider_id(
                    i.placement()
                        .and_then(|p| p.availability_zone())
                        .unwrap_or_default(),
                    i.instance_id().unwrap_or_default(),
                )
            })
            .unwrap_or_default(),
        destination_cidr: cidr.to_string(),
        blackhole: !healthy,
        ..Default::default()
    })
}

fn parse_cidr(field: &str, cidr: &str) -> Result<IpNet> {
    cidr.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| CloudError::invalid(field, format!("{cidr:?} is not a CIDR")))
}

impl AwsCloud {
    /// The route tables of `cluster`: those the gateway's settings name,
    /// tagged or not (upstream's `RouteTableID`: the operator chose them),
    /// else those tagged for it (in its VPC when one is set); tables with
    /// only the legacy tag are looked for when none has the cluster tag.
    async fn route_tables(&self, cluster: &str) -> Result<Vec<RouteTable>> {
        let mut scope = Vec::new();
        let mut vpc = String::new();
        if let Some(id) = &self.settings.vpc_id {
            scope.push(tags::filter("vpc-id", [id.as_str()]));
            vpc = format!(" in {id}");
        }
        let named = &self.settings.route_table_ids;
        if !named.is_empty() {
            scope.push(tags::filter(
                "route-table-id",
                named.iter().map(String::as_str),
            ));
            let tables = self.route_tables_where(None, scope).await?;
            let missing: Vec<&String> = named
                .iter()
                .filter(|id| {
                    !tables
                        .iter()
                        .any(|t| t.route_table_id() == Some(id.as_str()))
                })
                .collect();
            if !missing.is_empty() {
                return Err(CloudError::NotConfigured(format!(
                    "the route tables {missing:?} named by --aws-route-table-ids do not exist{vpc}"
                )));
            }
            return Ok(tables);
        }
        let tagged = |filter: Filter| {
            let mut filters = scope.clone();
            filters.push(filter);
            filters
        };
        let mut tables = self
            .route_tables_where(
                Some(cluster),
                tagged(tags::filter("tag-key", [tags::cluster_key(cluster)])),
            )
            .await?;
        if tables.is_empty() {
            let legacy = format!("tag:{}", tags::LEGACY_CLUSTER_TAG);
            tables = self
                .route_tables_where(Some(cluster), tagged(tags::filter(&legacy, [cluster])))
                .await?;
        }
        if tables.is_empty() {
            return Err(CloudError::NotConfigured(format!(
                "no route table{vpc} carries the tag {}=owned or shared (or the legacy {}={cluster}); tag the cluster's, or name them with --aws-route-table-ids",
                tags::cluster_key(cluster),
                tags::LEGACY_CLUSTER_TAG
            )));
        }
        Ok(tables)
    }

    /// Every route table `filters` find (that is `cluster`'s, when given),
    /// page by page.
    pub(crate) async fn route_tables_where(
        &self,
        cluster: Option<&str>,
        filters: Vec<Filter>,
    ) -> Result<Vec<RouteTable>> {
        let filters = &filters;
        super::every_page(|token| async move {
            let page = self
                .ec2
                .describe_route_tables()
                .set_filters(Some(filters.clone()))
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeRouteTables", e))?;
            let tables = page
                .route_tables()
                .iter()
                .filter(|t| cluster.is_none_or(|c| tags::belongs_to(t.tags(), c)))
                .cloned()
                .collect();
            Ok((tables, page.next_token().map(str::to_owned)))
        })
        .await
    }

    /// The instance a route is to go to: by provider ID when given, else by
    /// the node's name. `NotFound` when EC2 has no live instance for it.
    async fn route_target(&self, route: &Route) -> Result<Ec2Instance> {
        let key = if route.target_provider_id.is_empty() {
            Key::of_name(&route.target_node)
        } else {
            Key::Id(
                parse_provider_id(&route.target_provider_id)
                    .map_err(|e| CloudError::invalid("route.target_provider_id", e))?,
            )
        };
        let found = self.find(std::slice::from_ref(&key)).await?;
        found
            .get(&key)
            .filter(|i| is_alive(i))
            .cloned()
            .ok_or_else(|| {
                CloudError::NotFound(format!("instance of node {:?}", route.target_node))
            })
    }
}

#[async_trait]
impl Routes for AwsCloud {
    async fn list(&self, cluster: &str) -> Result<Vec<Route>> {
        let tables = self.route_tables(cluster).await?;
        let destinations = destinations(&tables);
        let ids: Vec<Key> = destinations
            .values()
            .flatten()
            .filter_map(|e| match e {
                Some(Entry::Instance { id, .. }) if is_instance_id(id) => Some(id.clone()),
                _ => None,
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(Key::Id)
            .collect();
        let instances: HashMap<String, Ec2Instance> = if ids.is_empty() {
            HashMap::new()
        } else {
            let found = self.find(&ids).await?;
            ids.iter()
                .filter_map(|k| {
                    let Key::Id(id) = k else { return None };
                    Some((id.clone(), found.get(k)?.clone()))
                })
                .collect()
        };
        Ok(destinations
            .iter()
            .filter_map(|(cidr, entries)| listed(cluster, cidr, entries, &instances))
            .collect())
    }

    async fn create(&self, cluster: &str, _name_hint: &str, route: &Route) -> Result<Route> {
        let cidr = parse_cidr("route.destination_cidr", &route.destination_cidr)?;
        let instance = self.route_target(route).await?;
        let instance_id = instance.instance_id().unwrap_or_default().to_owned();
        let tables = self.route_tables(cluster).await?;
        // Check every table before changing any: a CIDR another target
        // holds is a conflict, and nothing is written.
        let mut plan = Vec::new();
        for table in &tables {
            let table_id = table.route_table_id().unwrap_or_default();
            let entry = table
                .routes()
                .iter()
                .find(|r| destination(r) == Some(cidr))
                .map(Entry::of);
            match entry {
                None => plan.push((table_id, false)),
                Some(Entry::Instance { id, active: true }) if id == instance_id => {}
                Some(Entry::Instance { active: false, .. } | Entry::Other { active: false }) => {
                    plan.push((table_id, true))
                }
                Some(Entry::Instance { id, active: true }) => {
                    // A route to an instance that is gone is replaced; to a
                    // live one, it is another node's.
                    let holder = Key::Id(id.clone());
                    let found = self.find(std::slice::from_ref(&holder)).await?;
                    if found.get(&holder).is_some_and(is_alive) {
                        return Err(CloudError::Conflict(format!(
                            "route table {table_id} already sends {cidr} to {id}"
                        )));
                    }
                    plan.push((table_id, true));
                }
                Some(Entry::Other { active: true }) => {
                    return Err(CloudError::Conflict(format!(
                        "route table {table_id} already sends {cidr} elsewhere than an instance"
                    )));
                }
            }
        }
        // Routed pod traffic carries addresses that are not the
        // instance's own: EC2 drops it unless the check is off.
        if instance.source_dest_check() != Some(false) {
            self.ec2
                .modify_instance_attribute()
                .instance_id(&instance_id)
                .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                .send()
                .await
                .map_err(|e| errors::cloud_error("ModifyInstanceAttribute", e))?;
        }
        for (table_id, replace) in plan {
            let (v4, v6) = match cidr {
                IpNet::V4(_) => (Some(cidr.to_string()), None),
                IpNet::V6(_) => (None, Some(cidr.to_string())),
            };
            if replace {
                self.ec2
                    .replace_route()
                    .route_table_id(table_id)
                    .set_destination_cidr_block(v4)
                    .set_destination_ipv6_cidr_block(v6)
                    .instance_id(&instance_id)
                    .send()
                    .await
                    .map_err(|e| errors::cloud_error("ReplaceRoute", e))?;
            } else {
                match self
                    .ec2
                    .create_route()
                    .route_table_id(table_id)
                    .set_destination_cidr_block(v4)
                    .set_destination_ipv6_cidr_block(v6)
                    .instance_id(&instance_id)
                    .send()
                    .await
                {
                    Ok(_) => {}
                    // Created by a call that raced this one: the next list
                    // shows whether it is ours.
                    Err(e) if errors::code(&e) == Some("RouteAlreadyExists") => {
                        return Err(CloudError::Conflict(format!(
                            "route table {table_id} got a route for {cidr} meanwhile"
                        )));
                    }
                    Err(e) => return Err(errors::cloud_error("CreateRoute", e)),
                }
            }
        }
        Ok(Route {
            name: route_name(cluster, &cidr),
            target_node: route.target_node.clone(),
            target_node_addresses: route.target_node_addresses.clone(),
            destination_cidr: cidr.to_string(),
            target_provider_id: provider_id(
                instance
                    .placement()
                    .and_then(|p| p.availability_zone())
                    .unwrap_or_default(),
                &instance_id,
            ),
            blackhole: false,
            enable_node_addresses: false,
        })
    }

    async fn delete(&self, cluster: &str, route: &Route) -> Result<()> {
        let cidr = if route.destination_cidr.is_empty() {
            let from_name = route
                .name
                .strip_prefix(cluster)
                .and_then(|s| s.strip_prefix('-'))
                .unwrap_or_default();
            parse_cidr("route.name", from_name)?
        } else {
            parse_cidr("route.destination_cidr", &route.destination_cidr)?
        };
        let tables = self.route_tables(cluster).await?;
        for table in &tables {
            let Some(entry) = table
                .routes()
                .iter()
                .find(|r| destination(r) == Some(cidr))
                .map(Entry::of)
            else {
                continue;
            };
            // Only routes to instances, and blackholes, are ours to delete.
            if matches!(entry, Entry::Other { active: true }) {
                continue;
            }
            let table_id = table.route_table_id().unwrap_or_default();
            let request = self.ec2.delete_route().route_table_id(table_id);
            let request = match cidr {
                IpNet::V4(_) => request.destination_cidr_block(cidr.to_string()),
                IpNet::V6(_) => request.destination_ipv6_cidr_block(cidr.to_string()),
            };
            match request.send().await {
                Ok(_) => {}
                Err(e) if errors::code(&e) == Some("InvalidRoute.NotFound") => {}
                Err(e) => return Err(errors::cloud_error("DeleteRoute", e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, alive: bool) -> (String, Ec2Instance) {
        use aws_sdk_ec2::types::{InstanceState, InstanceStateName, Placement};
        let state = if alive {
            InstanceStateName::Running
        } else {
            InstanceStateName::Terminated
        };
        (
            id.to_owned(),
            Ec2Instance::builder()
                .instance_id(id)
                .private_dns_name(format!("ip-{id}.ec2.internal"))
                .placement(Placement::builder().availability_zone("us-east-1a").build())
                .state(InstanceState::builder().name(state).build())
                .build(),
        )
    }

    fn to(id: &str, active: bool) -> Option<Entry> {
        Some(Entry::Instance {
            id: id.into(),
            active,
        })
    }

    #[test]
    fn a_route_is_healthy_only_when_every_table_agrees_on_a_live_instance() {
        let cidr: IpNet = "10.244.1.0/24".parse().unwrap();
        let instances: HashMap<_, _> = [instance("i-1", true), instance("i-2", true)].into();
        let healthy = listed("c", &cidr, &[to("i-1", true), to("i-1", true)], &instances).unwrap();
        assert!(!healthy.blackhole);
        assert_eq!(healthy.target_node, "ip-i-1.ec2.internal");
        assert_eq!(healthy.target_provider_id, "aws:///us-east-1a/i-1");
        assert_eq!(healthy.name, "c-10.244.1.0/24");
        for entries in [
            vec![to("i-1", true), None],
            vec![to("i-1", true), to("i-2", true)],
            vec![to("i-1", false), to("i-1", true)],
            vec![to("i-9", true)],
            vec![Some(Entry::Other { active: false })],
        ] {
            let route = listed("c", &cidr, &entries, &instances).unwrap();
            assert!(route.blackhole, "{entries:?}");
        }
    }

    #[test]
    fn routes_to_gateways_are_not_listed() {
        let cidr: IpNet = "0.0.0.0/0".parse().unwrap();
        let none = HashMap::new();
        assert_eq!(
            listed("c", &cidr, &[Some(Entry::Other { active: true })], &none),
            None
        );
        assert_eq!(listed("c", &cidr, &[None], &none), None);
    }

    #[test]
    fn terminated_instances_make_blackholes() {
        let cidr: IpNet = "10.244.1.0/24".parse().unwrap();
        let instances: HashMap<_, _> = [instance("i-1", false)].into();
        let route = listed("c", &cidr, &[to("i-1", true)], &instances).unwrap();
        assert!(route.blackhole);
    }
}
