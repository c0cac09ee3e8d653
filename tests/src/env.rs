//! A whole test environment in one process: the Kubernetes API test
//! server, a cloud gateway on the simulated cloud, a kubeconfig, and a
//! token per role; controllers under test are started against it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ccm_proto::v1::sim_admin_client::SimAdminClient;
use ccm_proto::v1::{CreateInstanceRequest, SimInstance};
use ccm_proto::{ClientConfig, GatewayClient, TokenSource};
use ccm_provider::Operation;
use ccm_provider_sim::SimCloud;
use cloud_gateway::Gateway;
use cloud_gateway::identity::Role;
use cloud_gateway::settings::Settings as GatewaySettings;
use tokio_util::sync::CancellationToken;

use kube_test_apiserver::ApiServer;

/// Every test step waits at most this long.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The API server, the gateway and the files controllers need.
pub struct TestEnv {
    pub api: ApiServer,
    pub gateway: Gateway,
    pub kubeconfig: PathBuf,
    gateway_shutdown: CancellationToken,
    dir: tempfile::TempDir,
}

/// The SimAdmin client type.
pub type SimAdmin = SimAdminClient<ccm_proto::AuthorizedChannel>;

impl TestEnv {
    /// Starts everything with default gateway settings (a generous budget).
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts everything; `configure` adjusts the gateway's settings.
    pub async fn start_with(configure: impl FnOnce(&mut GatewaySettings)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let api = ApiServer::start().await.expect("API server starts");
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)
            .expect("kubeconfig written");
        let mut settings = GatewaySettings::local(dir.path().join("gateway"));
        settings.budget.rate = 10_000.0;
        settings.budget.burst = 10_000.0;
        configure(&mut settings);
        let gateway_shutdown = CancellationToken::new();
        let gateway = Gateway::start(settings, gateway_shutdown.clone())
            .await
            .expect("gateway starts");
        Self {
            api,
            gateway,
            kubeconfig,
            gateway_shutdown,
            dir,
        }
    }

    /// A scratch directory that lives as long as the environment.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// `http://addr` of the gateway.
    pub fn gateway_url(&self) -> String {
        format!("http://{}", self.gateway.grpc_addr)
    }

    /// The token file of `role`.
    pub fn token_file(&self, role: Role) -> PathBuf {
        self.gateway
            .token_file(role)
            .expect("generated token")
            .clone()
    }

    /// The flags every controller needs to reach this environment, with
    /// `role`'s token; leader election off unless asked for.
    pub fn controller_flags(&self, role: Role) -> Vec<String> {
        vec![
            "--kubeconfig".into(),
            self.kubeconfig.display().to_string(),
            "--gateway-address".into(),
            self.gateway_url(),
            "--gateway-token-file".into(),
            self.token_file(role).display().to_string(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--leader-elect=false".into(),
        ]
    }

    /// Every Event with `reason`.
    pub async fn events(&self, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        events(&self.client().await, reason).await
    }

    /// A kube client.
    pub async fn client(&self) -> kube::Client {
        self.api.client().await.expect("kube client")
    }

    /// A gateway client with `role`'s token.
    pub fn gateway_client(&self, role: Role) -> GatewayClient {
        GatewayClient::new(ClientConfig::new(
            self.gateway_url(),
            "kubernetes",
            TokenSource::File(self.token_file(role)),
        ))
        .expect("gateway client")
    }

    /// The SimAdmin client.
    pub fn sim_admin(&self) -> SimAdmin {
        self.gateway_client(Role::Admin)
            .sim_admin()
            .expect("admin client")
    }

    /// The simulated cloud itself.
    pub fn sim(&self) -> &Arc<SimCloud> {
        self.gateway.sim.as_ref().expect("sim provider")
    }

    /// Provider calls of `op` so far.
    pub fn calls(&self, op: Operation) -> u64 {
        self.sim().stats(false).0.get(&op).copied().unwrap_or(0)
    }

    /// Creates a running instance named `name`.
    pub async fn create_instance(&self, name: &str) -> SimInstance {
        self.sim_admin()
            .create_instance(CreateInstanceRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .expect("instance created")
            .into_inner()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.gateway_shutdown.cancel();
    }
}

/// Waits until `check` returns `Some`, polling; panics with `what` after
/// [`TIMEOUT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(start.elapsed() < TIMEOUT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Every events.k8s.io Event with `reason`.
pub async fn events(
    client: &kube::Client,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(client.clone());
    api.list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// A GET on an admin port (HTTPS) with the test API server's admin token:
/// `(status, body)`.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    ccm_sandbox::admin::admin_get(addr, path, Some(kube_test_apiserver::ADMIN_TOKEN))
        .await
        .expect("HTTPS GET")
}

/// The value of the first sample of `metric` (with its labels, e.g.
/// `x_total{a="b"}`) in a Prometheus text body, 0 when absent.
pub fn metric_value(body: &str, metric: &str) -> f64 {
    body.lines()
        .find_map(|l| {
            l.strip_prefix(metric)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// A controller started in-process for a test; stopped when dropped.
pub struct TestController {
    pub running: ccm_runtime::controller::Running,
    stop: CancellationToken,
}

impl TestController {
    /// Wraps a controller started with `stop` as its shutdown token.
    pub fn new(running: ccm_runtime::controller::Running, stop: CancellationToken) -> Self {
        Self { running, stop }
    }

    /// Its `/metrics` text.
    pub async fn metrics(&self) -> String {
        http_get(self.running.admin_addr, "/metrics").await.1
    }

    /// Waits until `/readyz` answers 200 (its caches synced), and checks
    /// `/livez` too.
    pub async fn wait_ready(&self) {
        let addr = self.running.admin_addr;
        eventually("/readyz 200", || async {
            (http_get(addr, "/readyz").await.0 == 200).then_some(())
        })
        .await;
        assert_eq!(http_get(addr, "/livez").await.0, 200);
    }

    /// One sample of its metrics (see [`metric_value`]).
    pub async fn metric(&self, name: &str) -> f64 {
        metric_value(&self.metrics().await, name)
    }
}

impl Drop for TestController {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
