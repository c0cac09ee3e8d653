//! `sim`: the embedded default cloud. It behaves like a real one (instances
//! that stop and vanish, load balancers with addresses from a pool that
//! take time to provision, routes per cluster, volumes that attach only in
//! their own zone), keeps its state in SQLite under the state directory so
//! it survives restarts, and injects faults on request: latency per
//! operation, errors, throttling, slow provisioning.
//! Tests, the sandbox and the benchmarks all run on it.

pub mod annotations;
mod instances;
mod load_balancers;
mod node_groups;
mod pool;
mod routes;
pub mod store;
mod volumes;

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use ccm_provider::{
    AddressType, CloudError, Instance, Instances, LoadBalancers, NodeAddress, Operation, Provider,
    Result, Routes, Volumes,
};
use ipnet::IpNet;

pub use self::node_groups::{GPU_LABEL, NEW_INSTANCE_TIME, capacity as instance_capacity};
use self::store::{
    InstanceRecord, LoadBalancerRecord, RouteRecord, SnapshotRecord, Store, VolumeRecord,
};
pub use self::volumes::{CSI_DRIVER, TOPOLOGY_ZONE_KEY};

/// The provider's name and provider-ID scheme.
pub const NAME: &str = "sim";
const PROVIDER_ID_PREFIX: &str = "sim://";

const COUNTER_INSTANCE: &str = "next_instance";
const COUNTER_NODE_ADDRESS: &str = "next_node_address";
const COUNTER_POOL_CURSOR: &str = "pool_cursor";
const COUNTER_VOLUME: &str = "next_volume";
const COUNTER_SNAPSHOT: &str = "next_snapshot";

/// The simulated cloud's fixed settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The region every instance is in.
    pub region: String,
    /// Zones instances are spread over.
    pub zones: Vec<String>,
    /// The type of instances created without one.
    pub default_instance_type: String,
    /// Addresses for external load balancers (IPv4 and/or IPv6 networks).
    pub lb_pool: Vec<IpNet>,
    /// Addresses for internal load balancers.
    pub internal_lb_pool: Vec<IpNet>,
    /// The network instances get their internal addresses from.
    pub node_network: IpNet,
    /// The most hosts of one load balancer in one zone (0: no limit).
    pub lb_hosts_per_zone: u32,
    /// The most hosts of one load balancer (0: no limit).
    pub lb_hosts_per_load_balancer: u32,
    /// The most volumes attached to one instance at once.
    pub volumes_per_instance: u32,
}

/// The sim's default limits on a load balancer's hosts: AWS's published
/// quotas for a Network Load Balancer (targets per Availability Zone, and
/// per load balancer).
pub const DEFAULT_LB_HOSTS_PER_ZONE: u32 = 500;
pub const DEFAULT_LB_HOSTS_PER_LOAD_BALANCER: u32 = 3000;

/// The sim's default limit on the volumes attached to one instance, near
/// what AWS's Nitro instances take (28 attachments, shared between volumes,
/// network interfaces and the root disk).
pub const DEFAULT_VOLUMES_PER_INSTANCE: u32 = 26;

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            region: "sim-region-1".into(),
            zones: vec![
                "sim-zone-a".into(),
                "sim-zone-b".into(),
                "sim-zone-c".into(),
            ],
            default_instance_type: "sim.standard-2".into(),
            lb_pool: vec!["203.0.113.0/24".parse().expect("valid")],
            internal_lb_pool: vec!["10.255.0.0/24".parse().expect("valid")],
            node_network: "10.240.0.0/16".parse().expect("valid"),
            lb_hosts_per_zone: DEFAULT_LB_HOSTS_PER_ZONE,
            lb_hosts_per_load_balancer: DEFAULT_LB_HOSTS_PER_LOAD_BALANCER,
            volumes_per_instance: DEFAULT_VOLUMES_PER_INSTANCE,
        }
    }
}

