//! The gateway's configuration: flags (most with an environment variable)
//! over an optional config file (`--config`, keys named as the flags) over
//! defaults, as for every binary here (`ccm_runtime::layered_config`).
//! Everything is checked before start, and every problem is reported at
//! once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ccm_runtime::config_checks::{
    Problems, bytes_within, check_file, duration_within, number_within,
};
use ccm_runtime::telemetry::{LogFormat, parse_filter};
use clap::Parser;
use ipnet::IpNet;

use crate::cloud::budget::BudgetConfig;
use crate::cloud::instance_lookups::LookupConfig;
use crate::layers::auth::Tokens;
use crate::layers::client_certs::ClientCertRoles;
use crate::layers::request_limits::Limits;
use crate::layers::service_accounts::ServiceAccountAuth;
#[cfg(feature = "aws")]
use ccm_provider_aws::AwsSettings;
use ccm_provider_sim::SimConfig;

/// The cloud gateway: the only component of the cloud controller manager
/// that talks to the cloud.
#[derive(Clone, Debug, Parser)]
#[command(name = "cloud-gateway", version = ccm_runtime::version::LONG, args_override_self = true)]
pub struct Args {
    /// Config file (YAML or TOML) with settings named as the flags; flags and environment win over it.
    #[arg(long, env = "CLOUD_GATEWAY_CONFIG")]
    pub config: Option<String>,
    /// gRPC listen address.
    #[arg(long, env = "CLOUD_GATEWAY_LISTEN", default_value = "0.0.0.0:7400")]
    pub listen: String,
    /// Admin HTTP address for /livez, /readyz and /metrics.
    #[arg(
        long,
        env = "CLOUD_GATEWAY_ADMIN_LISTEN",
        default_value = "0.0.0.0:7401"
    )]
    pub admin_listen: String,
    /// Directory for the simulated cloud's state and generated tokens.
    #[arg(
        long,
        env = "CLOUD_GATEWAY_STATE_DIR",
        default_value = ".cloud-gateway"
    )]
    pub state_dir: String,
    /// YAML file of bearer tokens and roles; without it, one token per role is generated into <state-dir>/tokens/.
    #[arg(long, env = "CLOUD_GATEWAY_TOKENS_FILE")]
    pub tokens_file: Option<String>,
    /// ServiceAccounts allowed in and their roles, comma-separated <namespace>/<name>=<role>; their projected tokens are checked with the Kubernetes TokenReview API.
    #[arg(long, env = "CLOUD_GATEWAY_SERVICE_ACCOUNT_ROLES")]
    pub service_account_roles: Option<String>,
    /// The audience ServiceAccount tokens must be bound to.
    #[arg(
        long,
        env = "CLOUD_GATEWAY_TOKEN_AUDIENCE",
        default_value = "cloud-gateway"
    )]
    pub token_audience: String,
    /// How long an accepted ServiceAccount token is trusted; one in use is reviewed again in the background in the last fifth of it.
    #[arg(long, default_value = "30s")]
    pub token_review_cache_ttl: String,
    /// TokenReviews of tokens not accepted before, per second (twice as many in a burst); more such calls get UNAVAILABLE. Known callers are not held to it.
    #[arg(long, default_value = "20")]
    pub token_reviews_per_second: String,
    /// TokenReviews of tokens not accepted before in flight at once.
    #[arg(long, default_value = "8")]
    pub token_reviews_in_flight: String,
    /// Kubeconfig for TokenReview; without it, $KUBECONFIG or the in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<String>,
    /// The cloud provider, required: aws, or sim (the simulated cloud, for trying things out: it knows none of a real cluster's machines).
    #[arg(long, env = "CLOUD_GATEWAY_PROVIDER")]
    pub provider: Option<String>,
    /// The cluster's name, as the controllers' --cluster-name (upstream's ClusterID): Cluster Autoscaler scales this cluster's node groups through the gateway (on AWS, the Auto Scaling groups tagged k8s.io/cluster-autoscaler/<name>); the controllers name it in each call.
    #[arg(long, env = "CLOUD_GATEWAY_CLUSTER_NAME", default_value = "kubernetes")]
    pub cluster_name: String,
    /// How old the node groups the autoscaler reads may be before its Refresh lists them again; however many autoscalers ask, the cloud is listed at most this often (0s: every Refresh lists them, as a provider with no cache of its own does).
    #[arg(long, default_value = "10s")]
    pub node_groups_refresh_interval: String,
    /// Log format: plain or json.
    #[arg(long, env = "CLOUD_GATEWAY_LOG_FORMAT", default_value = "plain")]
    pub log_format: String,
    /// Log filter, e.g. info or info,cloud_gateway=debug; RUST_LOG wins.
    #[arg(long, env = "CLOUD_GATEWAY_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Send traces over OTLP/gRPC to this collector, e.g.
    /// http://otel-collector:4317; off when unset.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// PEM certificate chain gRPC is served over TLS with (with --tls-key); read again when it changes.
    #[arg(long, env = "CLOUD_GATEWAY_TLS_CERT")]
    pub tls_cert: Option<String>,
    /// PEM private key of --tls-cert; read again when it changes.
    #[arg(long, env = "CLOUD_GATEWAY_TLS_KEY")]
    pub tls_key: Option<String>,
    /// PEM CA bundle client certificates are verified against (mutual TLS, beside tokens), read again when it changes: a CA of client certificates alone, never the one that signs serving certificates (whoever may obtain a certificate from it may obtain the roles mapped).
    #[arg(long, env = "CLOUD_GATEWAY_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<String>,
    /// Client certificate identities allowed in and their roles, comma-separated <identity>=<role>; an identity is a URI SAN (spiffe://<trust domain>/ns/<namespace>/sa/<name>), matched exactly, or CN=<common name>, matched only on a certificate with no URI SAN; a certificate with several URI SANs is refused. Such a caller needs no token.
    #[arg(long, env = "CLOUD_GATEWAY_CLIENT_CERT_ROLES")]
    pub client_cert_roles: Option<String>,
    /// How often the TLS files are read again; a changed certificate is served from the next connection on.
    #[arg(long, default_value = "30s")]
    pub tls_reload_interval: String,
    /// Serve gRPC in clear, with no TLS: true or false; only on a loopback --listen address (tests, a gateway beside its only caller).
    #[arg(
        long,
        env = "CLOUD_GATEWAY_INSECURE_PLAINTEXT",
        default_value = "false"
    )]
    pub insecure_plaintext: String,
    /// Cloud calls per second for the whole account.
    #[arg(long, env = "CLOUD_GATEWAY_BUDGET_RATE", default_value = "20")]
    pub budget_rate: String,
    /// Calls that may go at once after a quiet spell.
    #[arg(long, env = "CLOUD_GATEWAY_BUDGET_BURST", default_value = "40")]
    pub budget_burst: String,
    /// Longest wait for the budget before RESOURCE_EXHAUSTED.
    #[arg(long, env = "CLOUD_GATEWAY_BUDGET_MAX_WAIT", default_value = "10s")]
    pub budget_max_wait: String,
    /// Most calls waiting for the budget at once.
    #[arg(long, default_value = "10000")]
    pub budget_max_waiting: String,
    /// How long instance lookups are cached; 0s disables the cache.
    #[arg(long, env = "CLOUD_GATEWAY_CACHE_TTL", default_value = "10s")]
    pub cache_ttl: String,
    /// How long a batch of instance lookups waits for one more: full batches go at once, the rest after a window with none unless lookups are coming fast enough to fill it or the next wave of requests is due (and a request saying its caller's queue is drained has not come), and no lookup waits more than 20 windows (100 ms at 5ms); 0s sends at once.
    #[arg(long, env = "CLOUD_GATEWAY_BATCH_WINDOW", default_value = "5ms")]
    pub batch_window: String,
    /// Most nodes in one provider lookup call.
    #[arg(long, env = "CLOUD_GATEWAY_MAX_BATCH", default_value = "100")]
    pub max_batch: String,
    /// Share one provider answer among identical lookups in flight: true or false.
    #[arg(long, env = "CLOUD_GATEWAY_COALESCE", default_value = "true")]
    pub coalesce: String,
    /// How long a volume attachment may stay attaching before the gateway detaches it, to attach it again under another device name (upstream's EBS driver: 90s).
    #[arg(long, default_value = "90s")]
    pub volume_attach_stuck_after: String,
    /// Most gRPC connections at once; more are closed as they arrive.
    #[arg(long, default_value = "128")]
    pub max_connections: String,
    /// Most concurrent HTTP/2 streams (calls) per connection.
    #[arg(long, default_value = "100")]
    pub max_concurrent_streams: String,
    /// HTTP/2 flow-control window per stream: bytes a client may send ahead of the gateway reading them.
    #[arg(long, default_value = "64KiB")]
    pub http2_stream_window: String,
    /// HTTP/2 flow-control window per connection.
    #[arg(long, default_value = "256KiB")]
    pub http2_connection_window: String,
    /// Most requests in flight across the gateway (a request counts until its response is sent); more get RESOURCE_EXHAUSTED with a retry delay.
    #[arg(long, default_value = "512")]
    pub max_requests_in_flight: String,
    /// Most requests in flight for one authenticated caller.
    #[arg(long, default_value = "128")]
    pub max_requests_in_flight_per_caller: String,
    /// Most health and reflection requests (which need no token) in flight.
    #[arg(long, default_value = "32")]
    pub max_unauthenticated_requests_in_flight: String,
    /// Most bytes of request bodies held at once.
    #[arg(long, default_value = "64MiB")]
    pub max_request_bytes_in_flight: String,
    /// Longest time a client may take to send a whole request.
    #[arg(long, default_value = "10s")]
    pub request_receive_timeout: String,
    /// A connection with no traffic either way for this long is closed.
    #[arg(long, default_value = "5m")]
    pub idle_connection_timeout: String,
    /// HTTP/2 keepalive ping interval, to find dead peers.
    #[arg(long, default_value = "30s")]
    pub keepalive_interval: String,
    /// How long a keepalive ping may go unanswered before the connection is closed.
    #[arg(long, default_value = "10s")]
    pub keepalive_timeout: String,
    /// Health Watch and reflection streams end after this long.
    #[arg(long, default_value = "60s")]
    pub unauthenticated_stream_max_age: String,
    /// The sim's region.
    #[arg(long, default_value = "sim-region-1")]
    pub sim_region: String,
    /// The sim's zones, comma-separated; instances are spread over them.
    #[arg(long, default_value = "sim-zone-a,sim-zone-b,sim-zone-c")]
    pub sim_zones: String,
    /// The type of sim instances created without one.
    #[arg(long, default_value = "sim.standard-2")]
    pub sim_default_instance_type: String,
    /// CIDRs the sim hands external load balancer addresses out of, comma-separated.
    #[arg(
        long,
        env = "CLOUD_GATEWAY_SIM_LB_POOL",
        default_value = "203.0.113.0/24"
    )]
    pub sim_lb_pool: String,
    /// CIDRs for internal load balancers, comma-separated.
    #[arg(long, default_value = "10.255.0.0/24")]
    pub sim_internal_lb_pool: String,
    /// The network sim instances get their internal addresses from.
    #[arg(long, default_value = "10.240.0.0/16")]
    pub sim_node_network: String,
    /// The most hosts of one sim load balancer in one zone; 0 for no limit (AWS's NLB quota by default).
    #[arg(long, default_value_t = ccm_provider_sim::DEFAULT_LB_HOSTS_PER_ZONE)]
    pub sim_lb_hosts_per_zone: u32,
    /// The most hosts of one sim load balancer; 0 for no limit (AWS's NLB quota by default).
    #[arg(long, default_value_t = ccm_provider_sim::DEFAULT_LB_HOSTS_PER_LOAD_BALANCER)]
    pub sim_lb_hosts_per_load_balancer: u32,
    /// The most volumes attached to one sim instance at once.
    #[arg(long, default_value_t = ccm_provider_sim::DEFAULT_VOLUMES_PER_INSTANCE)]
    pub sim_volumes_per_instance: u32,
    /// AWS region; without it, the SDK's chain (AWS_REGION, the profile, instance metadata).
    #[arg(long, env = "CLOUD_GATEWAY_AWS_REGION")]
    pub aws_region: Option<String>,
    /// AWS API endpoint in place of the public one (an emulator, a private endpoint, an EC2-compatible cloud).
    #[arg(long, env = "CLOUD_GATEWAY_AWS_ENDPOINT_URL")]
    pub aws_endpoint_url: Option<String>,
    /// The cluster's VPC; instances found by name and route tables are looked for in it only.
    #[arg(long, env = "CLOUD_GATEWAY_AWS_VPC_ID")]
    pub aws_vpc_id: Option<String>,
    /// Route tables for pod routes, comma-separated, used tagged or not (upstream's RouteTableID). Without it, every route table with the cluster tag (or the legacy KubernetesCluster tag).
    #[arg(long, env = "CLOUD_GATEWAY_AWS_ROUTE_TABLE_IDS")]
    pub aws_route_table_ids: Option<String>,
    /// IAM role to assume with the credentials of the SDK's chain.
    #[arg(long, env = "CLOUD_GATEWAY_AWS_ROLE_ARN")]
    pub aws_role_arn: Option<String>,
    /// External ID for assuming --aws-role-arn, when the role's trust policy asks for one.
    #[arg(long, env = "CLOUD_GATEWAY_AWS_EXTERNAL_ID")]
    pub aws_external_id: Option<String>,
    /// Session name for assuming --aws-role-arn (shows in CloudTrail).
    #[arg(long, default_value = "cloud-gateway")]
    pub aws_role_session_name: String,
    /// Address families of node InternalIPs, in order: ipv4, ipv6 or both, comma-separated (ipv4 by default, as upstream).
    #[arg(
        long,
        env = "CLOUD_GATEWAY_AWS_NODE_IP_FAMILIES",
        default_value = "ipv4"
    )]
    pub aws_node_ip_families: String,
    /// Longest time one AWS API request may take.
    #[arg(long, default_value = "30s")]
    pub aws_request_timeout: String,
    /// The load balancer of a Service without the aws-load-balancer-type annotation: classic (a Classic ELB, as cloud-provider-aws makes) or nlb.
    #[arg(long, default_value = "classic")]
    pub aws_default_load_balancer_type: String,
    /// Never change the nodes' security groups; the operator opens them to the load balancers (upstream's DisableSecurityGroupIngress): true or false.
    #[arg(
        long,
        env = "CLOUD_GATEWAY_AWS_DISABLE_SECURITY_GROUP_INGRESS",
        default_value = "false"
    )]
    pub aws_disable_security_group_ingress: String,
    /// One security group every Classic ELB uses in place of one of its own; the gateway never changes its rules (upstream's ElbSecurityGroup).
    #[arg(long, env = "CLOUD_GATEWAY_AWS_ELB_SECURITY_GROUP")]
    pub aws_elb_security_group: Option<String>,
    /// Security groups of new NLBs: managed (one of the NLB's own, admitting its source ranges) or none (the nodes admit client CIDRs, cloud-provider-aws's default). Existing NLBs keep what they have.
    #[arg(
        long,
        env = "CLOUD_GATEWAY_AWS_NLB_SECURITY_GROUP_MODE",
        default_value = "managed"
    )]
    pub aws_nlb_security_group_mode: String,
    /// Health check of Services with externalTrafficPolicy Cluster: service-node-port (the traffic port) or shared (kube-proxy's health endpoint, upstream's Shared mode).
    #[arg(
        long,
        env = "CLOUD_GATEWAY_AWS_CLUSTER_HEALTH_PROBE",
        default_value = "service-node-port"
    )]
    pub aws_cluster_health_probe: String,
    /// kube-proxy's health port for --aws-cluster-health-probe shared (10256 when not given).
    #[arg(long, env = "CLOUD_GATEWAY_AWS_SHARED_HEALTH_PROBE_PORT")]
    pub aws_shared_health_probe_port: Option<String>,
    /// kube-proxy's health path for --aws-cluster-health-probe shared (/healthz when not given).
    #[arg(long, env = "CLOUD_GATEWAY_AWS_SHARED_HEALTH_PROBE_PATH")]
    pub aws_shared_health_probe_path: Option<String>,
    /// Endpoints for single AWS APIs, ahead of --aws-endpoint-url: service=URL pairs, comma-separated, for autoscaling, ec2, elasticloadbalancing and sts (for assuming --aws-role-arn; upstream's ServiceOverride).
    #[arg(long, env = "CLOUD_GATEWAY_AWS_ENDPOINTS")]
    pub aws_endpoints: Option<String>,
    #[command(flatten)]
    pub admin: ccm_runtime::admin::AdminArgs,
}

