//! An in-process gateway on loopback with typed clients for every role.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ccm_proto::v1::sim_admin_client::SimAdminClient;
use ccm_proto::v1::{
    CreateInstanceRequest, Host, LoadBalancerSpec, Protocol, ServicePort, ServiceRef, SimInstance,
};
use ccm_proto::{ClientConfig, GatewayClient, RetryPolicy, TokenSource};
use ccm_provider::Provider;
use ccm_provider_sim::SimCloud;
use cloud_gateway::Gateway;
use cloud_gateway::identity::Role;
use cloud_gateway::settings::Settings;
use tokio_util::sync::CancellationToken;

/// Every test awaits with this timeout.
pub const TIMEOUT: Duration = Duration::from_secs(30);

pub struct TestGateway {
    pub gateway: Gateway,
    pub shutdown: CancellationToken,
    pub state_dir: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

pub fn settings(dir: &std::path::Path) -> Settings {
    let mut s = Settings::local(dir);
    // Generous by default so unrelated tests never hit the budget.
    s.budget.rate = 10_000.0;
    s.budget.burst = 10_000.0;
    s
}

impl TestGateway {
    pub async fn start(configure: impl FnOnce(&mut Settings)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut t = Self::start_in(dir.path().to_path_buf(), configure).await;
        t._dir = Some(dir);
        t
    }

    /// Starts on an existing state directory (for restarts).
    pub async fn start_in(state_dir: PathBuf, configure: impl FnOnce(&mut Settings)) -> Self {
        let mut s = settings(&state_dir);
        configure(&mut s);
        let shutdown = CancellationToken::new();
        let gateway = Gateway::start(s, shutdown.clone())
            .await
            .expect("gateway starts");
        Self {
            gateway,
            shutdown,
            state_dir,
            _dir: None,
        }
    }

    pub async fn start_with_provider(provider: Arc<dyn Provider>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let shutdown = CancellationToken::new();
        let gateway = Gateway::start_with(settings(dir.path()), provider, None, shutdown.clone())
            .await
            .expect("gateway starts");
        Self {
            gateway,
            shutdown,
            state_dir: dir.path().to_path_buf(),
            _dir: Some(dir),
        }
    }

    pub fn address(&self) -> String {
        format!("http://{}", self.gateway.grpc_addr)
    }

    pub fn token_file(&self, role: Role) -> PathBuf {
        self.gateway
            .token_file(role)
            .expect("generated token")
            .clone()
    }

    pub fn client(&self, role: Role) -> GatewayClient {
        self.client_with(role, RetryPolicy::default(), "kubernetes")
    }

    pub fn client_with(&self, role: Role, retry: RetryPolicy, cluster: &str) -> GatewayClient {
        let mut config = ClientConfig::new(
            self.address(),
            cluster,
            TokenSource::File(self.token_file(role)),
        );
        config.retry = retry;
        GatewayClient::new(config).expect("client")
    }

    pub fn sim(&self) -> &Arc<SimCloud> {
        self.gateway.sim.as_ref().expect("sim provider")
    }

    pub fn admin(
        &self,
    ) -> SimAdminClient<
        tonic::service::interceptor::InterceptedService<
            tonic::transport::Channel,
            ccm_proto::client::AuthInterceptor,
        >,
    > {
        self.client(Role::Admin).sim_admin().expect("admin client")
    }

    pub async fn create_instance(&self, name: &str) -> SimInstance {
        self.admin()
            .create_instance(CreateInstanceRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .expect("instance created")
            .into_inner()
    }

    /// Provider calls the sim answered for `op` so far.
    pub fn calls(&self, op: ccm_provider::Operation) -> u64 {
        self.sim().stats(false).0.get(&op).copied().unwrap_or(0)
    }

    pub async fn stop(self) -> PathBuf {
        self.shutdown.cancel();
        tokio::time::timeout(TIMEOUT, self.gateway.wait())
            .await
            .expect("gateway stops in time")
            .expect("gateway stops cleanly");
        if let Some(dir) = self._dir {
            // Keep the directory for a restart.
            return dir.keep();
        }
        self.state_dir
    }
}

/// Runs `f` with the test timeout.
pub async fn timed<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .expect("test step timed out")
}

/// The Service of `uid` (named after its first characters).
pub fn service(uid: &str) -> ServiceRef {
    ServiceRef {
        namespace: "default".into(),
        name: format!("svc-{}", &uid[..4]),
        uid: uid.into(),
    }
}

/// A load balancer for the Service of `uid`: one TCP port, 80 to node port
/// 30080.
pub fn spec(uid: &str) -> LoadBalancerSpec {
    LoadBalancerSpec {
        service: Some(service(uid)),
        ports: vec![ServicePort {
            name: "http".into(),
            protocol: Protocol::Tcp as i32,
            port: 80,
            node_port: 30080,
        }],
        ..Default::default()
    }
}

/// A backend host by node name.
pub fn host(name: &str) -> Host {
    Host {
        name: name.into(),
        ..Default::default()
    }
}

/// A Service UID, the `n`th.
pub fn uid(n: u32) -> String {
    format!("{n:08x}-1111-2222-3333-444455556666")
}
