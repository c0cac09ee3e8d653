//! Scenario 13: a thousand claims at once. The harness plays the
//! external-provisioner and the external-attacher against the volume
//! controller's CSI socket (the real binary, on the sandbox): every volume
//! created, then attached to one of the instances, each sidecar with its
//! default 100 workers... and its retry on any error, doubling from 1 s.
//! The sim takes a few seconds to make each volume and each attachment,
//! as a cloud does. Counted: the time until every volume is attached, and
//! the cloud calls it took. The upstream profile reads each waiting volume
//! on its own, as the EBS driver's controller did before its batchers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccm_proto::csi::controller_client::ControllerClient;
use ccm_proto::csi::{self, volume_capability};
use ccm_proto::v1::{CreateInstanceRequest, Faults};
use tokio::sync::Semaphore;
use tonic::transport::Channel;

use crate::{Harness, Profile, Row, all_operations};

/// How long the sim takes to make a volume, and to attach one.
const MAKING: Duration = Duration::from_secs(3);

/// The sidecars' workers: the external-provisioner's default
/// `--worker-threads`, and the same for the attacher.
const WORKERS: usize = 100;

/// The sidecars' `--timeout` for one CSI call: the provisioner's, the
/// attacher's.
const PROVISION_TIMEOUT: Duration = Duration::from_secs(10);
const ATTACH_TIMEOUT: Duration = Duration::from_secs(15);

/// The sidecars' first retry delay, doubled on each failure up to...
const RETRY_START: Duration = Duration::from_secs(1);
/// ...this (theirs go up to 5 minutes).
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The volumes an instance holds here (the sim takes 26).
const PER_INSTANCE: usize = 20;

/// What one profile's run measured.
struct Measured {
    seconds: f64,
    /// Volume calls the cloud answered, all of them.
    calls: f64,
    /// Of those, reads (volumes and an instance's devices).
    reads: f64,
    /// CSI calls the sidecars had to make again.
    retries: f64,
}

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
    }
}