impl Args {
    /// These settings with nothing served: no TLS files, plaintext on
    /// loopback. For tools that use the provider and serve nothing
    /// (`aws-preflight`), given a gateway's config whose certificate files
    /// are not on this machine.
    pub fn serving_nothing(&self) -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            admin_listen: "127.0.0.1:0".into(),
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            client_cert_roles: None,
            insecure_plaintext: "true".into(),
            admin: ccm_runtime::admin::AdminArgs::default(),
            ..self.clone()
        }
    }
}

/// How gRPC is served over TLS.
#[derive(Clone, Debug)]
pub struct GatewayTls {
    /// The certificate, key and client CA bundle files.
    pub files: ccm_runtime::tls::PemFiles,
    /// How often they are read again.
    pub reload_interval: Duration,
    /// Client certificate identities and their roles.
    pub client_cert_roles: ClientCertRoles,
}

/// The providers built in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// The simulated cloud.
    Sim,
    /// Amazon Web Services (EC2 instances, VPC routes); built with the
    /// `aws` feature.
    Aws,
}

/// Providers this build has, for error messages.
const PROVIDERS: &str = if cfg!(feature = "aws") {
    "aws (Amazon Web Services) or sim (the simulated cloud, for trying things out)"
} else {
    "sim (the simulated cloud, for trying things out; this gateway was built without the aws feature)"
};

