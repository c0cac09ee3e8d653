//! The cluster changing as clusters do, one action at a time: nodes
//! joining, stopping (and coming back), terminated; LoadBalancer Services
//! created, changed, deleted; node labels changed; a kubelet asking for a
//! certificate naming another node's address, which must never be
//! approved; and another tool that names load balancers the same way
//! asking the gateway for one for a made-up Service whose UID differs from
//! a real Service's only in its last hex digit (so the name upstream gives
//! both load balancers is the same), which must never take the real
//! Service's load balancer (see [`Collision`]).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_proto::v1::{
    CreateInstanceRequest, InstanceId, ListInstancesRequest, LoadBalancerSpec, Protocol,
    ServicePort, ServiceRef,
};
use ccm_provider_sim::store::LoadBalancerRecord;
use ccm_sandbox::Handle;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use crate::{Counts, Options, count, rng};

/// The name prefix of the certificates no kubelet may get.
pub const GREEDY: &str = "greedy-";

/// The namespace of the made-up Services the churn asks the gateway for
/// load balancers for. No Service lives there: what the cloud holds for it
/// is the soak's own, not a leak, and the churn deletes it again.
pub const COLLIDE: &str = "soak-collide";

/// One collision round in flight: a made-up Service in [`COLLIDE`] whose
/// UID is a real Service's but for the last hex digit (load balancer names
/// keep only the first 31), asked the gateway for a load balancer. The
/// real Service's load balancer must stay as it was; the made-up one is
/// refused or gets one of its own.
#[derive(Clone, Debug)]
pub struct Collision {
    /// When the round began, after the real Service's load balancer below
    /// was read: a look that began earlier cannot be held to it.
    pub since: Instant,
    /// The real Service: namespace/name, UID, and `metadata.generation`
    /// (a spec change may move its address, as the cloud allows).
    pub service: String,
    pub uid: String,
    pub generation: i64,
    /// Its load balancer when the round began: cluster, name, addresses.
    pub cluster: String,
    pub name: String,
    pub addresses: Vec<IpAddr>,
    /// The made-up Service.
    pub made_up: ServiceRef,
    /// The addresses the gateway answered the made-up Service with, once
    /// it answered.
    pub answered: Option<Vec<String>>,
    /// When its load balancer is to be deleted.
    pub until: Instant,
}

/// The collision rounds in flight, shared with the observer.
pub type Collisions = Arc<Mutex<Vec<Collision>>>;

/// How many churn periods a made-up Service keeps its load balancer, so
/// the observer looks at it several times.
const COLLISION_PERIODS: u32 = 3;

/// What the churn may do, with its weight. Joins and terminations, and
/// creates and deletes, are equally likely, and each is skipped past its
/// bound (half to one and a half times the starting size), so the cluster
/// wanders around its starting size rather than growing: memory over the
/// run then says whether anything leaks, not how big the cluster got.
const ACTIONS: [(&str, u32); 9] = [
    ("node joins", 2),
    ("node stops", 1),
    ("node terminated", 2),
    ("Service created", 2),
    ("Service changed", 2),
    ("Service deleted", 2),
    ("node label changed", 2),
    ("greedy certificate asked", 1),
    ("colliding Service ensured", 2),
];

/// What the churn leaves alone (the version skew run's): Nodes and
/// Services it never stops, terminates, changes, labels or deletes, so
/// their cloud resources stay settled; and a switch that holds it between
/// two actions while a process hands over.
#[derive(Clone, Debug, Default)]
pub struct Spare {
    pub names: Arc<BTreeSet<String>>,
    pub paused: Arc<std::sync::atomic::AtomicBool>,
}

