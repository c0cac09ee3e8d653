//! The start-up every controller shares: the Kubernetes and gateway
//! clients, its metrics registry behind the admin server, its identity and
//! leader election, and its event recorder; and the handle of a started
//! controller.

use std::net::SocketAddr;

use anyhow::Context as _;
use ccm_proto::GatewayClient;
use kube::runtime::events::{Recorder, Reporter};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::Readiness;
use crate::common_args::Common;
use crate::leader::Leadership;
use crate::metrics::LeaderGauge;

/// How long a stopping controller waits for its lease to be released.
const LEASE_RELEASE: std::time::Duration = std::time::Duration::from_secs(3);

/// What a controller has once started, before its own work begins.
pub struct Base<M> {
    pub client: kube::Client,
    pub gateway: GatewayClient,
    pub metrics: M,
    /// Set when the controller's caches have synced.
    pub readiness: Readiness,
    pub admin_addr: SocketAddr,
    pub leadership: Leadership,
    /// Events reported as `controller`, instance = this replica's identity.
    pub recorder: Recorder,
}

impl<M> Base<M> {
    /// Builds the clients, registers `metrics`, serves the admin endpoints
    /// and starts leader election, which ends with `shutdown`.
    pub async fn start(
        common: &Common,
        controller: &str,
        metrics: impl FnOnce(&mut Registry) -> M,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Self> {
        let client = crate::kube::client(common.kubeconfig.as_deref()).await?;
        let gateway = crate::gateway::client(&common.gateway)?;
        let identity = crate::leader::default_identity();
        let leadership = crate::leader::start(
            client.clone(),
            &common.lease,
            identity.clone(),
            shutdown.clone(),
        );
        let mut registry = Registry::default();
        let metrics = metrics(&mut registry);
        registry
            .sub_registry_with_label(("lease".into(), common.lease.name.clone().into()))
            .register(
                "ccm_controller_leader",
                "1 while this replica holds the controller's lease (named by the label), else 0",
                LeaderGauge(leadership.clone()),
            );
        let readiness = Readiness::new();
        let admin_addr = crate::admin::spawn(common.admin_listen, registry, readiness.clone())
            .await
            .with_context(|| format!("bind admin address {}", common.admin_listen))?;
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: controller.into(),
                instance: Some(identity),
            },
        );
        Ok(Self {
            client,
            gateway,
            metrics,
            readiness,
            admin_addr,
            leadership,
            recorder,
        })
    }

    /// The handle of the controller whose work is `task`.
    pub fn running(&self, task: JoinHandle<anyhow::Result<()>>) -> Running {
        Running {
            admin_addr: self.admin_addr,
            leadership: self.leadership.clone(),
            task,
        }
    }
}

/// A started controller.
pub struct Running {
    /// The admin server's address.
    pub admin_addr: SocketAddr,
    /// Its leadership, for tests and status.
    pub leadership: Leadership,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Waits until the controller stops: `Ok` after shutdown, an error if it
    /// lost its lease or failed.
    pub async fn wait(self) -> anyhow::Result<()> {
        let result = self.task.await.context("controller task");
        // A leader that is shutting down hands its lease over first.
        self.leadership.ended(LEASE_RELEASE).await;
        result?
    }
}