/// The checked configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// The admin port's certificate and open paths.
    pub admin: ccm_runtime::admin::AdminSettings,
    pub state_dir: PathBuf,
    /// Tokens from `--tokens-file`; `None` generates them unless
    /// ServiceAccounts are configured.
    pub tokens: Option<Tokens>,
    /// ServiceAccount token authentication, when roles are configured.
    pub service_accounts: Option<ServiceAccountAuth>,
    pub provider: ProviderKind,
    pub log_format: LogFormat,
    pub log_level: String,
    /// Where traces go over OTLP; `None` for nowhere.
    pub otlp_endpoint: Option<String>,
    /// TLS for gRPC; `None` only with `--insecure-plaintext` on loopback.
    pub tls: Option<GatewayTls>,
    pub budget: BudgetConfig,
    /// What one client may make the gateway hold.
    pub limits: Limits,
    pub lookups: LookupConfig,
    /// The cluster whose node groups the autoscaler scales.
    pub cluster_name: String,
    /// How often the node groups are listed again at most.
    pub node_groups_refresh_interval: Duration,
    /// How long a volume attachment may stay attaching before it is
    /// detached, to be attached again under another device name.
    pub volume_attach_stuck_after: Duration,
    pub sim: SimConfig,
    #[cfg(feature = "aws")]
    pub aws: AwsSettings,
}

