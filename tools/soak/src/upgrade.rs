//! The version skew run: the sandbox starts on another release's
//! components and this build's replace them one process at a time, as a
//! rolling update of each Deployment would, in the order asked (the
//! gateway first, or the controllers first), with the old and the new
//! side by side for a while after each step and the churn going.
//!
//! Besides the observer's invariants, each step where a new release takes
//! over (a controller's lease moving to a new replica, the gateway
//! replaced) is a handover checked on its own: the churn holds, the cloud
//! goes quiet, the process is replaced, and for the handover's window
//! (the new leader's first pass) not one cloud write may happen: the
//! objects were settled. And the objects that were settled before the
//! upgrade (which the churn leaves alone) must come out of it as they
//! went in: the same load balancers at the same addresses, the same
//! Nodes, the same routes, never a create or delete of theirs in the
//! gateway's audit log.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_sim::store::Snapshot;
use ccm_sandbox::{Handle, Sandbox};

use crate::churn::Spare;
use crate::{Counts, Violation, count};

/// Which side of the system goes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The gateway, then the node, service and route controllers: old
    /// controllers call a newer gateway.
    GatewayFirst,
    /// The controllers, then the gateway: new controllers call an older
    /// gateway.
    ControllersFirst,
}

impl std::str::FromStr for Order {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gateway-first" => Ok(Self::GatewayFirst),
            "controllers-first" => Ok(Self::ControllersFirst),
            other => Err(format!(
                "{other:?} is not an order; use gateway-first or controllers-first"
            )),
        }
    }
}

impl Order {
    /// The components in the order they are replaced.
    pub fn components(self) -> [&'static str; 4] {
        const CONTROLLERS: [&str; 3] =
            ["node-controller", "service-controller", "route-controller"];
        match self {
            Self::GatewayFirst => [
                "cloud-gateway",
                CONTROLLERS[0],
                CONTROLLERS[1],
                CONTROLLERS[2],
            ],
            Self::ControllersFirst => [
                CONTROLLERS[0],
                CONTROLLERS[1],
                CONTROLLERS[2],
                "cloud-gateway",
            ],
        }
    }
}

/// What an upgrade run starts from and how it goes.
#[derive(Clone, Debug)]
pub struct Upgrade {
    /// The other release's binaries (`tools/previous-release/build.sh`).
    pub from: PathBuf,
    pub order: Order,
    /// How long the old and the new run side by side after each step.
    pub side_by_side: Duration,
    /// How long a handover's window lasts: the new leader's first pass.
    pub handover: Duration,
}

/// The settled objects' cloud resources before the upgrade.
#[derive(Debug, Default)]
pub struct Settled {
    /// Node and Service names (the churn spares them).
    pub names: BTreeSet<String>,
    /// Load balancer name → its addresses.
    pub load_balancers: BTreeMap<String, Vec<String>>,
    /// Route name → (node, pod CIDR).
    pub routes: BTreeMap<String, (String, String)>,
    /// Node name → UID.
    pub nodes: BTreeMap<String, String>,
}

