//! `SimAdmin`: the simulated cloud's console, for the sandbox, tests and
//! benchmarks. Only the `admin` role may call it (see `auth`).

use std::sync::Arc;
use std::time::Duration;

use ccm_proto::v1::sim_admin_server::SimAdmin;
use ccm_proto::v1::{
    CreateInstanceRequest, CreateNodeGroupRequest, Faults, GetFaultsRequest, GetStatsRequest,
    InstanceId, InstanceState, ListInstancesRequest, ListInstancesResponse,
    ListSimNodeGroupsRequest, ListSimNodeGroupsResponse, SetInstanceAddressesRequest, SimInstance,
    SimNodeGroup, SimTaint, Stats, TerminateInstanceResponse,
};
use tonic::{Request, Response, Status};

use super::status::answer;

use ccm_provider::{CloudError, Operation};
use ccm_provider_sim::store::{InstanceRecord, NodeGroupRecord};
use ccm_provider_sim::{FaultSettings, NewInstance, SimCloud};

use super::convert;
use super::validate::Violations;
use crate::cloud::instance_lookups::InstanceLookups;

/// The SimAdmin service over one simulated cloud.
pub struct SimAdminService {
    sim: Arc<SimCloud>,
    lookups: Option<Arc<InstanceLookups>>,
}

impl SimAdminService {
    /// One instance as SimAdmin shows it (see [`sim_instance`]).
    fn shown(&self, record: &InstanceRecord) -> Result<SimInstance, CloudError> {
        Ok(sim_instance(record, &self.sim.node_group_records()?))
    }

    /// Serves `sim`; instance changes made here drop what `lookups` cached
    /// about that instance.
    pub fn new(sim: Arc<SimCloud>, lookups: Option<Arc<InstanceLookups>>) -> Self {
        Self { sim, lookups }
    }

    fn invalidate(&self, record: &InstanceRecord) {
        if let Some(lookups) = &self.lookups {
            lookups.invalidate(&record.name, &record.provider_id());
        }
    }
}