fn list(s: &str) -> Vec<&str> {
    s.split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect()
}

fn cidrs(p: &mut Problems, key: &str, value: &str) -> Vec<IpNet> {
    let nets: Vec<_> = list(value)
        .into_iter()
        .filter_map(|s| p.parse(key, s, |s| s.parse::<IpNet>()))
        .collect();
    if list(value).is_empty() {
        p.push(key, "needs at least one CIDR");
    }
    nets
}

impl Settings {
    /// Defaults on the simulated cloud, on loopback with free ports and
    /// generated tokens, for tests and the sandbox.
    pub fn local(state_dir: impl Into<PathBuf>) -> Self {
        let args = Args::try_parse_from([
            "cloud-gateway",
            "--provider",
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--insecure-plaintext",
            "true",
        ])
        .expect("the defaults parse");
        let mut settings = Self::from_args(&args).expect("the defaults are valid");
        settings.state_dir = state_dir.into();
        settings
    }

    /// Checks every flag; all problems are reported together.
    pub fn from_args(args: &Args) -> Result<Self, Problems> {
        let mut p = Problems::new();
        let listen = p.parse("listen", &args.listen, str::parse::<SocketAddr>);
        let admin_listen = p.parse("admin-listen", &args.admin_listen, str::parse::<SocketAddr>);
        let admin = args.admin.resolve(&mut p);
        if args.state_dir.is_empty() {
            p.push("state-dir", "must not be empty");
        }
        let provider = provider(&mut p, args);
        let log_format = p.parse("log-format", &args.log_format, str::parse::<LogFormat>);
        p.parse("log-level", &args.log_level, parse_filter);
        let otlp_endpoint = args.otlp_endpoint.as_ref().map(|endpoint| {
            p.parse(
                "otlp-endpoint",
                endpoint,
                ccm_runtime::telemetry::parse_otlp_endpoint,
            )
        });
        let tokens = tokens(&mut p, args);
        let service_accounts = service_accounts(&mut p, args);
        let tls = tls(&mut p, args, listen.as_ref());
        let budget = budget(&mut p, args);
        let limits = limits(&mut p, args);
        let lookups = lookups(&mut p, args);
        if !ccm_runtime::names::is_cluster_name(&args.cluster_name) {
            p.push("cluster-name", ccm_runtime::names::CLUSTER_NAME_RULE);
        }
        let node_groups_refresh_interval = p.parse(
            "node-groups-refresh-interval",
            &args.node_groups_refresh_interval,
            duration_within(Duration::ZERO, Duration::from_secs(600)),
        );
        let volume_attach_stuck_after = p.parse(
            "volume-attach-stuck-after",
            &args.volume_attach_stuck_after,
            duration_within(Duration::from_secs(1), Duration::from_secs(3600)),
        );
        let sim = sim(&mut p, args);
        #[cfg(feature = "aws")]
        let aws = aws(&mut p, args);
        p.finish(|| Settings {
            listen: listen.expect("checked"),
            admin_listen: admin_listen.expect("checked"),
            admin: admin.expect("checked"),
            state_dir: PathBuf::from(&args.state_dir),
            tokens,
            service_accounts,
            provider: provider.expect("checked"),
            log_format: log_format.expect("checked"),
            log_level: args.log_level.clone(),
            otlp_endpoint: otlp_endpoint.map(|e| e.expect("checked")),
            tls,
            budget: budget.expect("checked"),
            limits,
            lookups: lookups.expect("checked"),
            cluster_name: args.cluster_name.clone(),
            node_groups_refresh_interval: node_groups_refresh_interval.expect("checked"),
            volume_attach_stuck_after: volume_attach_stuck_after.expect("checked"),
            sim: sim.expect("checked"),
            #[cfg(feature = "aws")]
            aws: aws.expect("checked"),
        })
    }
}

// Each section below checks its flags, records every problem in `p`, and
// returns its settings only when it found none (a value is then present:
// `Settings::from_args` builds settings only when `p` holds no problem).