impl Settled {
    /// What the cloud and the API server hold of `names`.
    pub async fn read(
        handle: &Handle,
        cloud: &Path,
        names: BTreeSet<String>,
    ) -> anyhow::Result<Self> {
        let snapshot = cloud_snapshot(cloud).await?;
        let client = ccm_runtime::kube::client(Some(&handle.kubeconfig)).await?;
        let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client)
            .list(&Default::default())
            .await?
            .items;
        Ok(Self {
            load_balancers: snapshot
                .load_balancers
                .iter()
                .filter(|lb| names.contains(&lb.service_name))
                .map(|lb| {
                    let addresses = lb.addresses.iter().map(|a| a.to_string()).collect();
                    (lb.name.clone(), addresses)
                })
                .collect(),
            routes: snapshot
                .routes
                .iter()
                .filter(|r| names.contains(&r.target_node))
                .map(|r| {
                    (
                        r.name.clone(),
                        (r.target_node.clone(), r.destination_cidr.clone()),
                    )
                })
                .collect(),
            nodes: nodes
                .into_iter()
                .filter_map(|n| Some((n.metadata.name?, n.metadata.uid?)))
                .filter(|(name, _)| names.contains(name))
                .collect(),
            names,
        })
    }

    /// How `after` differs from this, for the settled objects.
    pub fn changes(&self, after: &Settled) -> Vec<String> {
        let mut changes = Vec::new();
        for (name, addresses) in &self.load_balancers {
            match after.load_balancers.get(name) {
                None => changes.push(format!("load balancer {name} is gone")),
                Some(now) if now != addresses => changes.push(format!(
                    "load balancer {name} moved from {addresses:?} to {now:?}"
                )),
                Some(_) => {}
            }
        }
        for (name, (node, cidr)) in &self.routes {
            if after.routes.get(name) != Some(&(node.clone(), cidr.clone())) {
                changes.push(format!(
                    "route {name} ({cidr} to {node}) is gone or changed"
                ));
            }
        }
        for (name, uid) in &self.nodes {
            match after.nodes.get(name) {
                None => changes.push(format!("Node {name} was deleted")),
                Some(now) if now != uid => changes.push(format!("Node {name} was recreated")),
                Some(_) => {}
            }
        }
        changes
    }

    /// Whether an audit line's resource (`load_balancer/<name>`,
    /// `route/<cidr>-><node>` or `route/<name>`) is one of the settled
    /// objects'. Instance tags are written in batches, named by count.
    fn owns(&self, resource: &str) -> bool {
        if let Some(name) = resource.strip_prefix("load_balancer/") {
            return self.load_balancers.contains_key(name);
        }
        if let Some(route) = resource.strip_prefix("route/") {
            return self.routes.contains_key(route)
                || self
                    .routes
                    .values()
                    .any(|(node, cidr)| route == cidr || route == format!("{cidr}->{node}"));
        }
        false
    }
}

/// What the sim's database holds, read directly.
async fn cloud_snapshot(dir: &Path) -> anyhow::Result<Snapshot> {
    let dir = dir.to_path_buf();
    Ok(tokio::task::spawn_blocking(move || ccm_provider_sim::store::Store::read(&dir)).await??)
}

/// One cloud write from the gateway's audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub operation: String,
    pub caller: String,
    pub resource: String,
    /// `ok`, or why the cloud or the gateway refused it.
    pub outcome: String,
}

/// The value of `field=` in a plain log line (quoted or not).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    let rest = &line[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        return quoted.split('"').next();
    }
    rest.split_whitespace().next()
}

/// The cloud writes in a gateway log from byte `from` on.
pub fn writes(log: &Path, from: u64) -> Vec<Write> {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
    text.lines()
        .filter(|l| l.contains("cloud write"))
        .map(|l| Write {
            operation: field(l, "operation").unwrap_or_default().to_owned(),
            caller: field(l, "caller").unwrap_or_default().to_owned(),
            resource: field(l, "resource").unwrap_or_default().to_owned(),
            outcome: field(l, "outcome").unwrap_or_default().to_owned(),
        })
        .collect()
}

fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// Waits until the gateway's log shows no cloud write for `quiet`, at most
/// `limit`; whether it did.
pub async fn quiet(log: &Path, quiet: Duration, limit: Duration) -> bool {
    let start = Instant::now();
    let mut since = Instant::now();
    let mut seen = writes(log, 0).len();
    while start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = writes(log, 0).len();
        if now != seen {
            seen = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return true;
        }
    }
    false
}

/// The run's shared state.
pub struct Run {
    pub sandbox: Arc<tokio::sync::Mutex<Sandbox>>,
    pub handle: Handle,
    pub cloud_dir: PathBuf,
    /// This build's binaries.
    pub new: PathBuf,
    pub upgrade: Upgrade,
    pub spare: Spare,
    pub settled: Arc<Settled>,
    pub started: Instant,
    pub violations: Arc<Mutex<Vec<Violation>>>,
    pub steps: Arc<Mutex<Counts>>,
    /// The ensures a first recording handover was allowed (audit
    /// resource names), which the whole run's audit then allows too.
    pub first_records: Mutex<Vec<String>>,
    /// The gateway's log (its audit lines), and where it stood when the
    /// objects were settled.
    pub log: PathBuf,
    pub audit_from: u64,
}

