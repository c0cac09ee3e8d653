//! The sim's load balancers: addresses from the configured pools, never
//! handed out twice, provisioning that takes the configured delay, and the
//! sim's strict annotations.

use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use ccm_provider::{
    CloudError, Host, HostLimits, Ingress, IpFamily, LoadBalancer, LoadBalancerSpec,
    LoadBalancerStatus, LoadBalancers, Operation, Protocol, Result, ServiceRef,
    load_balancer_names,
};
use ipnet::IpNet;

use super::store::LoadBalancerRecord;
use super::{COUNTER_POOL_CURSOR, SimCloud, State, annotations, now_ms, pool};

impl LoadBalancerRecord {
    fn status(&self, now_ms: u64) -> LoadBalancerStatus {
        if now_ms < self.ready_at_ms {
            return LoadBalancerStatus::default();
        }
        LoadBalancerStatus {
            ingress: self
                .addresses
                .iter()
                .map(|ip| Ingress {
                    ip: ip.to_string(),
                    ip_mode: "VIP".into(),
                    ..Default::default()
                })
                .collect(),
            adopted: None,
            no_effect: Vec::new(),
        }
    }

    fn service(&self) -> ServiceRef {
        ServiceRef {
            namespace: self.service_namespace.clone(),
            name: self.service_name.clone(),
            uid: self.service_uid.clone(),
        }
    }
}

/// Where a Service's load balancer is in `state`: its own under either of
/// its names (`Ok`, with the key and record), or the name a new one gets:
/// the first not held by another Service's. `Err(Conflict)` naming the
/// holders when both are held.
fn place_of(
    state: &State,
    cluster: &str,
    service: &ServiceRef,
) -> Result<(Key, Option<LoadBalancerRecord>)> {
    let mut free = None;
    let mut held = Vec::new();
    for name in load_balancer_names(&service.uid) {
        let key = (cluster.to_owned(), name);
        match state.load_balancers.get(&key) {
            Some(lb) if lb.service_uid == service.uid => return Ok((key, Some(lb.clone()))),
            Some(lb) => held.push(format!(
                "{} (Service {}/{}, UID {})",
                key.1, lb.service_namespace, lb.service_name, lb.service_uid
            )),
            None => {
                free.get_or_insert(key);
            }
        }
    }
    free.map(|key| (key, None)).ok_or_else(|| {
        CloudError::Conflict(format!(
            "every name this Service's load balancer may have is held by another Service's: {}; those are left untouched",
            held.join(", ")
        ))
    })
}

/// The key and record of `service`'s own load balancer, if any.
fn own(state: &State, cluster: &str, service: &ServiceRef) -> Option<(Key, LoadBalancerRecord)> {
    match place_of(state, cluster, service) {
        Ok((key, Some(lb))) => Some((key, lb)),
        _ => None,
    }
}

/// A load balancer's key in the sim's state: cluster and name.
type Key = (String, String);

