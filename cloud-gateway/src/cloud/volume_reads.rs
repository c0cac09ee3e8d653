//! Volume reads, gathered: `GetVolume` calls and the gateway's own waits
//! for volumes and attachments the cloud is still making, for one cluster,
//! that arrive within the batch window or while the batch waits for the
//! budget, are answered by one provider read of many volumes
//! ([`ccm_provider::Volumes::get_many`]), at most the provider's
//! `reads_per_call` IDs a call. A thousand claims
//! provisioned at once then cost the budget a read a second between them,
//! not one a waiter, which is what throttled the EBS driver's controller
//! before it grew batchers of its own.
//!
//! Without coalescing (`--coalesce=false`), with no batch window, or from
//! a provider that reads one volume a call, each read is its own call: the
//! upstream profile the benchmark compares with.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::cloud::budget::Priority;
use crate::cloud::instance_lookups::LookupConfig;
use crate::cloud::{Admitted, Cloud};
use ccm_provider::volumes::Volume;
use ccm_provider::{CloudError, Operation, Result};

type Answer = Result<Option<Volume>>;
type Waiters = Vec<(String, oneshot::Sender<Answer>)>;

/// Reads of volumes, by ID.
pub struct VolumeReads {
    cloud: Arc<Cloud>,
    config: LookupConfig,
    /// The most volumes one provider call reads: the provider's own limit
    /// (`--max-batch` is the instance lookups'), read once: the offer is
    /// fixed, and building it lists every device name.
    per_call: usize,
    /// Reads waiting for their batch, by cluster.
    pending: Mutex<HashMap<String, Waiters>>,
}

impl VolumeReads {
    /// Gathers reads within `config.batch_window` when `config.coalesce`.
    pub fn new(cloud: Arc<Cloud>, config: LookupConfig) -> Arc<Self> {
        let per_call = cloud.volume_offer().map_or(1, |o| o.reads_per_call).max(1);
        Arc::new(Self {
            cloud,
            config,
            per_call,
            pending: Mutex::new(HashMap::new()),
        })
    }

    fn batching(&self) -> bool {
        self.config.coalesce && !self.config.batch_window.is_zero() && self.per_call > 1
    }