impl Run {
    fn violation(&self, what: String) {
        tracing::error!(%what, "upgrade");
        self.violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Violation {
                at: self.started.elapsed(),
                what,
            });
    }

    /// Replaces every process of every component, in the order asked.
    pub async fn go(&self) {
        for component in self.upgrade.order.components() {
            if let Err(e) = self.component(component).await {
                self.violation(format!("upgrading {component}: {e:#}"));
            }
        }
        self.restart_leaders().await;
    }

    /// Replaces a component's processes: the replicas that do not lead
    /// first, side by side with the old leader, then the leader, whose
    /// lease goes to a new replica: a handover.
    async fn component(&self, component: &str) -> anyhow::Result<()> {
        let lease = format!("{}-{component}", ccm_sandbox::RELEASE);
        let (mut replicas, leader) = {
            let sandbox = self.sandbox.lock().await;
            let replicas: Vec<String> = sandbox
                .processes()
                .into_iter()
                .filter(|p| {
                    p == component
                        || p.strip_prefix(&format!("{component}-"))
                            .is_some_and(|n| n.parse::<u32>().is_ok())
                })
                .collect();
            let leader = if component == "cloud-gateway" {
                None
            } else {
                sandbox.leader(&lease).await?
            };
            (replicas, leader)
        };
        anyhow::ensure!(!replicas.is_empty(), "no process of {component}");
        // The leader last.
        replicas.sort_by_key(|p| Some(p) == leader.as_ref());
        let last = replicas.pop().expect("not empty");
        for replica in replicas {
            self.sandbox
                .lock()
                .await
                .replace(&replica, &self.new)
                .await?;
            count(&self.steps, format!("{replica} replaced"));
            tokio::time::sleep(self.upgrade.side_by_side).await;
        }
        self.handover(component, &lease, &last, true).await?;
        count(&self.steps, format!("{last} replaced (handover)"));
        tokio::time::sleep(self.upgrade.side_by_side).await;
        Ok(())
    }

    /// Replaces `process` with the churn held and the cloud quiet, and
    /// holds every cloud write in the window after it against it.
    /// `first_recording`: the leader taking over is the first to record
    /// what it made (an upgrade from a release before records), so an
    /// ensure of a Service without a record is allowed, once.
    async fn handover(
        &self,
        component: &str,
        lease: &str,
        process: &str,
        first_recording: bool,
    ) -> anyhow::Result<()> {
        let log = self.log.clone();
        self.spare.paused.store(true, Ordering::SeqCst);
        let result = async {
            let converged = crate::observer::wait_converged(
                &self.handle,
                &self.cloud_dir,
                Duration::from_secs(120),
            )
            .await;
            if let Err(off) = converged {
                anyhow::bail!("not converged before the handover: {off}");
            }
            anyhow::ensure!(
                quiet(&log, Duration::from_secs(5), Duration::from_secs(60)).await,
                "the cloud never went quiet before the handover"
            );
            // A release before the service controller recorded what it made
            // left no record: its Services are ensured once by the first
            // leader that records, and only then settled by record.
            let unrecorded = if first_recording && component == "service-controller" {
                self.unrecorded_load_balancers().await?
            } else {
                BTreeSet::new()
            };
            let before = self.sandbox.lock().await.lease_holder(lease).await?;
            let from = log_len(&log);
            self.sandbox
                .lock()
                .await
                .replace(process, &self.new)
                .await?;
            if component != "cloud-gateway" {
                // The lease moves to a replica of this build (the other,
                // or this one started again).
                let start = Instant::now();
                loop {
                    let holder = self
                        .sandbox
                        .lock()
                        .await
                        .lease_holder(lease)
                        .await
                        .ok()
                        .flatten();
                    if holder.is_some() && holder != before {
                        break;
                    }
                    anyhow::ensure!(
                        start.elapsed() < Duration::from_secs(60),
                        "{lease} did not move off {process}"
                    );
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            tokio::time::sleep(self.upgrade.handover).await;
            for write in writes(&log, from) {
                if write.operation == "ensure_load_balancer" && unrecorded.contains(&write.resource)
                {
                    count(&self.steps, "unrecorded Service ensured once");
                    self.first_records
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(write.resource);
                    continue;
                }
                self.violation(format!(
                    "{component}'s handover wrote to the cloud though everything was settled: \
                     {} {} by {}",
                    write.operation, write.resource, write.caller
                ));
            }
            Ok(())
        }
        .await;
        self.spare.paused.store(false, Ordering::SeqCst);
        result
    }

    /// The audit names of the load balancers whose Services carry no
    /// record of them (`load_balancer/<name>`).
    async fn unrecorded_load_balancers(&self) -> anyhow::Result<BTreeSet<String>> {
        let client = ccm_runtime::kube::client(Some(&self.handle.kubeconfig)).await?;
        let recorded: BTreeSet<String> =
            kube::Api::<k8s_openapi::api::core::v1::Service>::all(client)
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .filter(|s| {
                    s.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(ccm_runtime::names::ANNOTATION_LB_APPLIED))
                })
                .filter_map(|s| s.metadata.uid)
                .collect();
        let snapshot = cloud_snapshot(&self.cloud_dir).await?;
        Ok(snapshot
            .load_balancers
            .into_iter()
            .filter(|lb| !recorded.contains(&lb.service_uid))
            .map(|lb| format!("load_balancer/{}", lb.name))
            .collect())
    }

    /// Each controller's leader replaced once more, by this build's
    /// binary (a rolling restart): every Service now carries its record,
    /// so these handovers must write nothing at all.
    pub async fn restart_leaders(&self) {
        for component in ["node-controller", "service-controller", "route-controller"] {
            let lease = format!("{}-{component}", ccm_sandbox::RELEASE);
            let leader = self.sandbox.lock().await.leader(&lease).await;
            let result = match leader {
                Ok(Some(leader)) => self
                    .handover(component, &lease, &leader, false)
                    .await
                    .map(|()| leader),
                Ok(None) => Err(anyhow::anyhow!("nobody leads {lease}")),
                Err(e) => Err(e),
            };
            match result {
                Ok(leader) => count(&self.steps, format!("{leader} restarted (handover)")),
                Err(e) => self.violation(format!("restarting {component}'s leader: {e:#}")),
            }
        }
    }

    /// What the upgrade did to the settled objects: nothing, checked
    /// against what they were and the gateway's whole audit log.
    pub async fn check_settled(&self) -> anyhow::Result<()> {
        let from = self.audit_from;
        let after =
            Settled::read(&self.handle, &self.cloud_dir, self.settled.names.clone()).await?;
        for change in self.settled.changes(&after) {
            self.violation(change);
        }
        let log = self.log.clone();
        let mut first_records =
            std::mem::take(&mut *self.first_records.lock().unwrap_or_else(|e| e.into_inner()));
        for write in writes(&log, from) {
            // The controllers' writes that took effect: the churn's own
            // (another tool's Service colliding in the name, whose load
            // balancer the audit names by the name they share) are not
            // the upgrade's.
            if write.outcome != "ok"
                || !write.caller.contains("-controller")
                || !self.settled.owns(&write.resource)
            {
                continue;
            }
            // Their load balancers' hosts follow the churn's nodes, and the
            // first recording leader ensures each once; nothing else of
            // theirs may be written.
            if write.operation == "update_load_balancer_hosts" {
                continue;
            }
            if write.operation == "ensure_load_balancer"
                && let Some(i) = first_records.iter().position(|r| *r == write.resource)
            {
                first_records.swap_remove(i);
                continue;
            }
            {
                self.violation(format!(
                    "a settled object was written during the upgrade: {} {} by {}",
                    write.operation, write.resource, write.caller
                ));
            }
        }
        Ok(())
    }
}