impl Spare {
    fn paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// One churn action every `churn_every` until `over`; then every made-up
/// Service's load balancer is deleted.
pub async fn run(
    handle: Handle,
    cloud_dir: PathBuf,
    options: Options,
    counts: Arc<Mutex<Counts>>,
    collisions: Collisions,
    spare: Spare,
    over: CancellationToken,
) {
    let mut churn = Churn {
        spare,
        handle,
        cloud_dir,
        rng: rng(options.seed, 3),
        next: 0,
        min_nodes: options.nodes.div_ceil(2).max(1),
        max_nodes: (options.nodes * 3).div_ceil(2).max(2),
        min_services: options.services.div_ceil(2).max(1),
        max_services: (options.services * 3).div_ceil(2).max(2),
        counts,
        collisions,
        collision_for: options.churn_every * COLLISION_PERIODS,
    };
    let total: u32 = ACTIONS.iter().map(|(_, w)| w).sum();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(options.churn_every) => {}
            _ = over.cancelled() => break,
        }
        // Held: rounds that are due still end (the cloud must settle), but
        // nothing new begins.
        churn.end_collisions(Instant::now()).await;
        if churn.spare.paused() {
            continue;
        }
        let mut pick = churn.rng.u32(0..total);
        let action = ACTIONS
            .iter()
            .find(|(_, w)| {
                if pick < *w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map_or("node joins", |(a, _)| a);
        // The API server or the gateway may be down or frozen: an action
        // that cannot be done is skipped, not counted.
        match tokio::time::timeout(Duration::from_secs(20), churn.act(action)).await {
            Ok(Ok(true)) => count(&churn.counts, action),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::debug!(action, error = %e, "churn action not done"),
            Err(_) => tracing::debug!(action, "churn action timed out"),
        }
    }
    // Every round is due now. The gateway may still be starting again, or
    // the cloud failing, for a while after the chaos.
    let give_up = Instant::now() + Duration::from_secs(90);
    while Instant::now() < give_up && churn.end_collisions(give_up).await > 0 {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

struct Churn {
    spare: Spare,
    handle: Handle,
    cloud_dir: PathBuf,
    rng: fastrand::Rng,
    /// The next number for a new node, Service or certificate.
    next: u64,
    min_nodes: usize,
    max_nodes: usize,
    min_services: usize,
    max_services: usize,
    counts: Arc<Mutex<Counts>>,
    collisions: Collisions,
    /// How long a made-up Service keeps its load balancer.
    collision_for: Duration,
}

impl Churn {
    async fn client(&self) -> anyhow::Result<kube::Client> {
        ccm_runtime::kube::client(Some(&self.handle.kubeconfig)).await
    }

    async fn nodes(&self) -> anyhow::Result<Vec<Node>> {
        Ok(Api::<Node>::all(self.client().await?)
            .list(&Default::default())
            .await?
            .items)
    }

    async fn load_balancers(&self) -> anyhow::Result<Vec<Service>> {
        Ok(Api::<Service>::namespaced(self.client().await?, "default")
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .filter(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"))
            .collect())
    }

    /// The objects the churn may act on: all but those it spares.
    fn unspared<'a, K: kube::Resource>(&self, objects: &'a [K]) -> Vec<&'a K> {
        objects
            .iter()
            .filter(|o| {
                !o.meta()
                    .name
                    .as_ref()
                    .is_some_and(|name| self.spare.names.contains(name))
            })
            .collect()
    }

    fn number(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Does `action`; whether it was done.
    async fn act(&mut self, action: &str) -> anyhow::Result<bool> {
        // A stopped node comes back on its own a minute later, whenever
        // that is: not while the run wants the cloud quiet.
        if action == "node stops" && !self.spare.names.is_empty() {
            return Ok(false);
        }
        match action {
            "node joins" => self.join().await,
            "node stops" => self.stop().await,
            "node terminated" => self.terminate().await,
            "Service created" => self.create_service().await,
            "Service changed" => self.change_service().await,
            "Service deleted" => self.delete_service().await,
            "node label changed" => self.label_node().await,
            "colliding Service ensured" => self.collide().await,
            _ => self.greedy_certificate().await,
        }
    }

    async fn join(&mut self) -> anyhow::Result<bool> {
        let nodes = self.nodes().await?;
        if nodes.len() >= self.max_nodes {
            return Ok(false);
        }
        let Some(cidr) = free_pod_cidr(&nodes, &self.cloud_dir) else {
            return Ok(false);
        };
        let name = format!("soak-node-{}", self.number());
        let instance = self
            .handle
            .gateway_client("admin")?
            .sim_admin()?
            .create_instance(CreateInstanceRequest {
                name: name.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        ccm_sandbox::register_node(
            &self.client().await?,
            &name,
            &ccm_sandbox::Kubelet::of(&instance, &cidr),
        )
        .await?;
        Ok(true)
    }

    /// A node's instance, chosen at random among the running ones the
    /// churn does not spare, while more than the minimum run.
    async fn running_victim(&mut self) -> anyhow::Result<Option<String>> {
        let running: Vec<String> = self
            .handle
            .gateway_client("admin")?
            .sim_admin()?
            .list_instances(ListInstancesRequest {})
            .await?
            .into_inner()
            .instances
            .into_iter()
            .filter(|i| i.state == ccm_proto::v1::InstanceState::Running as i32)
            .map(|i| i.name)
            .collect();
        if running.len() <= self.min_nodes {
            return Ok(None);
        }
        let names = self.spare.names.clone();
        Ok(self.rng.choice(
            running
                .into_iter()
                .filter(|name| !names.contains(name))
                .collect::<Vec<_>>(),
        ))
    }

    /// Stops an instance, and starts it again a minute or so later.
    async fn stop(&mut self) -> anyhow::Result<bool> {
        let Some(name) = self.running_victim().await? else {
            return Ok(false);
        };
        let mut admin = self.handle.gateway_client("admin")?.sim_admin()?;
        admin.stop_instance(InstanceId { id: name.clone() }).await?;
        let back_in = Duration::from_secs(self.rng.u64(30..=90));
        let counts = self.counts.clone();
        tokio::spawn(async move {
            tokio::time::sleep(back_in).await;
            for _ in 0..30 {
                match admin.start_instance(InstanceId { id: name.clone() }).await {
                    Ok(_) => return count(&counts, "node started again"),
                    // Terminated meanwhile: nothing to start.
                    Err(e) if e.code() == tonic::Code::NotFound => return,
                    Err(_) => tokio::time::sleep(Duration::from_secs(2)).await,
                }
            }
        });
        Ok(true)
    }

    async fn terminate(&mut self) -> anyhow::Result<bool> {
        let Some(name) = self.running_victim().await? else {
            return Ok(false);
        };
        self.handle
            .gateway_client("admin")?
            .sim_admin()?
            .terminate_instance(InstanceId { id: name })
            .await?;
        Ok(true)
    }

    async fn create_service(&mut self) -> anyhow::Result<bool> {
        if self.load_balancers().await?.len() >= self.max_services {
            return Ok(false);
        }
        let name = format!("soak-svc-{}", self.number());
        Api::<Service>::namespaced(self.client().await?, "default")
            .create(
                &PostParams::default(),
                &kube_test_apiserver::fixtures::load_balancer("default", &name).build(),
            )
            .await?;
        Ok(true)
    }

    /// Adds a second port to a Service, or takes it away.
    async fn change_service(&mut self) -> anyhow::Result<bool> {
        let services = self.load_balancers().await?;
        let Some(svc) = self.rng.choice(self.unspared(&services)) else {
            return Ok(false);
        };
        let name = svc.metadata.name.clone().unwrap_or_default();
        let mut ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        if ports.len() > 1 {
            ports.truncate(1);
        } else {
            ports.push(k8s_openapi::api::core::v1::ServicePort {
                name: Some("https".into()),
                port: 443,
                protocol: Some("TCP".into()),
                ..Default::default()
            });
            if let Some(first) = ports.first_mut()
                && first.name.is_none()
            {
                first.name = Some("http".into());
            }
        }
        let patch = serde_json::json!({"spec": {"ports": ports}});
        Api::<Service>::namespaced(self.client().await?, "default")
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(true)
    }

    async fn delete_service(&mut self) -> anyhow::Result<bool> {
        let services = self.load_balancers().await?;
        if services.len() <= self.min_services {
            return Ok(false);
        }
        let Some(name) = self
            .rng
            .choice(self.unspared(&services))
            .and_then(|s| s.metadata.name.clone())
        else {
            return Ok(false);
        };
        Api::<Service>::namespaced(self.client().await?, "default")
            .delete(&name, &DeleteParams::default())
            .await?;
        Ok(true)
    }

    async fn label_node(&mut self) -> anyhow::Result<bool> {
        let nodes = self.nodes().await?;
        let Some(name) = self
            .rng
            .choice(self.unspared(&nodes))
            .and_then(|n| n.metadata.name.clone())
        else {
            return Ok(false);
        };
        let round = self.number().to_string();
        let patch = serde_json::json!({"metadata": {"labels": {"soak.example.com/round": round}}});
        Api::<Node>::all(self.client().await?)
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(true)
    }

    /// As one node's kubelet, asks for a serving certificate that names
    /// another node's address.
    async fn greedy_certificate(&mut self) -> anyhow::Result<bool> {
        let nodes = self.nodes().await?;
        if nodes.len() < 2 {
            return Ok(false);
        }
        let i = self.rng.usize(0..nodes.len());
        let j = (i + 1 + self.rng.usize(0..nodes.len() - 1)) % nodes.len();
        let (asker, other) = (&nodes[i], &nodes[j]);
        let name = asker.metadata.name.clone().unwrap_or_default();
        let addresses = |n: &Node| -> Vec<NodeAddress> {
            n.status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default()
        };
        let mut asked = addresses(asker);
        asked.extend(
            addresses(other)
                .into_iter()
                .filter(|a| a.type_ == "InternalIP"),
        );
        let csr_name = format!("{GREEDY}{}", self.number());
        let csr = ccm_sandbox::serving_csr(&csr_name, &name, &asked)?;
        Api::<CertificateSigningRequest>::all(self.handle.kubelet_client(&name).await?)
            .create(&PostParams::default(), &csr)
            .await?;
        Ok(true)
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, Vec<Collision>> {
        self.collisions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// As another tool that names load balancers as upstream does: picks a
    /// LoadBalancer Service that has its load balancer, and asks the
    /// gateway for one for a made-up Service whose UID collides with it in
    /// the name. One round at a time. A refusal is counted as such; an
    /// answer the cloud could not give (the gateway down, a fault window)
    /// is not counted, but the load balancer is deleted all the same, in
    /// case the call went through.
    async fn collide(&mut self) -> anyhow::Result<bool> {
        if !self.rounds().is_empty() {
            return Ok(false);
        }
        let services = self.load_balancers().await?;
        let cloud_dir = self.cloud_dir.clone();
        let cloud =
            tokio::task::spawn_blocking(move || ccm_provider_sim::store::Store::read(&cloud_dir))
                .await??;
        let cluster = self.handle.cluster.clone();
        let picked: Vec<(&Service, &LoadBalancerRecord)> = services
            .iter()
            .filter_map(|s| {
                let uid = s.metadata.uid.as_deref()?;
                let lb = cloud
                    .load_balancers
                    .iter()
                    .find(|lb| lb.cluster == cluster && lb.service_uid == uid)?;
                Some((s, lb))
            })
            .collect();
        let Some((service, lb)) = self.rng.choice(picked) else {
            return Ok(false);
        };
        let uid = service.metadata.uid.clone().unwrap_or_default();
        let Some(made_up_uid) = colliding_uid(&uid, self.rng.u8(1..16)) else {
            return Ok(false);
        };
        let name = service.metadata.name.clone().unwrap_or_default();
        let made_up = ServiceRef {
            namespace: COLLIDE.into(),
            name: name.clone(),
            uid: made_up_uid,
        };
        let now = Instant::now();
        self.rounds().push(Collision {
            since: now,
            service: format!(
                "{}/{name}",
                service.metadata.namespace.as_deref().unwrap_or_default()
            ),
            uid,
            generation: service.metadata.generation.unwrap_or_default(),
            cluster,
            name: lb.name.clone(),
            addresses: lb.addresses.clone(),
            made_up: made_up.clone(),
            answered: None,
            until: now + self.collision_for,
        });
        let spec = LoadBalancerSpec {
            service: Some(made_up.clone()),
            ports: vec![ServicePort {
                name: "http".into(),
                protocol: Protocol::Tcp as i32,
                port: 80,
                node_port: 0,
            }],
            ..Default::default()
        };
        let answer = self
            .handle
            .gateway_client("admin")?
            .ensure_load_balancer(spec, Vec::new())
            .await;
        match answer {
            Ok(status) => {
                let ips = status.ingress.into_iter().map(|i| i.ip).collect();
                if let Some(round) = self.rounds().iter_mut().find(|r| r.made_up == made_up) {
                    round.answered = Some(ips);
                }
                Ok(true)
            }
            Err(e) if refused(&e) => {
                tracing::info!(service = %made_up.name, error = %e, "colliding Service refused");
                count(&self.counts, "colliding Service refused");
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the load balancers of the made-up Services whose time is up
    /// by `by`; returns how many rounds are left.
    async fn end_collisions(&mut self, by: Instant) -> usize {
        let due: Vec<ServiceRef> = self
            .rounds()
            .iter()
            .filter(|r| r.until <= by)
            .map(|r| r.made_up.clone())
            .collect();
        for made_up in due {
            let Ok(client) = self.handle.gateway_client("admin") else {
                continue;
            };
            let delete = client.delete_load_balancer(made_up.clone());
            match tokio::time::timeout(Duration::from_secs(20), delete).await {
                Ok(Ok(())) => {
                    self.rounds().retain(|r| r.made_up != made_up);
                    count(&self.counts, "colliding Service deleted");
                }
                Ok(Err(e)) => {
                    tracing::debug!(service = %made_up.name, error = %e, "colliding Service not deleted yet");
                }
                Err(_) => {
                    tracing::debug!(service = %made_up.name, "colliding Service's delete timed out")
                }
            }
        }
        self.rounds().len()
    }
}

/// `uid` with its last hex digit moved on by `step` (1 to 15): a UID that
/// differs from `uid` only where load balancer names no longer look.
fn colliding_uid(uid: &str, step: u8) -> Option<String> {
    let (at, last) = uid.char_indices().last()?;
    let digit = last.to_digit(16)?;
    let other = (digit + u32::from(step % 16)) % 16;
    (other != digit).then(|| format!("{}{other:x}", &uid[..at]))
}

/// Whether the gateway refused the made-up Service a load balancer, as
/// opposed to not answering (down, failing, throttled, provisioning).
fn refused(e: &ccm_proto::Error) -> bool {
    matches!(
        e,
        ccm_proto::Error::AlreadyExists { .. }
            | ccm_proto::Error::InvalidArgument { .. }
            | ccm_proto::Error::Other {
                code: tonic::Code::FailedPrecondition,
                ..
            }
    )
}

/// A /24 of the cluster CIDR that no Node has and no cloud route points
/// at, so no route can ever be mistaken for another node's.
fn free_pod_cidr(nodes: &[Node], cloud_dir: &Path) -> Option<String> {
    let cloud = ccm_provider_sim::store::Store::read(cloud_dir).ok()?;
    let taken: BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| n.spec.as_ref()?.pod_cidr.clone())
        .chain(cloud.routes.into_iter().map(|r| r.destination_cidr))
        .collect();
    (0..=255)
        .map(|i| format!("10.244.{i}.0/24"))
        .find(|c| !taken.contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_colliding_uid_differs_only_in_its_last_hex_digit() {
        let uid = "1234abcd-12ab-34cd-56ef-1234567890ab";
        let cases = [
            (1, Some("1234abcd-12ab-34cd-56ef-1234567890ac")),
            (5, Some("1234abcd-12ab-34cd-56ef-1234567890a0")),
            (15, Some("1234abcd-12ab-34cd-56ef-1234567890aa")),
            (16, None),
        ];
        for (step, want) in cases {
            assert_eq!(colliding_uid(uid, step).as_deref(), want, "step {step}");
        }
        assert_eq!(colliding_uid("not-hex-z", 1), None);
        assert_eq!(colliding_uid("", 1), None);
    }
}
