//! The cloud gateway owns everything that touches the cloud: the provider
//! and its credentials, one API budget for the whole account, the instance
//! cache with coalescing and batching, caller authentication, and the audit
//! trail. Controllers reach the cloud only through its gRPC API
//! (`cloudgateway.v1`).
//!
//! A cloud is a crate of its own that implements [`ccm_provider::Provider`]
//! (as `ccm-provider-sim` and `ccm-provider-aws` do) and depends on the
//! provider API alone. A vendor links it into the stock server with a
//! `main` of a few lines; everything else (flags, auth, budget, cache,
//! batching, metrics, audit) is this crate's:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use cloud_gateway::Gateway;
//! use cloud_gateway::settings::{Args, Settings};
//!
//! fn main() -> std::process::ExitCode {
//!     ccm_runtime::process::main::<Args, Settings, _, _>(
//!         "my-cloud-gateway",
//!         Settings::from_args,
//!         |s| ccm_runtime::telemetry::Options {
//!             format: s.log_format,
//!             directives: s.log_level.clone(),
//!             otlp_endpoint: s.otlp_endpoint.clone(),
//!             service: String::new(),
//!         },
//!         |settings, shutdown| async move {
//!             // The vendor's own provider; the sim stands in for it here.
//!             let cloud = ccm_provider_sim::SimCloud::open(&settings.state_dir, settings.sim.clone())?;
//!             let gateway = Gateway::start_with(settings, Arc::new(cloud), None, shutdown).await?;
//!             gateway.wait().await
//!         },
//!     )
//! }
//! ```

pub mod cloud;
pub mod grpc;
pub mod identity;
pub mod inspect;
pub mod layers;
pub mod limits;
pub mod metrics;
pub mod settings;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use ccm_proto::externalgrpc::cloud_provider_server::CloudProviderServer;
use ccm_proto::v1::instances_server::InstancesServer;
use ccm_proto::v1::load_balancers_server::LoadBalancersServer;
use ccm_proto::v1::provider_server::ProviderServer;
use ccm_proto::v1::routes_server::RoutesServer;
use ccm_proto::v1::sim_admin_server::SimAdminServer;
use ccm_proto::v1::volumes_server::VolumesServer;
use ccm_provider::Provider;
use ccm_provider_sim::SimCloud;
use ccm_runtime::admin::access::{Access, Check, Decision, Reviews};
use ccm_runtime::admin::{AdminServer, Readiness};
use ccm_runtime::tls::{ALPN_H2, ServerTls};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;

use crate::cloud::Cloud;
use crate::cloud::budget::Budget;
use crate::cloud::instance_lookups::InstanceLookups;
use crate::cloud::load_balancer_reads::LoadBalancerReads;
use crate::cloud::node_group_snapshots::NodeGroupSnapshots;
use crate::grpc::{
    AutoscalerService, InstancesService, LoadBalancersService, ProviderService, RoutesService,
    SimAdminService, VolumesService,
};
use crate::identity::Role;
use crate::layers::auth::{AuthLayer, Authenticator, Tokens};
use crate::layers::request_limits::{self, RequestLimitsLayer};
use crate::layers::rpc::RpcLayer;
use crate::layers::service_accounts::TokenReviewer;
use crate::metrics::Metrics;
use crate::settings::{ProviderKind, Settings};

pub use crate::settings::Args;