/// The gateway log's length now, where the upgrade's audit begins.
pub fn audit_mark(log: &Path) -> u64 {
    let mark = log_len(log);
    tracing::info!(
        mark,
        writes = writes(log, 0).len(),
        "the upgrade's audit begins"
    );
    mark
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_lines_are_read_with_or_without_quotes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("g.log");
        std::fs::write(
            &log,
            "2026-11-27T06:00:00Z  INFO audit: cloud write operation=ensure_load_balancer caller=\"kube-system/ccm-service-controller\" cluster=kubernetes resource=a123 outcome=\"ok\" latency_ms=3\n\
             2026-11-27T06:00:01Z  INFO ccm_calls: something else resource=b\n",
        )
        .unwrap();
        assert_eq!(
            writes(&log, 0),
            vec![Write {
                operation: "ensure_load_balancer".into(),
                caller: "kube-system/ccm-service-controller".into(),
                resource: "a123".into(),
                outcome: "ok".into(),
            }]
        );
        assert!(writes(&log, log_len(&log)).is_empty());
    }

    #[test]
    fn orders_name_every_component_once() {
        for order in [Order::GatewayFirst, Order::ControllersFirst] {
            let set: BTreeSet<_> = order.components().into_iter().collect();
            assert_eq!(set.len(), 4);
        }
        assert_eq!(Order::GatewayFirst.components()[0], "cloud-gateway");
        assert_eq!(Order::ControllersFirst.components()[3], "cloud-gateway");
        assert!("sideways".parse::<Order>().is_err());
    }
}