    /// The cluster's volume `id`, `None` if there is none.
    pub async fn get(self: &Arc<Self>, cluster: &str, id: &str) -> Answer {
        if !self.batching() {
            return self
                .cloud
                .volumes()?
                .call(Operation::GetVolume, Priority::Normal, None, |v| {
                    v.get(cluster, id)
                })
                .await;
        }
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let waiters = pending.entry(cluster.to_owned()).or_default();
            waiters.push((id.to_owned(), tx));
            waiters.len() == 1
        };
        if first {
            let this = self.clone();
            let cluster = cluster.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(this.config.batch_window).await;
                this.flush(cluster).await;
            });
        }
        rx.await
            .unwrap_or_else(|_| Err(CloudError::Unavailable("the read was dropped".into())))
    }

    /// Answers the cluster's pending reads, at most `per_call` IDs a
    /// provider call, each call sent as soon as the budget admits it.
    async fn flush(self: Arc<Self>, cluster: String) {
        loop {
            // The budget first: reads that arrive while it makes us wait
            // join this batch.
            let admitted = self.cloud.admit(Priority::Normal).await;
            let (batch, more) = self.take(&cluster);
            let this = self.clone();
            let for_batch = cluster.clone();
            tokio::spawn(async move { this.answer(admitted, &for_batch, batch).await });
            if !more {
                return;
            }
        }
    }

    /// The cluster's pending reads of the first `per_call` IDs, and
    /// whether reads of further IDs are left pending.
    fn take(&self, cluster: &str) -> (Waiters, bool) {
        let per_call = self.per_call;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let waiters = pending.remove(cluster).unwrap_or_default();
        let mut ids = BTreeSet::new();
        let (batch, rest): (Waiters, Waiters) = waiters.into_iter().partition(|(id, _)| {
            ids.contains(id) || (ids.len() < per_call && ids.insert(id.clone()))
        });
        let more = !rest.is_empty();
        if more {
            pending.insert(cluster.to_owned(), rest);
        }
        (batch, more)
    }

    /// Reads the volumes of `batch` in one call and answers each read.
    async fn answer(&self, admitted: Result<Admitted>, cluster: &str, batch: Waiters) {
        let ids: Vec<String> = batch
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let read = match (admitted, self.cloud.volumes()) {
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(admitted), Ok(volumes)) => {
                volumes
                    .call_admitted(admitted, Operation::GetVolume, None, |v| {
                        v.get_many(cluster, &ids)
                    })
                    .await
            }
        };
        tracing::debug!(
            cluster,
            reads = batch.len(),
            volumes = ids.len(),
            "volume reads answered by one call"
        );
        let read: Result<HashMap<String, Volume>> =
            read.map(|found| found.into_iter().map(|v| (v.id.clone(), v)).collect());
        for (id, tx) in batch {
            let _ = tx.send(match &read {
                Ok(found) => Ok(found.get(&id).cloned()),
                Err(e) => Err(e.clone()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::budget::{Budget, BudgetConfig};
    use crate::metrics::Metrics;
    use ccm_provider::volumes::VolumeSpec;
    use ccm_provider_sim::SimCloud;
    use std::time::Duration;

    async fn sim_with_volumes(n: usize) -> (Arc<SimCloud>, Vec<String>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimCloud::open(dir.path(), Default::default()).unwrap());
        let mut ids = Vec::new();
        for i in 0..n {
            let spec = VolumeSpec {
                name: format!("pvc-{i}"),
                size_bytes: 1 << 30,
                ..Default::default()
            };
            ids.push(
                ccm_provider::Volumes::create(sim.as_ref(), "c", &spec)
                    .await
                    .unwrap()
                    .id,
            );
        }
        (sim, ids, dir)
    }

    fn reads_of(sim: &SimCloud) -> u64 {
        let (calls, _) = sim.stats(true);
        calls.get(&Operation::GetVolume).copied().unwrap_or(0)
    }

    async fn read_all(config: LookupConfig, n: usize) -> (u64, usize) {
        let (sim, ids, _dir) = sim_with_volumes(n).await;
        let budget = Budget::start(BudgetConfig {
            rate: 1e6,
            burst: 1e6,
            ..BudgetConfig::default()
        });
        let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
        let cloud = Arc::new(Cloud::new(sim.clone(), budget, metrics));
        let reads = VolumeReads::new(cloud, config);
        sim.stats(true);
        let mut tasks = tokio::task::JoinSet::new();
        // Every volume read twice at once, and one that does not exist.
        for id in ids.iter().chain(ids.iter()).chain([&"vol-gone".to_owned()]) {
            let reads = reads.clone();
            let id = id.clone();
            tasks.spawn(async move { reads.get("c", &id).await.unwrap() });
        }
        let mut found = 0;
        while let Some(answer) = tasks.join_next().await {
            found += usize::from(answer.unwrap().is_some());
        }
        (reads_of(&sim), found)
    }

    #[tokio::test]
    async fn reads_in_one_window_are_one_call_per_two_hundred_volumes() {
        // A window long enough that every read is in it on a loaded
        // machine.
        let config = LookupConfig {
            batch_window: Duration::from_millis(300),
            ..Default::default()
        };
        let (calls, found) = read_all(config, 250).await;
        assert_eq!(found, 500, "each read answered with its volume");
        assert_eq!(
            calls, 2,
            "250 volumes read twice and one gone: 200 in one call, 51 in another"
        );
    }

    #[tokio::test]
    async fn without_coalescing_each_read_is_a_call() {
        let config = LookupConfig {
            coalesce: false,
            batch_window: Duration::ZERO,
            max_batch: 1,
            ..Default::default()
        };
        let (calls, found) = read_all(config, 20).await;
        assert_eq!(found, 40);
        assert_eq!(calls, 41, "the upstream profile: one read per waiter");
    }
}