/// The provider has no default: installed on a real cluster, a gateway on
/// the sim would answer that none of its machines exist, and the node
/// lifecycle controller deletes a NotReady Node whose instance does not.
fn provider(p: &mut Problems, args: &Args) -> Option<ProviderKind> {
    let Some(name) = args.provider.as_deref().filter(|s| !s.trim().is_empty()) else {
        p.push(
            "provider",
            format!(
                "required, with no default (--provider, CLOUD_GATEWAY_PROVIDER or the config file's provider): {PROVIDERS}"
            ),
        );
        return None;
    };
    p.parse("provider", name, |s| match s.trim() {
        "sim" => Ok(ProviderKind::Sim),
        "aws" if cfg!(feature = "aws") => Ok(ProviderKind::Aws),
        _ => Err(format!("not a provider; use {PROVIDERS}")),
    })
}

fn tokens(p: &mut Problems, args: &Args) -> Option<Tokens> {
    let file = args.tokens_file.as_ref()?;
    match Tokens::from_file(file.as_ref()) {
        Ok(tokens) => Some(tokens),
        Err(problems) => {
            for problem in problems {
                p.push("tokens-file", problem);
            }
            None
        }
    }
}

/// ServiceAccount authentication; `None` when no roles are configured.
fn service_accounts(p: &mut Problems, args: &Args) -> Option<ServiceAccountAuth> {
    let cache_ttl = p.parse(
        "token-review-cache-ttl",
        &args.token_review_cache_ttl,
        duration_within(Duration::from_secs(1), Duration::from_secs(3600)),
    );
    let reviews_per_second = p.parse(
        "token-reviews-per-second",
        &args.token_reviews_per_second,
        number_within(0.1, 10_000.0),
    );
    let reviews_in_flight = p.parse(
        "token-reviews-in-flight",
        &args.token_reviews_in_flight,
        number_within(1usize, 1000),
    );
    if args.token_audience.trim().is_empty() {
        p.push("token-audience", "must not be empty");
    }
    let roles = match args.service_account_roles.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => match ServiceAccountAuth::parse_roles(text) {
            Ok(roles) => Some(roles),
            Err(problems) => {
                for problem in problems {
                    p.push("service-account-roles", problem);
                }
                None
            }
        },
    };
    Some(ServiceAccountAuth {
        roles: roles?,
        audience: args.token_audience.trim().to_owned(),
        cache_ttl: cache_ttl?,
        kubeconfig: args.kubeconfig.as_ref().map(PathBuf::from),
        reviews_per_second: reviews_per_second?,
        reviews_in_flight: reviews_in_flight?,
    })
}

/// TLS is the rule: plaintext needs `--insecure-plaintext true`, and only
/// on a loopback address; client certificates need their CA and roles.
fn tls(p: &mut Problems, args: &Args, listen: Option<&SocketAddr>) -> Option<GatewayTls> {
    let plaintext = p.parse("insecure-plaintext", &args.insecure_plaintext, |s| {
        s.parse::<bool>().map_err(|_| "use true or false")
    });
    let reload_interval = p.parse(
        "tls-reload-interval",
        &args.tls_reload_interval,
        duration_within(Duration::from_secs(1), Duration::from_secs(3600)),
    );
    let client_cert_roles = match args.client_cert_roles.as_deref().map(str::trim) {
        None | Some("") => Some(ClientCertRoles::default()),
        Some(text) => match ClientCertRoles::parse(text) {
            Ok(roles) => Some(roles),
            Err(problems) => {
                for problem in problems {
                    p.push("client-cert-roles", problem);
                }
                None
            }
        },
    };
    let client_ca = args
        .tls_client_ca
        .as_deref()
        .filter(|s| !s.trim().is_empty());
    let files = match (&args.tls_cert, &args.tls_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => {
            p.push("tls-cert", "--tls-cert and --tls-key go together");
            None
        }
    };
    for (flag, path) in [
        ("tls-cert", args.tls_cert.as_deref()),
        ("tls-key", args.tls_key.as_deref()),
        ("tls-client-ca", client_ca),
    ] {
        if let Some(Err(problem)) = path.map(check_file) {
            p.push(flag, problem);
        }
    }
    let has_roles = client_cert_roles.as_ref().is_some_and(|r| !r.is_empty());
    if client_ca.is_some() && !has_roles && client_cert_roles.is_some() {
        p.push(
            "tls-client-ca",
            "given without --client-cert-roles: no client certificate would be let in",
        );
    }
    if has_roles && client_ca.is_none() {
        p.push(
            "client-cert-roles",
            "needs --tls-client-ca, the CA bundle client certificates are verified against",
        );
    }
    match (plaintext?, files) {
        (true, Some(_)) => {
            p.push(
                "insecure-plaintext",
                "not with --tls-cert: the gateway serves TLS or plaintext, never both",
            );
            None
        }
        (true, None) => {
            if let Some(listen) = listen.filter(|l| !l.ip().is_loopback()) {
                p.push(
                    "insecure-plaintext",
                    format!(
                        "only on a loopback --listen address, not {listen}: anyone on the path could read the callers' tokens"
                    ),
                );
            }
            if client_ca.is_some() {
                p.push("tls-client-ca", "needs --tls-cert and --tls-key");
            }
            None
        }
        (false, None) => {
            if args.tls_cert.is_none() && args.tls_key.is_none() {
                p.push(
                    "tls-cert",
                    "required: gRPC is served over TLS (--tls-cert and --tls-key); --insecure-plaintext true serves it in clear, on a loopback --listen address only",
                );
            }
            None
        }
        (false, Some((cert, key))) => Some(GatewayTls {
            files: ccm_runtime::tls::PemFiles {
                cert: PathBuf::from(cert),
                key: PathBuf::from(key),
                client_ca: client_ca.map(PathBuf::from),
            },
            reload_interval: reload_interval?,
            client_cert_roles: client_cert_roles?,
        }),
    }
}