/// Faults injected into provider calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultSettings {
    /// Latency per operation.
    pub latency: BTreeMap<Operation, Duration>,
    /// Latency for operations without their own entry.
    pub default_latency: Duration,
    /// Share of calls that fail as unavailable.
    pub error_rate: f64,
    /// Error rates of single operations, in place of `error_rate`.
    pub error_rates: BTreeMap<Operation, f64>,
    /// Share of calls that are throttled.
    pub throttle_rate: f64,
    /// The retry delay of a throttled call.
    pub throttle_retry_after: Duration,
    /// How long new load balancers take to provision.
    pub lb_provisioning_delay: Duration,
    /// Zones where a node group's new instance fails to launch.
    pub capacity_exhausted_zones: std::collections::BTreeSet<String>,
    /// How long a new volume attachment stays attaching (a slow attach; a
    /// long one is a volume stuck attaching).
    pub volume_attach_delay: Duration,
    /// How long a new volume stays creating.
    pub volume_create_delay: Duration,
}

/// Load balancers, routes, volumes, snapshots and counters are held in
/// memory beside the store; instances are read from it when asked for (see
/// `store::Loaded`).
struct State {
    store: Store,
    load_balancers: BTreeMap<(String, String), LoadBalancerRecord>,
    used_addresses: HashSet<IpAddr>,
    routes: BTreeMap<(String, String), RouteRecord>,
    /// Every cluster's volumes, by ID.
    volumes: BTreeMap<String, VolumeRecord>,
    /// Every cluster's snapshots, by ID.
    snapshots: BTreeMap<String, SnapshotRecord>,
    counters: BTreeMap<String, u64>,
}

/// The simulated cloud.
pub struct SimCloud {
    config: SimConfig,
    state: Mutex<State>,
    faults: RwLock<FaultSettings>,
    calls: Mutex<BTreeMap<Operation, u64>>,
    in_flight: Mutex<BTreeMap<Operation, (u64, u64)>>,
    looked_up: AtomicU64,
}

/// Counts one call in progress until dropped.
struct InFlight<'a> {
    sim: &'a SimCloud,
    op: Operation,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut map = self.sim.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((now, _)) = map.get_mut(&self.op) {
            *now = now.saturating_sub(1);
        }
    }
}