impl SimCloud {
    /// Picks one address per requested family for a load balancer, honouring
    /// a requested address. `keep` are addresses the load balancer holds.
    fn allocate(
        &self,
        state: &State,
        spec: &LoadBalancerSpec,
        internal: bool,
        keep: &[IpAddr],
    ) -> Result<(Vec<IpAddr>, u64)> {
        let pools = if internal {
            &self.config.internal_lb_pool
        } else {
            &self.config.lb_pool
        };
        let mut families = spec.ip_families.clone();
        if families.is_empty() {
            families.push(IpFamily::Ipv4);
        }
        let requested: Option<IpAddr> = spec.load_balancer_ip.parse().ok();
        let mut cursor = state
            .counters
            .get(COUNTER_POOL_CURSOR)
            .copied()
            .unwrap_or(0);
        let mut out = Vec::new();
        for family in families {
            let v6 = family == IpFamily::Ipv6;
            let family_pools: Vec<IpNet> = pools
                .iter()
                .filter(|n| matches!(n, IpNet::V6(_)) == v6)
                .copied()
                .collect();
            if family_pools.is_empty() {
                return Err(CloudError::invalid(
                    "spec.ip_families",
                    format!(
                        "this cloud has no {} pool for {} load balancers",
                        if v6 { "IPv6" } else { "IPv4" },
                        if internal { "internal" } else { "external" }
                    ),
                ));
            }
            if let Some(ip) = requested.filter(|ip| ip.is_ipv6() == v6) {
                if !family_pools.iter().any(|n| n.contains(&ip)) {
                    let pools: Vec<_> = family_pools.iter().map(ToString::to_string).collect();
                    return Err(CloudError::invalid(
                        "spec.load_balancer_ip",
                        format!("{ip} is not in the pool ({})", pools.join(", ")),
                    ));
                }
                if state.used_addresses.contains(&ip) && !keep.contains(&ip) {
                    return Err(CloudError::Conflict(format!(
                        "address {ip} belongs to another load balancer"
                    )));
                }
                out.push(ip);
                continue;
            }
            if let Some(ip) = keep
                .iter()
                .find(|ip| ip.is_ipv6() == v6 && family_pools.iter().any(|n| n.contains(*ip)))
            {
                out.push(*ip);
                continue;
            }
            let (ip, next) = pool::next_free(&family_pools, cursor, &state.used_addresses)
                .ok_or_else(|| {
                    CloudError::PoolExhausted(format!(
                        "no free address in {}",
                        family_pools
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            cursor = next;
            out.push(ip);
        }
        Ok((out, cursor))
    }
}

/// The name a protocol is stored under (the contract's enum names, so
/// state written by earlier versions reads the same).
fn protocol_name(protocol: Protocol) -> String {
    match protocol {
        Protocol::Tcp => "PROTOCOL_TCP",
        Protocol::Udp => "PROTOCOL_UDP",
        Protocol::Sctp => "PROTOCOL_SCTP",
    }
    .to_owned()
}

#[async_trait]
impl LoadBalancers for SimCloud {
    async fn get(&self, cluster: &str, service: &ServiceRef) -> Result<Option<LoadBalancerStatus>> {
        let _call = self.enter(Operation::GetLoadBalancer).await?;
        Ok(own(&self.state(), cluster, service).map(|(_, lb)| lb.status(now_ms())))
    }

    async fn ensure(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<LoadBalancerStatus> {
        let _call = self.enter(Operation::EnsureLoadBalancer).await?;
        let options = annotations::parse(&spec.annotations)?;
        let service = spec.service.clone();
        let now = now_ms();
        let mut state = self.state();
        let (key, existing) = place_of(&state, cluster, &service)?;
        let name = key.1.clone();
        let keep = existing
            .as_ref()
            .filter(|lb| lb.internal == options.internal)
            .map(|lb| lb.addresses.clone())
            .unwrap_or_default();
        let (addresses, cursor) = self.allocate(&state, spec, options.internal, &keep)?;
        let provisioning = self.faults().lb_provisioning_delay;
        let record = LoadBalancerRecord {
            cluster: cluster.to_owned(),
            name: name.clone(),
            service_namespace: service.namespace,
            service_name: service.name,
            service_uid: service.uid,
            addresses,
            internal: options.internal,
            algorithm: options.algorithm,
            health_check_interval_ms: options.health_check_interval.as_millis() as u64,
            ports: spec
                .ports
                .iter()
                .map(|p| (p.port, protocol_name(p.protocol), p.node_port))
                .collect(),
            source_ranges: spec.source_ranges.clone(),
            hosts: hosts.iter().map(|h| h.name.clone()).collect(),
            ready_at_ms: existing
                .as_ref()
                .map(|lb| lb.ready_at_ms)
                .unwrap_or(now + provisioning.as_millis() as u64),
        };
        if existing.as_ref() != Some(&record) {
            state
                .store
                .put_load_balancer(&record, &[(COUNTER_POOL_CURSOR, cursor)])?;
            if let Some(old) = &existing {
                for ip in &old.addresses {
                    state.used_addresses.remove(ip);
                }
            }
            state
                .used_addresses
                .extend(record.addresses.iter().copied());
            state.counters.insert(COUNTER_POOL_CURSOR.into(), cursor);
            state.load_balancers.insert(key, record.clone());
        }
        if now < record.ready_at_ms {
            return Err(CloudError::Provisioning {
                retry_after: Duration::from_millis(record.ready_at_ms - now),
                message: format!("load balancer {name} is being provisioned"),
            });
        }
        Ok(record.status(now))
    }

    async fn update_hosts(
        &self,
        cluster: &str,
        spec: &LoadBalancerSpec,
        hosts: &[Host],
    ) -> Result<()> {
        let _call = self.enter(Operation::UpdateLoadBalancerHosts).await?;
        let mut state = self.state();
        let (key, mut record) = own(&state, cluster, &spec.service).ok_or_else(|| {
            CloudError::NotFound(format!(
                "the load balancer of Service {}/{}",
                spec.service.namespace, spec.service.name
            ))
        })?;
        record.hosts = hosts.iter().map(|h| h.name.clone()).collect();
        state.store.put_load_balancer(&record, &[])?;
        state.load_balancers.insert(key, record);
        Ok(())
    }

    async fn host_limits(&self) -> Result<Vec<HostLimits>> {
        let _call = self.enter(Operation::LoadBalancerLimits).await?;
        Ok(vec![HostLimits {
            kind: "sim".into(),
            per_load_balancer: self.config.lb_hosts_per_load_balancer,
            per_zone: self.config.lb_hosts_per_zone,
            source: "the gateway's --sim-lb-hosts-per-zone and --sim-lb-hosts-per-load-balancer"
                .into(),
            ..Default::default()
        }])
    }

    async fn delete(&self, cluster: &str, service: &ServiceRef) -> Result<()> {
        let _call = self.enter(Operation::DeleteLoadBalancer).await?;
        let mut state = self.state();
        if let Some((key, _)) = own(&state, cluster, service) {
            state.store.delete_load_balancer(&key.0, &key.1)?;
            if let Some(old) = state.load_balancers.remove(&key) {
                for ip in &old.addresses {
                    state.used_addresses.remove(ip);
                }
            }
        }
        Ok(())
    }

    async fn list(&self, cluster: &str) -> Result<Vec<LoadBalancer>> {
        let _call = self.enter(Operation::ListLoadBalancers).await?;
        let now = now_ms();
        Ok(self
            .state()
            .load_balancers
            .values()
            .filter(|lb| lb.cluster == cluster)
            .map(|lb| LoadBalancer {
                name: lb.name.clone(),
                service: lb.service(),
                status: lb.status(now),
                hosts: lb.hosts.clone(),
            })
            .collect())
    }
}