/// Calls `call` until it answers, as a sidecar's work queue does: each
/// attempt within `timeout`, the next after a delay doubling from
/// [`RETRY_START`]. Counts the attempts past the first in `retries`.
async fn until_answered<T, F, Fut>(
    timeout: Duration,
    retries: &AtomicU64,
    deadline: Instant,
    mut call: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut delay = RETRY_START;
    loop {
        match tokio::time::timeout(timeout, call()).await {
            Ok(Ok(answer)) => return Ok(answer.into_inner()),
            Ok(Err(status)) if Instant::now() >= deadline => {
                anyhow::bail!("still failing at the limit: {status}")
            }
            _ if Instant::now() >= deadline => anyhow::bail!("still timing out at the limit"),
            _ => {}
        }
        retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// Creates volume `i` and attaches it to `instance`, as the two sidecars
/// would for one claim and the Pod using it.
async fn claim(
    channel: Channel,
    (provision, attach): (Arc<Semaphore>, Arc<Semaphore>),
    i: usize,
    instance: String,
    retries: Arc<AtomicU64>,
    deadline: Instant,
) -> anyhow::Result<()> {
    let volume_id = {
        let _worker = provision.acquire().await?;
        let request = csi::CreateVolumeRequest {
            name: format!("pvc-bench-{i:05}"),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability()],
            ..Default::default()
        };
        until_answered(PROVISION_TIMEOUT, &retries, deadline, || {
            let (channel, request) = (channel.clone(), request.clone());
            async move { ControllerClient::new(channel).create_volume(request).await }
        })
        .await?
        .volume
        .map(|v| v.volume_id)
        .unwrap_or_default()
    };
    let _worker = attach.acquire().await?;
    let request = csi::ControllerPublishVolumeRequest {
        volume_id,
        node_id: instance,
        volume_capability: Some(capability()),
        ..Default::default()
    };
    until_answered(ATTACH_TIMEOUT, &retries, deadline, || {
        let (channel, request) = (channel.clone(), request.clone());
        async move {
            ControllerClient::new(channel)
                .controller_publish_volume(request)
                .await
        }
    })
    .await?;
    Ok(())
}

impl Harness {
    /// Scenario 13: `n` volumes provisioned and attached at once.
    pub(crate) async fn volumes_at_once(&mut self, n: usize) -> anyhow::Result<Vec<Row>> {
        let instances = n.div_ceil(PER_INSTANCE);
        let mut measured = Vec::new();
        for profile in [Profile::Ours, Profile::Upstream] {
            measured.push(self.claims(profile, n, instances).await?);
        }
        let scenario = format!(
            "13. {n} volumes provisioned and attached at once, {PER_INSTANCE} an instance; the cloud takes {} s to make each and {} s to attach it",
            MAKING.as_secs(),
            MAKING.as_secs()
        );
        // Each volume made and attached once, each instance's devices read
        // once, within the budget; then the last one's making and
        // attaching.
        let least = (2 * n + instances) as f64;
        let latency = self.cloud.latency.as_secs_f64();
        let limit = self.budget_secs(least) + 2.0 * (MAKING.as_secs_f64() + latency);
        let pick = |f: fn(&Measured) -> f64| (f(&measured[0]), f(&measured[1]));
        let (time, calls, reads, retries) = (
            pick(|m| m.seconds),
            pick(|m| m.calls),
            pick(|m| m.reads),
            pick(|m| m.retries),
        );
        let row = |metric: &str, (ours, upstream): (f64, f64), unit, limit, note: &str| Row {
            scenario: scenario.clone(),
            metric: metric.to_owned(),
            ours,
            upstream: Some(upstream),
            unit,
            limit,
            target: None,
            note: note.to_owned(),
        };
        Ok(vec![
            row(
                "time until every volume is attached",
                time,
                "s",
                Some(limit),
                "the limit: one create and one attach a volume and one devices read an instance within the budget, then 3 s making and 3 s attaching",
            ),
            row(
                "volume calls to the cloud",
                calls,
                "calls",
                Some(least),
                "creates, attaches and reads; the limit: one create and one attach a volume, one devices read an instance",
            ),
            row(
                "of those, reads (volumes, an instance's devices)",
                reads,
                "calls",
                None,
                "ours: the reads of every waiting volume in one call a second, 200 volumes a call; the upstream profile: one read a waiter a second, an instance's devices before each attach",
            ),
            row(
                "CSI calls made again (an error or a timeout)",
                retries,
                "calls",
                None,
                "each a sidecar retry, doubling from 1 s",
            ),
        ])
    }

    async fn claims(
        &mut self,
        profile: Profile,
        n: usize,
        instances: usize,
    ) -> anyhow::Result<Measured> {
        self.volumes_next = true;
        // One zone, so any volume attaches to any instance.
        let run = self
            .start(
                profile,
                1,
                &[("cloud-gateway", "--sim-zones=sim-zone-a".to_owned())],
            )
            .await?;
        let mut admin = run.sandbox.admin()?.sim_admin()?;
        let mut ids = Vec::new();
        for i in 0..instances {
            let made = admin
                .create_instance(CreateInstanceRequest {
                    name: format!("volumes-{i}"),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let id = made.provider_id.rsplit('/').next().unwrap_or_default();
            ids.push(id.to_owned());
        }
        let making = Some(prost_types::Duration {
            seconds: MAKING.as_secs() as i64,
            nanos: 0,
        });
        run.set_faults(Faults {
            latency: all_operations(self.cloud.latency),
            volume_create_delay: making,
            volume_attach_delay: making,
            ..Default::default()
        })
        .await?;
        let socket = run
            .sandbox
            .endpoints
            .get("csi_socket")
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the sandbox names no csi_socket"))?;
        let channel = ccm_sandbox::csi_node::channel(socket.as_ref()).await?;
        run.stats(true).await?;
        let workers = (
            Arc::new(Semaphore::new(WORKERS)),
            Arc::new(Semaphore::new(WORKERS)),
        );
        let retries = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = started + self.sizes.limit;
        let mut claims = tokio::task::JoinSet::new();
        for i in 0..n {
            claims.spawn(claim(
                channel.clone(),
                workers.clone(),
                i,
                ids[i % ids.len()].clone(),
                retries.clone(),
                deadline,
            ));
        }
        while let Some(done) = claims.join_next().await {
            done??;
        }
        let seconds = started.elapsed().as_secs_f64();
        let stats = run.stats(false).await?;
        let of = |ops: &[&str]| -> f64 {
            ops.iter()
                .map(|op| stats.get(*op).copied().unwrap_or(0))
                .sum::<u64>() as f64
        };
        let reads = of(&["get_volume", "volume_devices", "list_volumes"]);
        let measured = Measured {
            seconds,
            calls: reads + of(&["create_volume", "attach_volume"]),
            reads,
            retries: retries.load(Ordering::Relaxed) as f64,
        };
        run.sandbox.stop().await;
        Ok(measured)
    }
}
