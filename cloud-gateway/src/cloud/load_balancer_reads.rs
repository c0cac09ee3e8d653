//! Load balancer status reads, batched: `GetLoadBalancer` calls for one
//! cluster that arrive within the batch window, or while the batch waits
//! for the budget, are answered from a single provider listing. A burst of
//! Services waiting for their load balancers to finish provisioning then
//! costs the budget a few calls, not one per Service.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::cloud::Cloud;
use crate::cloud::budget::Priority;
use crate::cloud::instance_lookups::LookupConfig;
use ccm_provider::{CloudError, LoadBalancer, LoadBalancerStatus, Operation, Result, ServiceRef};

type Answer = Result<Option<LoadBalancerStatus>>;
type Waiters = Vec<(ServiceRef, oneshot::Sender<Answer>)>;

/// Reads of load balancer status.
pub struct LoadBalancerReads {
    cloud: Arc<Cloud>,
    config: LookupConfig,
    pending: Mutex<HashMap<String, Waiters>>,
}

impl LoadBalancerReads {
    /// Batches reads within `config.batch_window` when `config.coalesce`.
    pub fn new(cloud: Arc<Cloud>, config: LookupConfig) -> Arc<Self> {
        Arc::new(Self {
            cloud,
            config,
            pending: Mutex::new(HashMap::new()),
        })
    }

    fn batching(&self) -> bool {
        self.config.coalesce && !self.config.batch_window.is_zero()
    }

    /// The status of `service`'s load balancer, `None` if there is none.
    pub async fn get(self: &Arc<Self>, cluster: &str, service: ServiceRef) -> Answer {
        if !self.batching() {
            return self.get_one(cluster, &service).await;
        }
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let waiters = pending.entry(cluster.to_owned()).or_default();
            waiters.push((service, tx));
            waiters.len() == 1
        };
        if first {
            let this = self.clone();
            let cluster = cluster.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(this.config.batch_window).await;
                this.flush(&cluster).await;
            });
        }
        rx.await
            .unwrap_or_else(|_| Err(CloudError::Unavailable("the read was dropped".into())))
    }

    async fn get_one(&self, cluster: &str, service: &ServiceRef) -> Answer {
        self.cloud
            .load_balancers()?
            .call(Operation::GetLoadBalancer, Priority::Normal, None, |lbs| {
                lbs.get(cluster, service)
            })
            .await
    }

    async fn flush(&self, cluster: &str) {
        // The budget first: reads that arrive while it makes us wait join
        // this batch.
        let admitted = self.cloud.admit(Priority::Normal).await;
        let waiters = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(cluster)
            .unwrap_or_default();
        let listed = match (admitted, self.cloud.load_balancers(), waiters.as_slice()) {
            (Err(e), _, _) | (_, Err(e), _) => Err(e),
            (Ok(admitted), Ok(lbs), [(service, _)]) => {
                let answer = lbs
                    .call_admitted(admitted, Operation::GetLoadBalancer, None, |lbs| {
                        lbs.get(cluster, service)
                    })
                    .await;
                if let Some((_, tx)) = waiters.into_iter().next() {
                    let _ = tx.send(answer);
                }
                return;
            }
            (Ok(admitted), Ok(lbs), _) => {
                lbs.call_admitted(admitted, Operation::ListLoadBalancers, None, |lbs| {
                    lbs.list(cluster)
                })
                .await
            }
        };
        tracing::debug!(
            cluster,
            reads = waiters.len(),
            "load balancer reads answered by one listing"
        );
        // By UID: a load balancer listed under a Service's name may be
        // another Service's.
        let listed: Result<HashMap<String, Vec<LoadBalancer>>> = listed.map(|lbs| {
            let mut by_uid: HashMap<String, Vec<LoadBalancer>> = HashMap::new();
            for lb in lbs {
                by_uid.entry(lb.service.uid.clone()).or_default().push(lb);
            }
            by_uid
        });
        for (service, tx) in waiters {
            let answer = match &listed {
                Ok(by_uid) => Ok([service.uid.as_str(), ""]
                    .iter()
                    .filter_map(|uid| by_uid.get(*uid))
                    .flatten()
                    .find(|lb| lb.serves(&service))
                    .map(|lb| lb.status.clone())),
                Err(e) => Err(e.clone()),
            };
            let _ = tx.send(answer);
        }
    }
}