/// An instance to create.
#[derive(Clone, Debug, Default)]
pub struct NewInstance {
    pub name: String,
    pub instance_type: String,
    pub zone: String,
    pub addresses: Vec<NodeAddress>,
    pub labels: BTreeMap<String, String>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The name an address kind is stored under (the contract's enum names,
/// so state written by earlier versions reads the same).
fn address_type_name(kind: AddressType) -> String {
    match kind {
        AddressType::Hostname => "NODE_ADDRESS_TYPE_HOSTNAME",
        AddressType::InternalIp => "NODE_ADDRESS_TYPE_INTERNAL_IP",
        AddressType::ExternalIp => "NODE_ADDRESS_TYPE_EXTERNAL_IP",
        AddressType::InternalDns => "NODE_ADDRESS_TYPE_INTERNAL_DNS",
        AddressType::ExternalDns => "NODE_ADDRESS_TYPE_EXTERNAL_DNS",
    }
    .to_owned()
}

/// A stored address; one of a kind this version does not know is left out.
fn address_from_record((kind, address): &(String, String)) -> Option<NodeAddress> {
    AddressType::ALL
        .into_iter()
        .find(|k| address_type_name(*k) == *kind)
        .map(|k| NodeAddress::new(k, address.clone()))
}

impl InstanceRecord {
    fn to_instance(&self) -> Instance {
        Instance {
            provider_id: self.provider_id(),
            instance_type: self.instance_type.clone(),
            zone: self.zone.clone(),
            region: self.region.clone(),
            addresses: self.node_addresses(),
            additional_labels: self.labels.clone().into_iter().collect(),
        }
    }

    /// The instance's provider ID.
    pub fn provider_id(&self) -> String {
        format!("{PROVIDER_ID_PREFIX}{}", self.id)
    }

    /// The instance's addresses.
    pub fn node_addresses(&self) -> Vec<NodeAddress> {
        self.addresses
            .iter()
            .filter_map(address_from_record)
            .collect()
    }
}

impl SimCloud {
    /// Opens the cloud whose state lives in `state_dir`.
    pub fn open(state_dir: &Path, config: SimConfig) -> Result<Self> {
        let (store, loaded) = Store::open(state_dir)?;
        let mut state = State {
            store,
            load_balancers: BTreeMap::new(),
            used_addresses: HashSet::new(),
            routes: BTreeMap::new(),
            volumes: loaded
                .volumes
                .into_iter()
                .map(|v| (v.id.clone(), v))
                .collect(),
            snapshots: loaded
                .snapshots
                .into_iter()
                .map(|s| (s.id.clone(), s))
                .collect(),
            counters: loaded.counters,
        };
        for lb in loaded.load_balancers {
            state.used_addresses.extend(lb.addresses.iter().copied());
            state
                .load_balancers
                .insert((lb.cluster.clone(), lb.name.clone()), lb);
        }
        for route in loaded.routes {
            state
                .routes
                .insert((route.cluster.clone(), route.name.clone()), route);
        }
        Ok(Self {
            config,
            state: Mutex::new(state),
            faults: RwLock::new(FaultSettings::default()),
            calls: Mutex::new(BTreeMap::new()),
            in_flight: Mutex::new(BTreeMap::new()),
            looked_up: AtomicU64::new(0),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the call and applies the injected faults for `op`. The guard
    /// counts the call as in progress until the operation is done.
    async fn enter(&self, op: Operation) -> Result<InFlight<'_>> {
        *self
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(op)
            .or_default() += 1;
        {
            let mut map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            let (now, max) = map.entry(op).or_default();
            *now += 1;
            *max = (*max).max(*now);
        }
        let guard = InFlight { sim: self, op };
        let faults = self.faults();
        let latency = faults
            .latency
            .get(&op)
            .copied()
            .unwrap_or(faults.default_latency);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if faults.throttle_rate > 0.0 && fastrand::f64() < faults.throttle_rate {
            return Err(CloudError::Throttled {
                retry_after: if faults.throttle_retry_after.is_zero() {
                    Duration::from_secs(1)
                } else {
                    faults.throttle_retry_after
                },
            });
        }
        let error_rate = faults
            .error_rates
            .get(&op)
            .copied()
            .unwrap_or(faults.error_rate);
        if error_rate > 0.0 && fastrand::f64() < error_rate {
            return Err(CloudError::Unavailable(format!("injected fault in {op}")));
        }
        Ok(guard)
    }

    /// The injected faults.
    pub fn faults(&self) -> FaultSettings {
        self.faults
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the injected faults.
    pub fn set_faults(&self, faults: FaultSettings) {
        *self.faults.write().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// Provider calls answered per operation, and instances looked up.
    pub fn stats(&self, reset: bool) -> (BTreeMap<Operation, u64>, u64) {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let out = (calls.clone(), self.looked_up.load(Ordering::Relaxed));
        if reset {
            calls.clear();
            self.looked_up.store(0, Ordering::Relaxed);
            for (_, max) in self
                .in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values_mut()
            {
                *max = 0;
            }
        }
        out
    }

    /// The most calls of each operation in progress at once.
    pub fn max_in_flight(&self) -> BTreeMap<Operation, u64> {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(op, (_, max))| (*op, *max))
            .collect()
    }

    /// Creates a running instance.
    pub fn create_instance(&self, new: NewInstance) -> Result<InstanceRecord> {
        self.create_instance_in(&mut self.state(), new, None)
    }

    /// Creates an instance with the state locked; one of a node group
    /// (`group`: its id, and until when it is being made) records that.
    fn create_instance_in(
        &self,
        state: &mut State,
        new: NewInstance,
        group: Option<(&str, u64)>,
    ) -> Result<InstanceRecord> {
        if state.store.instance_id(&new.name)?.is_some() {
            return Err(CloudError::Conflict(format!(
                "an instance named {:?} exists",
                new.name
            )));
        }
        let number = state.counters.get(COUNTER_INSTANCE).copied().unwrap_or(1);
        let mut counters = vec![(COUNTER_INSTANCE, number + 1)];
        let addresses = if new.addresses.is_empty() {
            let offset = state
                .counters
                .get(COUNTER_NODE_ADDRESS)
                .copied()
                .unwrap_or(0);
            let ip = pool::address_at(std::slice::from_ref(&self.config.node_network), offset)
                .ok_or_else(|| {
                    CloudError::PoolExhausted(format!(
                        "node network {} is full",
                        self.config.node_network
                    ))
                })?;
            counters.push((COUNTER_NODE_ADDRESS, offset + 1));
            vec![
                ("NODE_ADDRESS_TYPE_HOSTNAME".to_owned(), new.name.clone()),
                ("NODE_ADDRESS_TYPE_INTERNAL_IP".to_owned(), ip.to_string()),
            ]
        } else {
            new.addresses
                .iter()
                .map(|a| (address_type_name(a.kind), a.address.clone()))
                .collect()
        };
        let zone = if new.zone.is_empty() {
            self.config.zones[(number as usize - 1) % self.config.zones.len()].clone()
        } else {
            new.zone
        };
        let record = InstanceRecord {
            id: format!("i-{number:06}"),
            name: new.name,
            instance_type: if new.instance_type.is_empty() {
                self.config.default_instance_type.clone()
            } else {
                new.instance_type
            },
            zone,
            region: self.config.region.clone(),
            running: true,
            addresses,
            labels: new.labels,
            group: group.map(|(id, _)| id.to_owned()),
            ready_at_ms: group.map(|(_, ready_at)| ready_at),
        };
        state.store.put_instance(&record, &counters)?;
        for (name, value) in counters {
            state.counters.insert(name.to_owned(), value);
        }
        Ok(record)
    }

    /// The instance with ID (or provider ID) or name `id_or_name`.
    fn find(state: &State, id_or_name: &str) -> Result<InstanceRecord> {
        let id = id_or_name
            .strip_prefix(PROVIDER_ID_PREFIX)
            .unwrap_or(id_or_name);
        match state.store.instance(id)? {
            Some(record) => Ok(record),
            None => state
                .store
                .instance_named(id_or_name)?
                .ok_or_else(|| CloudError::NotFound(format!("instance {id_or_name:?}"))),
        }
    }

    /// Every instance, ordered by ID.
    pub fn list_instances(&self) -> Result<Vec<InstanceRecord>> {
        self.state().store.instances()
    }

    /// Stops or starts an instance.
    pub fn set_running(&self, id_or_name: &str, running: bool) -> Result<InstanceRecord> {
        let mut state = self.state();
        let mut record = Self::find(&state, id_or_name)?;
        record.running = running;
        state.store.put_instance(&record, &[])?;
        Ok(record)
    }

    /// Replaces an instance's addresses.
    pub fn set_addresses(
        &self,
        id_or_name: &str,
        addresses: &[NodeAddress],
    ) -> Result<InstanceRecord> {
        let mut state = self.state();
        let mut record = Self::find(&state, id_or_name)?;
        record.addresses = addresses
            .iter()
            .map(|a| (address_type_name(a.kind), a.address.clone()))
            .collect();
        state.store.put_instance(&record, &[])?;
        Ok(record)
    }

    /// Terminates an instance: it is gone for good, and the volumes that
    /// were attached to it are attached nowhere. Returns what it was.
    pub fn terminate(&self, id_or_name: &str) -> Result<InstanceRecord> {
        let mut state = self.state();
        let record = Self::find(&state, id_or_name)?;
        state.remove_instance(&record.id)?;
        Ok(record)
    }
}

#[async_trait]
impl Provider for SimCloud {
    fn name(&self) -> &str {
        NAME
    }

    fn instances(&self) -> Option<&dyn Instances> {
        Some(self)
    }

    fn load_balancers(&self) -> Option<&dyn LoadBalancers> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }

    fn node_groups(&self) -> Option<&dyn ccm_provider::NodeGroups> {
        Some(self)
    }

    fn volumes(&self) -> Option<&dyn Volumes> {
        Some(self)
    }

    async fn check(&self) -> Result<()> {
        Ok(())
    }
}