fn budget(p: &mut Problems, args: &Args) -> Option<BudgetConfig> {
    let rate = p.parse(
        "budget-rate",
        &args.budget_rate,
        number_within(0.01, 100_000.0),
    );
    let burst = p.parse(
        "budget-burst",
        &args.budget_burst,
        number_within(1.0, 1_000_000.0),
    );
    let max_wait = p.parse(
        "budget-max-wait",
        &args.budget_max_wait,
        duration_within(Duration::ZERO, Duration::from_secs(300)),
    );
    let max_waiting = p.parse(
        "budget-max-waiting",
        &args.budget_max_waiting,
        number_within(1usize, 1_000_000),
    );
    Some(BudgetConfig {
        rate: rate?,
        burst: burst?,
        max_wait: max_wait?,
        max_waiting: max_waiting?,
    })
}

fn lookups(p: &mut Problems, args: &Args) -> Option<LookupConfig> {
    let cache_ttl = p.parse(
        "cache-ttl",
        &args.cache_ttl,
        duration_within(Duration::ZERO, Duration::from_secs(3600)),
    );
    let batch_window = p.parse(
        "batch-window",
        &args.batch_window,
        duration_within(Duration::ZERO, Duration::from_secs(1)),
    );
    let max_batch = p.parse(
        "max-batch",
        &args.max_batch,
        number_within(1usize, crate::limits::MAX_NODES),
    );
    let coalesce = p.parse("coalesce", &args.coalesce, |s| {
        s.parse::<bool>().map_err(|_| "use true or false")
    });
    Some(LookupConfig {
        cache_ttl: cache_ttl?,
        batch_window: batch_window?,
        max_batch: max_batch?,
        coalesce: coalesce?,
    })
}

/// What one client may make the gateway hold; a value with a problem is
/// left at zero (and `p` says why).
fn limits(p: &mut Problems, args: &Args) -> Limits {
    let limits = Limits {
        max_connections: p
            .parse(
                "max-connections",
                &args.max_connections,
                number_within(1usize, 100_000),
            )
            .unwrap_or_default(),
        max_concurrent_streams: p
            .parse(
                "max-concurrent-streams",
                &args.max_concurrent_streams,
                number_within(1u32, 10_000),
            )
            .unwrap_or_default(),
        stream_window: p
            .parse(
                "http2-stream-window",
                &args.http2_stream_window,
                bytes_within(65_535, 16 << 20),
            )
            .unwrap_or_default() as u32,
        connection_window: p
            .parse(
                "http2-connection-window",
                &args.http2_connection_window,
                bytes_within(65_535, 64 << 20),
            )
            .unwrap_or_default() as u32,
        max_in_flight: p
            .parse(
                "max-requests-in-flight",
                &args.max_requests_in_flight,
                number_within(1usize, 100_000),
            )
            .unwrap_or_default(),
        max_in_flight_per_caller: p
            .parse(
                "max-requests-in-flight-per-caller",
                &args.max_requests_in_flight_per_caller,
                number_within(1usize, 100_000),
            )
            .unwrap_or_default(),
        max_in_flight_public: p
            .parse(
                "max-unauthenticated-requests-in-flight",
                &args.max_unauthenticated_requests_in_flight,
                number_within(1usize, 10_000),
            )
            .unwrap_or_default(),
        max_request_bytes: p
            .parse(
                "max-request-bytes-in-flight",
                &args.max_request_bytes_in_flight,
                bytes_within(1 << 20, 16 << 30),
            )
            .unwrap_or_default() as usize,
        request_receive_timeout: p
            .parse(
                "request-receive-timeout",
                &args.request_receive_timeout,
                duration_within(Duration::from_millis(100), Duration::from_secs(300)),
            )
            .unwrap_or_default(),
        idle_timeout: p
            .parse(
                "idle-connection-timeout",
                &args.idle_connection_timeout,
                duration_within(Duration::from_secs(1), Duration::from_secs(24 * 3600)),
            )
            .unwrap_or_default(),
        keepalive_interval: p
            .parse(
                "keepalive-interval",
                &args.keepalive_interval,
                duration_within(Duration::from_secs(1), Duration::from_secs(3600)),
            )
            .unwrap_or_default(),
        keepalive_timeout: p
            .parse(
                "keepalive-timeout",
                &args.keepalive_timeout,
                duration_within(Duration::from_secs(1), Duration::from_secs(300)),
            )
            .unwrap_or_default(),
        public_stream_max_age: p
            .parse(
                "unauthenticated-stream-max-age",
                &args.unauthenticated_stream_max_age,
                duration_within(Duration::from_secs(1), Duration::from_secs(3600)),
            )
            .unwrap_or_default(),
    };
    let largest = crate::limits::largest_request_bytes();
    if limits.max_request_bytes != 0 && limits.max_request_bytes < largest {
        p.push(
            "max-request-bytes-in-flight",
            format!("must hold the largest valid request, {largest} bytes"),
        );
    }
    if limits.max_in_flight_per_caller > limits.max_in_flight {
        p.push(
            "max-requests-in-flight-per-caller",
            "must not exceed --max-requests-in-flight",
        );
    }
    if limits.max_in_flight_public > limits.max_in_flight {
        p.push(
            "max-unauthenticated-requests-in-flight",
            "must not exceed --max-requests-in-flight",
        );
    }
    limits
}

fn sim(p: &mut Problems, args: &Args) -> Option<SimConfig> {
    let zones: Vec<String> = list(&args.sim_zones)
        .into_iter()
        .map(str::to_owned)
        .collect();
    if zones.is_empty() {
        p.push("sim-zones", "needs at least one zone");
    }
    let lb_pool = cidrs(p, "sim-lb-pool", &args.sim_lb_pool);
    let internal_lb_pool = cidrs(p, "sim-internal-lb-pool", &args.sim_internal_lb_pool);
    let node_network = p.parse("sim-node-network", &args.sim_node_network, |s| {
        s.parse::<IpNet>()
    });
    Some(SimConfig {
        region: args.sim_region.clone(),
        zones,
        default_instance_type: args.sim_default_instance_type.clone(),
        lb_pool,
        internal_lb_pool,
        node_network: node_network?,
        lb_hosts_per_zone: args.sim_lb_hosts_per_zone,
        lb_hosts_per_load_balancer: args.sim_lb_hosts_per_load_balancer,
        volumes_per_instance: args.sim_volumes_per_instance,
    })
}

