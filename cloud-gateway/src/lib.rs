//! The cloud gateway owns everything that touches the cloud: the provider
//! and its credentials, one API budget for the whole account, the instance
//! cache with coalescing and batching, caller authentication, and the audit
//! trail. Controllers reach the cloud only through its gRPC API
//! (`cloudgateway.v1`).

pub mod admission;
pub mod auth;
pub mod budget;
pub mod cloud;
pub mod grpc;
pub mod lbreads;
pub mod limits;
pub mod lookup;
pub mod metrics;
pub mod review;
pub mod settings;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use ccm_provider::Provider;
use ccm_provider_sim::SimCloud;
use ccm_proto::v1::instances_server::InstancesServer;
use ccm_proto::v1::load_balancers_server::LoadBalancersServer;
use ccm_proto::v1::provider_server::ProviderServer;
use ccm_proto::v1::routes_server::RoutesServer;
use ccm_proto::v1::sim_admin_server::SimAdminServer;
use ccm_runtime::admin::{AdminServer, Readiness};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic_health::ServingStatus;

use crate::admission::AdmissionLayer;
use crate::auth::{AuthLayer, Authenticator, Tokens};
use crate::budget::Budget;
use crate::cloud::Cloud;
use crate::grpc::{
    InstancesService, LoadBalancersService, MetricsLayer, ProviderService, RoutesService,
    SimAdminService,
};
use crate::lbreads::LoadBalancerReads;
use crate::lookup::InstanceLookups;
use crate::metrics::Metrics;
use crate::review::TokenReviewer;
use crate::settings::{ProviderKind, Settings};

pub use crate::settings::Args;

/// The gRPC services every health check reports on; SimAdmin too where
/// the sim is the provider.
const SERVICES: [&str; 4] = [
    "cloudgateway.v1.Provider",
    "cloudgateway.v1.Instances",
    "cloudgateway.v1.LoadBalancers",
    "cloudgateway.v1.Routes",
];
const SIM_ADMIN: &str = "cloudgateway.v1.SimAdmin";

/// How long in-flight calls may finish after the shutdown signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A running gateway.
pub struct Gateway {
    /// The gRPC address bound.
    pub grpc_addr: SocketAddr,
    /// The admin HTTP address bound.
    pub admin_addr: SocketAddr,
    /// The simulated cloud, when that is the provider.
    pub sim: Option<Arc<SimCloud>>,
    /// Generated token files, one per role, when no tokens file was given.
    pub token_files: Vec<PathBuf>,
    serve: JoinHandle<anyhow::Result<()>>,
    admin: JoinHandle<()>,
}