/// The record as SimAdmin shows it, with what its kubelet registers: the
/// capacity of its type and the taints of its group (among `groups`).
fn sim_instance(record: &InstanceRecord, groups: &[NodeGroupRecord]) -> SimInstance {
    let taints = record
        .group
        .as_ref()
        .and_then(|id| groups.iter().find(|g| &g.id == id))
        .map(|g| {
            g.taints
                .iter()
                .map(|(key, value, effect)| SimTaint {
                    key: key.clone(),
                    value: value.clone(),
                    effect: effect.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    SimInstance {
        capacity: ccm_provider_sim::instance_capacity(&record.instance_type)
            .into_iter()
            .collect(),
        taints,
        id: record.id.clone(),
        name: record.name.clone(),
        provider_id: record.provider_id(),
        instance_type: record.instance_type.clone(),
        zone: record.zone.clone(),
        region: record.region.clone(),
        state: if record.running {
            InstanceState::Running
        } else {
            InstanceState::Shutdown
        } as i32,
        addresses: convert::addresses_to_wire(record.node_addresses()),
        labels: record.labels.clone().into_iter().collect(),
        node_group: record.group.clone().unwrap_or_default(),
        creating: record
            .ready_at_ms
            .is_some_and(|at| at > ccm_provider_sim::now_ms()),
    }
}

fn sim_node_group(group: &NodeGroupRecord, instances: Vec<String>) -> SimNodeGroup {
    SimNodeGroup {
        cluster_name: group.cluster.clone(),
        id: group.id.clone(),
        min_size: group.min_size,
        max_size: group.max_size,
        target_size: group.target_size,
        instance_type: group.instance_type.clone(),
        zones: group.zones.clone(),
        labels: group.labels.clone().into_iter().collect(),
        taints: group
            .taints
            .iter()
            .map(|(key, value, effect)| SimTaint {
                key: key.clone(),
                value: value.clone(),
                effect: effect.clone(),
            })
            .collect(),
        instances,
        failed_launches: group.failed.iter().map(|f| f.id.clone()).collect(),
        autoscaling_options: group.options.clone().into_iter().collect(),
    }
}

/// The largest node group the console makes.
const MAX_GROUP_SIZE: u32 = 1000;

fn node_group_record(req: CreateNodeGroupRequest) -> Result<NodeGroupRecord, CloudError> {
    let mut v = Violations::default();
    v.cluster_name(&req.cluster_name);
    if req.id.len() > 40 || !ccm_runtime::names::is_dns_label(&req.id) {
        v.add(
            "id",
            format!("{:?} is not a DNS label of at most 40 characters", req.id),
        );
    }
    if req.max_size > MAX_GROUP_SIZE {
        v.add("max_size", format!("at most {MAX_GROUP_SIZE}"));
    }
    if !(req.min_size <= req.target_size && req.target_size <= req.max_size) {
        v.add(
            "target_size",
            format!(
                "min_size <= target_size <= max_size does not hold for {} <= {} <= {}",
                req.min_size, req.target_size, req.max_size
            ),
        );
    }
    if req.labels.len() > 64 {
        v.add("labels", "at most 64 labels");
    }
    for (i, t) in req.taints.iter().enumerate() {
        if t.key.is_empty() {
            v.add(format!("taints[{i}].key"), "must not be empty");
        }
        if !matches!(
            t.effect.as_str(),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute"
        ) {
            v.add(
                format!("taints[{i}].effect"),
                format!(
                    "{:?} is not NoSchedule, PreferNoSchedule or NoExecute",
                    t.effect
                ),
            );
        }
    }
    let mut options = ccm_provider::node_groups::GroupOptions::default();
    for (name, value) in &req.autoscaling_options {
        if let Err(problem) = options.set(name, value) {
            v.add(format!("autoscaling_options[{name}]"), problem);
        }
    }
    v.finish()?;
    Ok(NodeGroupRecord {
        cluster: req.cluster_name,
        id: req.id,
        min_size: req.min_size,
        max_size: req.max_size,
        target_size: req.target_size,
        instance_type: req.instance_type,
        zones: req.zones,
        labels: req.labels.into_iter().collect(),
        taints: req
            .taints
            .into_iter()
            .map(|t| (t.key, t.value, t.effect))
            .collect(),
        failed: Vec::new(),
        next_failed: 0,
        options: req.autoscaling_options.into_iter().collect(),
    })
}

fn to_proto_duration(d: Duration) -> Option<prost_types::Duration> {
    (!d.is_zero()).then(|| prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

fn faults_to_proto(f: &FaultSettings) -> Faults {
    let mut latency: std::collections::HashMap<_, _> = f
        .latency
        .iter()
        .filter_map(|(op, d)| to_proto_duration(*d).map(|d| (op.as_str().to_owned(), d)))
        .collect();
    if let Some(d) = to_proto_duration(f.default_latency) {
        latency.insert("*".into(), d);
    }
    Faults {
        latency,
        error_rate_by_operation: f
            .error_rates
            .iter()
            .map(|(op, rate)| (op.as_str().to_owned(), *rate))
            .collect(),
        error_rate: f.error_rate,
        throttle_rate: f.throttle_rate,
        throttle_retry_after: to_proto_duration(f.throttle_retry_after),
        lb_provisioning_delay: to_proto_duration(f.lb_provisioning_delay),
        volume_attach_delay: to_proto_duration(f.volume_attach_delay),
        volume_create_delay: to_proto_duration(f.volume_create_delay),
        capacity_exhausted_zones: f.capacity_exhausted_zones.iter().cloned().collect(),
    }
}

fn faults_from_proto(f: Faults) -> Result<FaultSettings, CloudError> {
    let mut v = Violations::default();
    let mut out = FaultSettings {
        error_rate: f.error_rate,
        throttle_rate: f.throttle_rate,
        capacity_exhausted_zones: f.capacity_exhausted_zones.iter().cloned().collect(),
        ..Default::default()
    };
    if f.capacity_exhausted_zones.len() > 64 {
        v.add("capacity_exhausted_zones", "at most 64 zones");
    }
    for (name, rate) in [
        ("error_rate", f.error_rate),
        ("throttle_rate", f.throttle_rate),
    ] {
        if !(0.0..=1.0).contains(&rate) {
            v.add(name, format!("{rate} is not a share from 0.0 to 1.0"));
        }
    }
    for (key, rate) in &f.error_rate_by_operation {
        let field = format!("error_rate_by_operation[{key:?}]");
        if !(0.0..=1.0).contains(rate) {
            v.add(
                field.clone(),
                format!("{rate} is not a share from 0.0 to 1.0"),
            );
        }
        match key.parse::<Operation>() {
            Ok(op) => {
                out.error_rates.insert(op, *rate);
            }
            Err(e) => v.add(field, e),
        }
    }
    let mut duration = |field: String, d: Option<prost_types::Duration>| -> Duration {
        match d.map(Duration::try_from) {
            None => Duration::ZERO,
            Some(Ok(d)) if d <= Duration::from_secs(3600) => d,
            Some(_) => {
                v.add(field, "must be a duration from 0 to 1h");
                Duration::ZERO
            }
        }
    };
    let mut latency = Vec::new();
    for (key, d) in f.latency {
        let d = duration(format!("latency[{key:?}]"), Some(d));
        latency.push((key, d));
    }
    out.throttle_retry_after = duration("throttle_retry_after".into(), f.throttle_retry_after);
    out.lb_provisioning_delay = duration("lb_provisioning_delay".into(), f.lb_provisioning_delay);
    out.volume_attach_delay = duration("volume_attach_delay".into(), f.volume_attach_delay);
    out.volume_create_delay = duration("volume_create_delay".into(), f.volume_create_delay);
    for (key, d) in latency {
        if key == "*" {
            out.default_latency = d;
        } else {
            match key.parse::<Operation>() {
                Ok(op) => {
                    out.latency.insert(op, d);
                }
                Err(e) => v.add(format!("latency[{key:?}]"), e),
            }
        }
    }
    v.finish()?;
    Ok(out)
}

#[tonic::async_trait]
impl SimAdmin for SimAdminService {
    async fn create_instance(
        &self,
        request: Request<CreateInstanceRequest>,
    ) -> Result<Response<SimInstance>, Status> {
        answer(async move {
            let req = request.into_inner();
            let mut v = Violations::default();
            v.name("name", &req.name);
            v.addresses("addresses", &req.addresses, 32);
            if req.labels.len() > 64 {
                v.add("labels", "at most 64 labels");
            }
            v.finish()?;
            let record = self.sim.create_instance(NewInstance {
                name: req.name,
                instance_type: req.instance_type,
                zone: req.zone,
                addresses: convert::addresses(req.addresses),
                labels: req.labels.into_iter().collect(),
            })?;
            tracing::info!(target: "audit", instance = %record.id, name = %record.name, "sim instance created");
            Ok(Response::new(self.shown(&record)?))
        })
        .await
    }

    async fn list_instances(
        &self,
        _request: Request<ListInstancesRequest>,
    ) -> Result<Response<ListInstancesResponse>, Status> {
        answer(async move {
            let groups = self.sim.node_group_records()?;
            let instances = self
                .sim
                .list_instances()?
                .iter()
                .map(|record| sim_instance(record, &groups))
                .collect();
            Ok(Response::new(ListInstancesResponse { instances }))
        })
        .await
    }

    async fn stop_instance(
        &self,
        request: Request<InstanceId>,
    ) -> Result<Response<SimInstance>, Status> {
        answer(async move {
            let id = request.into_inner().id;
            let record = self.sim.set_running(&id, false)?;
            self.invalidate(&record);
            tracing::info!(target: "audit", instance = %record.id, "sim instance stopped");
            Ok(Response::new(self.shown(&record)?))
        })
        .await
    }

    async fn start_instance(
        &self,
        request: Request<InstanceId>,
    ) -> Result<Response<SimInstance>, Status> {
        answer(async move {
            let id = request.into_inner().id;
            let record = self.sim.set_running(&id, true)?;
            self.invalidate(&record);
            tracing::info!(target: "audit", instance = %record.id, "sim instance started");
            Ok(Response::new(self.shown(&record)?))
        })
        .await
    }

    async fn terminate_instance(
        &self,
        request: Request<InstanceId>,
    ) -> Result<Response<TerminateInstanceResponse>, Status> {
        answer(async move {
            let id = request.into_inner().id;
            let record = self.sim.terminate(&id)?;
            self.invalidate(&record);
            tracing::info!(target: "audit", instance = %id, "sim instance terminated");
            Ok(Response::new(TerminateInstanceResponse {}))
        })
        .await
    }

    async fn set_instance_addresses(
        &self,
        request: Request<SetInstanceAddressesRequest>,
    ) -> Result<Response<SimInstance>, Status> {
        answer(async move {
            let req = request.into_inner();
            let mut v = Violations::default();
            if req.addresses.is_empty() {
                v.add("addresses", "at least one address");
            }
            v.addresses("addresses", &req.addresses, 32);
            v.finish()?;
            let record = self
                .sim
                .set_addresses(&req.id, &convert::addresses(req.addresses))?;
            self.invalidate(&record);
            tracing::info!(target: "audit", instance = %record.id, "sim instance addresses set");
            Ok(Response::new(self.shown(&record)?))
        })
        .await
    }

    async fn set_faults(&self, request: Request<Faults>) -> Result<Response<Faults>, Status> {
        answer(async move {
            let faults = faults_from_proto(request.into_inner())?;
            tracing::info!(target: "audit", ?faults, "sim faults set");
            self.sim.set_faults(faults);
            Ok(Response::new(faults_to_proto(&self.sim.faults())))
        })
        .await
    }

    async fn create_node_group(
        &self,
        request: Request<CreateNodeGroupRequest>,
    ) -> Result<Response<SimNodeGroup>, Status> {
        answer(async move {
            let record = self.sim.create_node_group(node_group_record(request.into_inner())?)?;
            tracing::info!(target: "audit", cluster = %record.cluster, node_group = %record.id, "sim node group created");
            let instances = self
                .sim
                .node_groups()?
                .into_iter()
                .find(|(g, _)| g.cluster == record.cluster && g.id == record.id)
                .map(|(_, names)| names)
                .unwrap_or_default();
            Ok(Response::new(sim_node_group(&record, instances)))
        })
        .await
    }

    async fn list_node_groups(
        &self,
        _request: Request<ListSimNodeGroupsRequest>,
    ) -> Result<Response<ListSimNodeGroupsResponse>, Status> {
        answer(async move {
            let node_groups = self
                .sim
                .node_groups()?
                .into_iter()
                .map(|(group, instances)| sim_node_group(&group, instances))
                .collect();
            Ok(Response::new(ListSimNodeGroupsResponse { node_groups }))
        })
        .await
    }

    async fn get_faults(
        &self,
        _request: Request<GetFaultsRequest>,
    ) -> Result<Response<Faults>, Status> {
        answer(async move { Ok(Response::new(faults_to_proto(&self.sim.faults()))) }).await
    }

    async fn get_stats(
        &self,
        request: Request<GetStatsRequest>,
    ) -> Result<Response<Stats>, Status> {
        answer(async move {
            let (calls, looked_up) = self.sim.stats(request.into_inner().reset);
            let max_in_flight = self
                .sim
                .max_in_flight()
                .into_iter()
                .map(|(op, n)| (op.as_str().to_owned(), n))
                .collect();
            Ok(Response::new(Stats {
                max_in_flight,
                calls: calls
                    .into_iter()
                    .map(|(op, n)| (op.as_str().to_owned(), n))
                    .collect(),
                instances_looked_up: looked_up,
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_round_trip_and_bad_values_are_named() {
        let mut f = Faults {
            error_rate: 0.2,
            lb_provisioning_delay: to_proto_duration(Duration::from_secs(1)),
            volume_attach_delay: to_proto_duration(Duration::from_secs(2)),
            ..Default::default()
        };
        f.latency.insert(
            "*".into(),
            prost_types::Duration {
                seconds: 0,
                nanos: 20_000_000,
            },
        );
        f.latency.insert(
            "create_route".into(),
            prost_types::Duration {
                seconds: 1,
                nanos: 0,
            },
        );
        f.error_rate_by_operation.insert("create_route".into(), 1.0);
        let settings = faults_from_proto(f.clone()).unwrap();
        assert_eq!(settings.error_rates[&Operation::CreateRoute], 1.0);
        assert_eq!(settings.default_latency, Duration::from_millis(20));
        assert_eq!(
            settings.latency[&Operation::CreateRoute],
            Duration::from_secs(1)
        );
        assert_eq!(faults_to_proto(&settings), f);

        let mut bad = Faults {
            error_rate: 1.5,
            ..Default::default()
        };
        bad.latency.insert(
            "teleport".into(),
            prost_types::Duration {
                seconds: 1,
                nanos: 0,
            },
        );
        let CloudError::InvalidArgument(problems) = faults_from_proto(bad).unwrap_err() else {
            panic!("expected InvalidArgument");
        };
        let fields: Vec<_> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert!(fields.contains(&"error_rate"), "{fields:?}");
        assert!(fields.iter().any(|f| f.contains("teleport")), "{fields:?}");
    }
}