#[cfg(feature = "aws")]
fn aws(p: &mut Problems, args: &Args) -> Option<AwsSettings> {
    use ccm_provider_aws::annotations::LbKind;
    use ccm_provider_aws::settings as check;
    let given = |value: &Option<String>| {
        value
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned)
    };
    let region = given(&args.aws_region).and_then(|s| p.parse("aws-region", &s, check::region));
    let endpoint_url = given(&args.aws_endpoint_url)
        .and_then(|s| p.parse("aws-endpoint-url", &s, check::endpoint_url));
    let vpc_id =
        given(&args.aws_vpc_id).and_then(|s| p.parse("aws-vpc-id", &s, |s| check::id("vpc-", s)));
    let route_table_ids: Vec<String> = list(args.aws_route_table_ids.as_deref().unwrap_or(""))
        .into_iter()
        .filter_map(|s| p.parse("aws-route-table-ids", s, |s| check::id("rtb-", s)))
        .collect();
    let role_arn =
        given(&args.aws_role_arn).and_then(|s| p.parse("aws-role-arn", &s, check::role_arn));
    let role_session_name = check::role_session_name(&args.aws_role_session_name)
        .map_err(|problem| p.push("aws-role-session-name", problem))
        .ok();
    if args.aws_external_id.is_some() && role_arn.is_none() {
        p.push("aws-external-id", "needs --aws-role-arn");
    }
    let node_ip_families = p.parse(
        "aws-node-ip-families",
        &args.aws_node_ip_families,
        check::ip_families,
    );
    let request_timeout = p.parse(
        "aws-request-timeout",
        &args.aws_request_timeout,
        duration_within(Duration::from_secs(1), Duration::from_secs(300)),
    );
    let default_load_balancer_type = p.parse(
        "aws-default-load-balancer-type",
        &args.aws_default_load_balancer_type,
        |s| LbKind::parse(s).ok_or_else(|| "is not classic or nlb".to_owned()),
    );
    let disable_security_group_ingress = p.parse(
        "aws-disable-security-group-ingress",
        &args.aws_disable_security_group_ingress,
        |s| s.trim().parse::<bool>().map_err(|_| "use true or false"),
    );
    let elb_security_group = given(&args.aws_elb_security_group)
        .and_then(|s| p.parse("aws-elb-security-group", &s, |s| check::id("sg-", s)));
    let nlb_security_groups = p.parse(
        "aws-nlb-security-group-mode",
        &args.aws_nlb_security_group_mode,
        check::nlb_groups,
    );
    let shared_health_probe = shared_probe(p, args);
    let endpoints = p.parse(
        "aws-endpoints",
        args.aws_endpoints.as_deref().unwrap_or(""),
        check::endpoints,
    );
    Some(AwsSettings {
        region,
        endpoint_url,
        vpc_id,
        route_table_ids,
        role_arn,
        external_id: given(&args.aws_external_id).map(|s| s.trim().to_owned()),
        role_session_name: role_session_name?,
        node_ip_families: node_ip_families?,
        request_timeout: request_timeout?,
        default_load_balancer_type: default_load_balancer_type?,
        disable_security_group_ingress: disable_security_group_ingress?,
        elb_security_group,
        nlb_security_groups: nlb_security_groups?,
        shared_health_probe: shared_health_probe?,
        endpoints: endpoints?,
    })
}