impl Gateway {
    /// Opens the configured provider, binds both listeners and starts
    /// serving until `shutdown` is cancelled.
    pub async fn start(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<Self> {
        let (provider, sim): (Arc<dyn Provider>, _) = match settings.provider {
            ProviderKind::Sim => {
                let sim = Arc::new(
                    SimCloud::open(&settings.state_dir, settings.sim.clone())
                        .context("open the simulated cloud")?,
                );
                (sim.clone(), Some(sim))
            }
            #[cfg(feature = "aws")]
            ProviderKind::Aws => (
                Arc::new(
                    ccm_provider_aws::AwsCloud::connect(settings.aws.clone())
                        .await
                        .context("set up the AWS provider")?,
                ),
                None,
            ),
            #[cfg(not(feature = "aws"))]
            ProviderKind::Aws => anyhow::bail!("this gateway was built without the aws feature"),
        };
        Self::start_with(settings, provider, sim, shutdown).await
    }

    /// Serves `provider`; `sim` adds the SimAdmin service for it.
    pub async fn start_with(
        settings: Settings,
        provider: Arc<dyn Provider>,
        sim: Option<Arc<SimCloud>>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let provider_name = provider.name().to_owned();
        let budget = Budget::start(settings.budget.clone());
        let cloud = Arc::new(Cloud::new(provider, budget, metrics.clone()));
        let lookups = InstanceLookups::start(cloud.clone(), settings.lookups.clone());

        let reviewer = match &settings.service_accounts {
            None => None,
            Some(sa) => {
                let client = ccm_runtime::kube::client(sa.kubeconfig.as_deref())
                    .await
                    .context("a Kubernetes client for TokenReview")?;
                tracing::info!(
                    audience = %sa.audience,
                    accounts = sa.roles.len(),
                    "ServiceAccount tokens are checked with TokenReview"
                );
                Some(TokenReviewer::new(client, sa.clone(), metrics.clone()))
            }
        };
        let (tokens, token_files) = match settings.tokens.clone() {
            Some(tokens) => (tokens, Vec::new()),
            // ServiceAccounts alone: no static token at all.
            None if reviewer.is_some() => (Tokens::default(), Vec::new()),
            None => {
                let dir = settings.state_dir.join("tokens");
                let (tokens, files) = Tokens::generate(&dir)
                    .with_context(|| format!("generate tokens in {}", dir.display()))?;
                tracing::info!(
                    dir = %dir.display(),
                    "no tokens file given; one token per role (admin, node, service, route) is in <dir>/<role>.token"
                );
                (tokens, files)
            }
        };

        let readiness = Readiness::new();
        let admin = AdminServer::bind(settings.admin_listen)
            .await
            .with_context(|| format!("bind admin address {}", settings.admin_listen))?;
        let admin_addr = admin.local_addr()?;
        let admin = tokio::spawn({
            let (registry, readiness) = (Arc::new(registry), readiness.clone());
            async move {
                if let Err(e) = admin.serve(registry, readiness).await {
                    tracing::error!(error = %e, "admin server failed");
                }
            }
        });

        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("bind gRPC address {}", settings.listen))?;
        let grpc_addr = listener.local_addr()?;

        let (health, health_service) = tonic_health::server::health_reporter();
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ccm_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ccm_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;

        let mut server = Server::builder();
        if let Some((cert, key)) = &settings.tls {
            let identity = Identity::from_pem(
                std::fs::read(cert).with_context(|| format!("read {}", cert.display()))?,
                std::fs::read(key).with_context(|| format!("read {}", key.display()))?,
            );
            server = server
                .tls_config(ServerTlsConfig::new().identity(identity))
                .context("TLS")?;
        }
        let limits = settings.limits.clone();
        let largest = limits::largest_request_bytes();
        let router = server
            .initial_stream_window_size(limits.stream_window)
            .initial_connection_window_size(limits.connection_window)
            .max_concurrent_streams(limits.max_concurrent_streams)
            .http2_keepalive_interval(Some(limits.keepalive_interval))
            .http2_keepalive_timeout(Some(limits.keepalive_timeout))
            // Outermost first: every call is counted, refused calls too;
            // no body is read before auth, and none past the limits.
            .layer(MetricsLayer::new(metrics.clone()))
            .layer(AuthLayer::new(Authenticator::new(tokens, reviewer)))
            .layer(AdmissionLayer::new(limits.clone(), metrics.clone()))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            // The admission layer holds each method to its own largest
            // valid request; tonic's own limit must not be lower.
            .add_service(ProviderServer::new(ProviderService::new(cloud.clone())))
            .add_service(
                InstancesServer::new(InstancesService::new(lookups.clone(), cloud.clone()))
                    .max_decoding_message_size(largest),
            )
            .add_service(
                LoadBalancersServer::new(LoadBalancersService::new(
                    cloud.clone(),
                    LoadBalancerReads::new(cloud.clone(), settings.lookups.clone()),
                ))
                .max_decoding_message_size(largest),
            )
            .add_service(
                RoutesServer::new(RoutesService::new(cloud.clone()))
                    .max_decoding_message_size(largest),
            )
            .add_optional_service(
                sim.clone()
                    .map(|sim| SimAdminServer::new(SimAdminService::new(sim, Some(lookups)))),
            );

        let serve = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                let serve = router.serve_with_incoming_shutdown(
                    admission::incoming(listener, &limits, metrics),
                    shutdown.clone().cancelled_owned(),
                );
                // After the signal the server takes no new connection or
                // call and finishes those in flight, for SHUTDOWN_GRACE at
                // most; a call whose client went away is not waited for.
                let grace = async {
                    shutdown.cancelled().await;
                    tokio::time::sleep(SHUTDOWN_GRACE).await;
                };
                tokio::select! {
                    served = serve => served.context("gRPC server"),
                    _ = grace => {
                        tracing::warn!("calls still in flight {SHUTDOWN_GRACE:?} after the shutdown signal; dropping them");
                        Ok(())
                    }
                }
            }
        });

        let mut services: Vec<&'static str> = SERVICES.to_vec();
        if sim.is_some() {
            services.push(SIM_ADMIN);
        }
        // Ready once the provider answers; not ready again while draining.
        tokio::spawn({
            let readiness = readiness.clone();
            async move {
                let mut delay = std::time::Duration::from_millis(200);
                loop {
                    match cloud.check().await {
                        Ok(()) => break,
                        Err(e) => tracing::warn!(error = %e, "provider not ready yet"),
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.cancelled() => return,
                    }
                    delay = (delay * 2).min(std::time::Duration::from_secs(10));
                }
                health.set_service_status("", ServingStatus::Serving).await;
                for name in services.iter().copied() {
                    health
                        .set_service_status(name, ServingStatus::Serving)
                        .await;
                }
                readiness.set(true);
                tracing::info!(provider = %provider_name, "gateway ready");
                shutdown.cancelled().await;
                readiness.set(false);
                health
                    .set_service_status("", ServingStatus::NotServing)
                    .await;
                for name in services.iter().copied() {
                    health
                        .set_service_status(name, ServingStatus::NotServing)
                        .await;
                }
            }
        });

        tracing::info!(grpc = %grpc_addr, admin = %admin_addr, "cloud gateway listening");
        Ok(Self {
            grpc_addr,
            admin_addr,
            sim,
            token_files,
            serve,
            admin,
        })
    }

    /// The token file generated for `role`, if tokens were generated.
    pub fn token_file(&self, role: auth::Role) -> Option<&PathBuf> {
        self.token_files
            .iter()
            .find(|p| p.file_stem().and_then(|s| s.to_str()) == Some(role.as_str()))
    }

    /// Waits until the gRPC server has drained after shutdown.
    pub async fn wait(self) -> anyhow::Result<()> {
        let result = self.serve.await.context("gRPC server task")?;
        self.admin.abort();
        result
    }
}