/// The gRPC services every health check reports on; SimAdmin too where
/// the sim is the provider.
const SERVICES: [&str; 5] = [
    "cloudgateway.v1.Provider",
    "cloudgateway.v1.Instances",
    "cloudgateway.v1.LoadBalancers",
    "cloudgateway.v1.Routes",
    "cloudgateway.v1.Volumes",
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

    /// Serves `provider` (any implementation of [`ccm_provider::Provider`],
    /// a vendor's included); `sim` adds the SimAdmin service for it.
    pub async fn start_with(
        settings: Settings,
        provider: Arc<dyn Provider>,
        sim: Option<Arc<SimCloud>>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        ccm_runtime::version::register(&mut registry);
        let review_counts = ccm_runtime::admin::access::register(&mut registry);
        let budget = Budget::start(settings.budget.clone());
        let cloud = Arc::new(Cloud::new(provider, budget, metrics.clone()));
        let (authenticator, token_files, admin_access) =
            authenticator(&settings, &metrics, review_counts).await?;

        let readiness = Readiness::new();
        let admin = AdminServer::bind(settings.admin_listen)
            .await
            .with_context(|| format!("bind admin address {}", settings.admin_listen))?;
        let admin_addr = admin.local_addr()?;
        let inspection = ccm_runtime::inspect::Inspection::new();
        inspection.set(Arc::new(inspect::GatewayInspector {
            cloud: cloud.clone(),
            readiness: readiness.clone(),
        }));
        let admin_security = ccm_runtime::admin::Security {
            tls: settings.admin.server_tls(&shutdown)?,
            access: admin_access,
        };
        let admin = tokio::spawn({
            let (registry, readiness) = (Arc::new(registry), readiness.clone());
            async move {
                if let Err(e) = admin
                    .serve(registry, readiness, inspection, admin_security)
                    .await
                {
                    tracing::error!(error = %e, "admin server failed");
                }
            }
        });

        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("bind gRPC address {}", settings.listen))?;
        let grpc_addr = listener.local_addr()?;
        let (health, health_service) = tonic_health::server::health_reporter();
        let serve = serve(
            &settings,
            &cloud,
            sim.clone(),
            (authenticator, metrics),
            health_service,
            listener,
            shutdown.clone(),
        )?;

        let mut services: Vec<&'static str> = SERVICES.to_vec();
        if sim.is_some() {
            services.push(SIM_ADMIN);
        }
        tokio::spawn(report_readiness(
            cloud, health, services, readiness, shutdown,
        ));
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
    pub fn token_file(&self, role: Role) -> Option<&PathBuf> {
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

/// Who may call: static tokens (given, or generated into the state
/// directory when neither they nor ServiceAccounts are configured) and
/// ServiceAccount tokens checked with TokenReview. Also the generated
/// token files.
/// Who may call (the gRPC services' authenticator, and the files of the
/// tokens it generated) and who may read the admin port: the gateway's
/// admin-role tokens, or with ServiceAccounts configured a token the API
/// server reviews and lets `get` the path.
async fn authenticator(
    settings: &Settings,
    metrics: &Metrics,
    review_counts: ccm_runtime::admin::access::ReviewCounts,
) -> anyhow::Result<(Authenticator, Vec<PathBuf>, Access)> {
    let mut reviews = None;
    let reviewer = match &settings.service_accounts {
        None => None,
        Some(sa) => {
            let client = ccm_runtime::kube::client(sa.kubeconfig.as_deref())
                .await
                .context("a Kubernetes client for TokenReview")?;
            reviews = Some(Reviews::new(
                client.clone(),
                &settings.admin.reviews,
                review_counts,
            ));
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
                "no tokens file given; one token per role (admin, node, service, route, autoscaler) is in <dir>/<role>.token"
            );
            (tokens, files)
        }
    };

    let admin_access = admin_access(settings, tokens.clone(), reviews);
    let mut authenticator = Authenticator::new(tokens, reviewer);
    if let Some(tls) = &settings.tls
        && !tls.client_cert_roles.is_empty()
    {
        tracing::info!(
            identities = ?tls.client_cert_roles,
            "client certificates are verified and mapped to roles"
        );
        if let (Some(client_ca), Ok(serving)) =
            (&tls.files.client_ca, std::fs::read(&tls.files.cert))
            && std::fs::read(client_ca).is_ok_and(|ca| {
                crate::layers::client_certs::client_ca_signed_serving(&ca, &serving)
            })
        {
            tracing::warn!(
                client_ca = %client_ca.display(),
                "the client CA also signed the gateway's serving certificate: every server certificate it issues (the diagnostics API's, any other service's) is a client certificate here, and whoever may ask it for one can present a mapped identity; give client certificates a CA of their own"
            );
        }
        authenticator = authenticator.with_client_certs(tls.client_cert_roles.clone());
    }
    Ok((authenticator, token_files, admin_access))
}

/// The admin port's access: the always-allowed paths, then an admin-role
/// token of the gateway's own, then (with an API server) the reviews.
fn admin_access(settings: &Settings, tokens: Tokens, reviews: Option<Arc<Reviews>>) -> Access {
    let reviewed = reviews.map(|r| r.check());
    let check: Check = Arc::new(move |token, path| {
        let admin = tokens
            .caller(token.as_bytes())
            .is_some_and(|c| c.role == Role::Admin);
        let reviewed = reviewed.clone();
        Box::pin(async move {
            match (admin, reviewed) {
                (true, _) => Decision::Allow,
                (false, Some(reviewed)) => reviewed(token, path).await,
                (false, None) => Decision::Unauthenticated(
                    "not an admin token of this gateway's, and no API server to review it".into(),
                ),
            }
        })
    });
    Access::new(settings.admin.always_allow.clone(), Some(check))
}

/// Serves gRPC on `listener` until `shutdown`: the layers, then every
/// service.
fn serve(
    settings: &Settings,
    cloud: &Arc<Cloud>,
    sim: Option<Arc<SimCloud>>,
    (authenticator, metrics): (Authenticator, Metrics),
    health_service: HealthServer<impl Health>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    let lookups = InstanceLookups::start(cloud.clone(), settings.lookups.clone());
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ccm_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(ccm_proto::THIRD_PARTY_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ccm_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(ccm_proto::THIRD_PARTY_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let tls = match &settings.tls {
        Some(tls) => {
            let server_tls =
                ServerTls::from_files(tls.files.clone(), &[ALPN_H2]).context("gRPC TLS")?;
            server_tls.reload_every(tls.reload_interval, shutdown.clone());
            Some(server_tls)
        }
        None => {
            tracing::warn!(listen = %settings.listen, "gRPC is served in clear (--insecure-plaintext), on loopback only");
            None
        }
    };
    let server = Server::builder();
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
        .layer(RpcLayer::new(metrics.clone()))
        .layer(AuthLayer::new(authenticator))
        .layer(RequestLimitsLayer::new(limits.clone(), metrics.clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        // The request limits layer holds each method to its own largest
        // valid request; tonic's own limit must not be lower.
        .add_service(ProviderServer::new(ProviderService::new(
            cloud.clone(),
            settings.lookups.max_batch,
        )))
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
            RoutesServer::new(RoutesService::new(cloud.clone())).max_decoding_message_size(largest),
        )
        .add_service(
            VolumesServer::new(VolumesService::new(
                cloud.clone(),
                settings.lookups.clone(),
                settings.volume_attach_stuck_after,
            ))
            .max_decoding_message_size(largest),
        )
        .add_service(
            CloudProviderServer::new(AutoscalerService::new(
                cloud.clone(),
                Arc::new(NodeGroupSnapshots::new(
                    settings.cluster_name.clone(),
                    settings.node_groups_refresh_interval,
                )),
            ))
            .max_decoding_message_size(limits::AUTOSCALER_MAX_REQUEST),
        )
        .add_optional_service(
            sim.clone()
                .map(|sim| SimAdminServer::new(SimAdminService::new(sim, Some(lookups)))),
        );
    Ok(tokio::spawn(async move {
        let incoming = request_limits::incoming(listener, &limits, metrics.clone());
        let serve = router.serve_with_incoming_shutdown(
            layers::tls::secured(incoming, tls, limits.max_connections, metrics),
            shutdown.clone().cancelled_owned(),
        );
        // After the signal the server takes no new connection or call and
        // finishes those in flight, for SHUTDOWN_GRACE at most; a call
        // whose client went away is not waited for.
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
    }))
}

/// Marks the gateway ready once the provider answers its check and has
/// told its limits on load balancer hosts (so no request waits on that
/// read, and none reaches the cloud before it is checked whole), and not
/// ready again once shutdown begins.
async fn report_readiness(
    cloud: Arc<Cloud>,
    health: HealthReporter,
    services: Vec<&'static str>,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        match cloud.check().await {
            Ok(()) => match cloud.host_limits().await {
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "the cloud's load balancer limits not read yet")
                }
            },
            Err(e) => tracing::warn!(error = %e, "provider not ready yet"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return,
        }
        delay = (delay * 2).min(std::time::Duration::from_secs(10));
    }
    let set = async |status| {
        health.set_service_status("", status).await;
        for name in services.iter().copied() {
            health.set_service_status(name, status).await;
        }
    };
    set(ServingStatus::Serving).await;
    readiness.set(true);
    tracing::info!(provider = %cloud.name(), "gateway ready");
    shutdown.cancelled().await;
    readiness.set(false);
    set(ServingStatus::NotServing).await;
}