/// kube-proxy's endpoint when the shared health probe is on; `Some(None)`
/// when it is off, `None` when a flag is wrong.
#[cfg(feature = "aws")]
fn shared_probe(
    p: &mut Problems,
    args: &Args,
) -> Option<Option<ccm_provider_aws::settings::SharedProbe>> {
    use ccm_provider_aws::settings as check;
    let shared = match args.aws_cluster_health_probe.trim() {
        "shared" => true,
        "service-node-port" => false,
        _ => {
            p.push(
                "aws-cluster-health-probe",
                "is not service-node-port or shared",
            );
            return None;
        }
    };
    let port = args.aws_shared_health_probe_port.as_deref();
    let path = args.aws_shared_health_probe_path.as_deref();
    if !shared {
        for (flag, given) in [
            ("aws-shared-health-probe-port", port),
            ("aws-shared-health-probe-path", path),
        ] {
            if given.is_some() {
                p.push(flag, "needs --aws-cluster-health-probe shared");
            }
        }
        return Some(None);
    }
    let port = p.parse(
        "aws-shared-health-probe-port",
        port.unwrap_or("10256"),
        number_within(1u16, 65535),
    );
    let path = p.parse(
        "aws-shared-health-probe-path",
        path.unwrap_or("/healthz"),
        check::probe_path,
    );
    Some(Some(check::SharedProbe {
        port: port?,
        path: path?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate and key for the tests, made once.
    fn tls_files() -> &'static (String, String) {
        static FILES: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
        FILES.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("gateway-settings-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
            std::fs::write(&cert, made.cert.pem()).unwrap();
            std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
            (cert.display().to_string(), key.display().to_string())
        })
    }

    /// `args` as the gateway's command line, with TLS files unless they
    /// say how gRPC is served.
    fn parse(args: &[&str]) -> Result<Settings, Problems> {
        let (cert, key) = tls_files();
        let serving = args
            .iter()
            .any(|a| a.starts_with("--tls-") || a.starts_with("--insecure-plaintext"));
        let tls = ["--tls-cert", cert, "--tls-key", key];
        let argv: Vec<std::ffi::OsString> = std::iter::once("cloud-gateway")
            .chain(tls.iter().copied().filter(|_| !serving))
            .chain(args.iter().copied())
            .map(Into::into)
            .collect();
        ccm_runtime::layered_config::resolve_from::<Args, _>(argv, Settings::from_args)
    }

    #[cfg(feature = "aws")]
    #[test]
    fn wrong_aws_knobs_are_each_named() {
        let problems = parse(&[
            "--provider",
            "aws",
            "--aws-disable-security-group-ingress",
            "yes",
            "--aws-elb-security-group",
            "default",
            "--aws-nlb-security-group-mode",
            "Managed-ish",
            "--aws-shared-health-probe-port",
            "10256",
            "--aws-endpoints",
            "ec2=https://ec2.example,s3=https://s3.example",
        ])
        .unwrap_err()
        .to_string();
        for key in [
            "aws-disable-security-group-ingress",
            "aws-elb-security-group",
            "aws-nlb-security-group-mode",
            "aws-shared-health-probe-port: needs --aws-cluster-health-probe shared",
            "\"s3\" is not one of autoscaling, ec2, eks, elasticloadbalancing, sts",
        ] {
            assert!(problems.contains(key), "{key} missing from {problems}");
        }
        let problems = parse(&[
            "--provider",
            "aws",
            "--aws-cluster-health-probe",
            "shared",
            "--aws-shared-health-probe-port",
            "0",
            "--aws-shared-health-probe-path",
            "healthz",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            problems.contains("aws-shared-health-probe-port"),
            "{problems}"
        );
        assert!(
            problems.contains("aws-shared-health-probe-path"),
            "{problems}"
        );
        let s = parse(&["--provider", "aws", "--aws-cluster-health-probe", "shared"]).unwrap();
        assert_eq!(
            s.aws.shared_health_probe,
            Some(ccm_provider_aws::settings::SharedProbe {
                port: 10256,
                path: "/healthz".into()
            })
        );
    }

    /// Every AWS flag is in the operators' guide, and every flag the guide
    /// names exists.
    #[cfg(feature = "aws")]
    #[test]
    fn the_aws_guide_names_exactly_the_aws_flags() {
        use clap::CommandFactory;
        let doc = include_str!("../../helm/aws/README.md");
        let flags: Vec<String> = Args::command()
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| l.starts_with("aws-"))
            .map(|l| format!("--{l}"))
            .collect();
        for flag in &flags {
            assert!(
                doc.contains(&format!("`{flag}`")),
                "{flag} not in helm/aws/README.md"
            );
        }
        let named = doc.split('`').filter(|w| w.starts_with("--aws-"));
        for word in named {
            let flag = word.split([' ', '=']).next().unwrap_or_default();
            assert!(
                flags.iter().any(|f| f == flag),
                "{flag} in the guide is no flag"
            );
        }
    }

    #[test]
    fn defaults_are_valid_once_a_provider_is_named() {
        let s = parse(&["--provider", "sim"]).unwrap();
        assert_eq!(s.provider, ProviderKind::Sim);
        assert_eq!(s.listen, "0.0.0.0:7400".parse().unwrap());
        assert_eq!(s.budget, BudgetConfig::default());
        assert_eq!(s.limits, Limits::default());
        assert_eq!(s.lookups, LookupConfig::default());
        assert_eq!(s.sim.lb_pool, SimConfig::default().lb_pool);
    }

    #[test]
    fn no_provider_is_a_problem_named_with_the_providers_beside_the_others() {
        for missing in [&[][..], &["--provider", " "]] {
            let args: Vec<&str> = missing
                .iter()
                .copied()
                .chain(["--budget-rate=-3"])
                .collect();
            let problems = parse(&args).unwrap_err();
            let keys: Vec<_> = problems
                .list()
                .iter()
                .map(|p| p.split(':').next().unwrap())
                .collect();
            assert_eq!(keys, ["provider", "budget-rate"], "{problems}");
            let provider = &problems.list()[0];
            for name in [
                "required",
                "aws",
                "sim (the simulated cloud, for trying things out",
            ] {
                assert!(provider.contains(name), "{name} missing from {provider}");
            }
        }
        let problems = parse(&["--provider", "cloudy"]).unwrap_err().to_string();
        for part in [
            "provider: \"cloudy\": not a provider; use",
            "sim (the simulated cloud",
        ] {
            assert!(problems.contains(part), "{part} missing from {problems}");
        }
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let problems = parse(&[
            "--listen",
            "nowhere",
            "--budget-rate=-3",
            "--cache-ttl",
            "10 fortnights",
            "--coalesce",
            "maybe",
            "--provider",
            "cloudy",
            "--sim-lb-pool",
            "300.0.0.0/8",
            "--service-account-roles",
            "kube-system/ccm-node-controller=wizard",
            "--token-review-cache-ttl",
            "soon",
        ])
        .unwrap_err();
        let keys: Vec<_> = problems
            .list()
            .iter()
            .map(|p| p.split(':').next().unwrap().to_owned())
            .collect();
        for key in [
            "listen",
            "provider",
            "budget-rate",
            "cache-ttl",
            "coalesce",
            "sim-lb-pool",
            "service-account-roles",
            "token-review-cache-ttl",
        ] {
            assert!(
                keys.iter().any(|k| k == key),
                "{key} missing from {problems}"
            );
        }
    }

    #[test]
    fn file_settings_apply_under_flags_and_unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gateway.yaml");
        std::fs::write(
            &file,
            "provider: sim\nlisten: 127.0.0.1:9000\nbudget-rate: 5\nsim-zones: [z1]\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let s = parse(&["--config", path, "--budget-rate", "7"]).unwrap();
        assert_eq!(s.provider, ProviderKind::Sim);
        assert_eq!(s.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(s.budget.rate, 7.0);
        assert_eq!(s.sim.zones, ["z1"]);

        std::fs::write(&file, "listn: 127.0.0.1:9000\n").unwrap();
        let problems = parse(&["--config", path]).unwrap_err();
        assert!(problems.to_string().contains("listn"), "{problems}");
    }
}
