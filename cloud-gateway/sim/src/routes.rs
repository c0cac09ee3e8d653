//! The sim's routes, keyed by (cluster, destination CIDR); a route whose
//! target instance is gone is listed as a blackhole, as a real cloud lists
//! it.

use async_trait::async_trait;
use ccm_provider::{CloudError, Operation, Result, Route, Routes};
use ipnet::IpNet;

use super::store::RouteRecord;
use super::{PROVIDER_ID_PREFIX, SimCloud, address_from_record, address_type_name};

fn route_name(cluster: &str, name_hint: &str, cidr: &IpNet) -> String {
    let cidr: String = cidr
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("{cluster}-{name_hint}-{cidr}")
}

fn canonical_cidr(cidr: &str) -> Result<IpNet> {
    cidr.parse::<IpNet>().map(|n| n.trunc()).map_err(|_| {
        CloudError::invalid("route.destination_cidr", format!("{cidr:?} is not a CIDR"))
    })
}

#[async_trait]
impl Routes for SimCloud {
    async fn list(&self, cluster: &str) -> Result<Vec<Route>> {
        let _call = self.enter(Operation::ListRoutes).await?;
        let state = self.state();
        state
            .routes
            .values()
            .filter(|r| r.cluster == cluster)
            .map(|r| {
                let target = state.store.instance_id(&r.target_node)?;
                Ok(Route {
                    name: r.name.clone(),
                    target_node: r.target_node.clone(),
                    target_node_addresses: r
                        .target_addresses
                        .iter()
                        .filter_map(address_from_record)
                        .collect(),
                    destination_cidr: r.destination_cidr.clone(),
                    // A route whose target instance is gone goes nowhere, as
                    // a real cloud reports it.
                    blackhole: target.is_none(),
                    enable_node_addresses: false,
                    target_provider_id: target
                        .map(|id| format!("{PROVIDER_ID_PREFIX}{id}"))
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn create(&self, cluster: &str, name_hint: &str, route: &Route) -> Result<Route> {
        let _call = self.enter(Operation::CreateRoute).await?;
        let cidr = canonical_cidr(&route.destination_cidr)?;
        let destination = cidr.to_string();
        let mut state = self.state();
        if let Some(existing) = state
            .routes
            .values()
            .find(|r| r.cluster == cluster && r.destination_cidr == destination)
        {
            if existing.target_node != route.target_node {
                return Err(CloudError::Conflict(format!(
                    "route {} already sends {destination} to node {}",
                    existing.name, existing.target_node
                )));
            }
            let mut out = route.clone();
            out.name = existing.name.clone();
            out.destination_cidr = destination;
            out.blackhole = false;
            return Ok(out);
        }
        let hint = if name_hint.is_empty() {
            &route.target_node
        } else {
            name_hint
        };
        let record = RouteRecord {
            cluster: cluster.to_owned(),
            name: route_name(cluster, hint, &cidr),
            target_node: route.target_node.clone(),
            destination_cidr: destination,
            target_addresses: route
                .target_node_addresses
                .iter()
                .map(|a| (address_type_name(a.kind), a.address.clone()))
                .collect(),
        };
        state.store.put_route(&record)?;
        state
            .routes
            .insert((cluster.to_owned(), record.name.clone()), record.clone());
        let target_provider_id = state
            .store
            .instance_id(&record.target_node)?
            .map(|id| format!("{PROVIDER_ID_PREFIX}{id}"))
            .unwrap_or_default();
        Ok(Route {
            name: record.name,
            target_node: record.target_node,
            target_node_addresses: route.target_node_addresses.clone(),
            destination_cidr: record.destination_cidr,
            blackhole: false,
            enable_node_addresses: false,
            target_provider_id,
        })
    }

    async fn delete(&self, cluster: &str, route: &Route) -> Result<()> {
        let _call = self.enter(Operation::DeleteRoute).await?;
        let mut state = self.state();
        let name = if route.name.is_empty() {
            let destination = canonical_cidr(&route.destination_cidr)?.to_string();
            state
                .routes
                .values()
                .find(|r| r.cluster == cluster && r.destination_cidr == destination)
                .map(|r| r.name.clone())
        } else {
            Some(route.name.clone())
        };
        if let Some(name) = name {
            let key = (cluster.to_owned(), name);
            if state.routes.contains_key(&key) {
                state.store.delete_route(&key.0, &key.1)?;
                state.routes.remove(&key);
            }
        }
        Ok(())
    }
}
