//! The typed gateway client every controller uses: it names the cluster on
//! every call, sends the bearer token, sets a deadline, and retries
//! retryable failures with jittered exponential backoff.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::error::{Error, Result};
use crate::reason;
use crate::v1::instances_client::InstancesClient;
use crate::v1::load_balancers_client::LoadBalancersClient;
use crate::v1::provider_client::ProviderClient;
use crate::v1::routes_client::RoutesClient;
use crate::v1::sim_admin_client::SimAdminClient;
use crate::v1::volumes_client::VolumesClient;
use crate::v1::{
    CreateRouteRequest, DeleteLoadBalancerRequest, DeleteRouteRequest, EnsureLoadBalancerRequest,
    EnsureLoadBalancerResponse, GetInstancesRequest, GetLoadBalancerRequest,
    GetLoadBalancerResponse, GetProviderInfoRequest, GetProviderInfoResponse, Host, InstanceResult,
    ListLoadBalancersRequest, ListRoutesRequest, LoadBalancer, LoadBalancerSpec,
    LoadBalancerStatus, LookupPurpose, NodeRef, Route, ServiceRef, TagInstancesRequest, TagResult,
    UpdateLoadBalancerHostsRequest,
};

/// How often a token file is read again, so rotated tokens are picked up.
const TOKEN_FILE_REFRESH: Duration = Duration::from_secs(30);

/// Where the client gets its bearer token.
#[derive(Clone, Debug)]
pub enum TokenSource {
    /// A fixed token.
    Static(String),
    /// A file holding the token, read again every 30 s (projected
    /// ServiceAccount tokens rotate).
    File(PathBuf),
    /// No token: the caller is known by its client certificate
    /// ([`ClientConfig::client_cert`]).
    None,
}

/// When and how often to retry.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 disables retries.
    pub max_attempts: u32,
    /// The first backoff; it doubles per attempt.
    pub base_backoff: Duration,
    /// The largest backoff.
    pub max_backoff: Duration,
    /// A "retry after" longer than this is handed to the caller instead of
    /// being waited out inside the call.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            max_retry_after: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// No retries: every failure goes straight to the caller.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// How long to wait before attempt `attempt + 1` after `err`, or `None`
    /// to give up. Attempts count from 1.
    pub fn delay_after(&self, err: &Error, attempt: u32) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        match err {
            // Provisioning delays are the caller's to schedule (requeue
            // after D), never to be slept through inside one call.
            Error::RetryAfter { delay, reason, .. }
                if reason != reason::PROVISIONING && *delay <= self.max_retry_after =>
            {
                Some(*delay + jitter(*delay / 10))
            }
            Error::Unavailable { .. } => {
                let exp = self
                    .base_backoff
                    .saturating_mul(1 << (attempt - 1).min(16))
                    .min(self.max_backoff);
                // Full jitter spreads out callers that failed together.
                Some(exp / 2 + jitter(exp / 2))
            }
            _ => None,
        }
    }
}

fn jitter(max: Duration) -> Duration {
    let nanos = max.as_nanos().min(u64::MAX as u128) as u64;
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(fastrand::u64(0..=nanos))
}

/// How to reach the gateway.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The gateway's address, `http://host:port` or `https://host:port`.
    pub address: String,
    /// The cluster this client acts for; sent on every call.
    pub cluster_name: String,
    /// The bearer token.
    pub token: TokenSource,
    /// The deadline of each attempt.
    pub timeout: Duration,
    /// Retries.
    pub retry: RetryPolicy,
    /// The PEM CA bundle the gateway's certificate is verified against;
    /// required for `https://`, read again when it changes.
    pub tls_ca: Option<PathBuf>,
    /// The name the gateway's certificate must carry, when the address is
    /// not it (an IP address, such as a Service's from the environment).
    pub tls_server_name: Option<String>,
    /// A client certificate and key (PEM) to present: the gateway maps its
    /// identity to a role, and no token is needed. Read once, here.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl ClientConfig {
    /// A config with default timeout (10 s) and retries.
    pub fn new(
        address: impl Into<String>,
        cluster_name: impl Into<String>,
        token: TokenSource,
    ) -> Self {
        Self {
            address: address.into(),
            cluster_name: cluster_name.into(),
            token,
            timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            tls_ca: None,
            tls_server_name: None,
            client_cert: None,
        }
    }
}

/// The `authorization` header every call carries.
type Header = MetadataValue<tonic::metadata::Ascii>;

/// The bearer token as a ready header: built once for a fixed token, once
/// per read for a token file.
#[derive(Debug)]
enum Token {
    None,
    Static(Header),
    File {
        path: PathBuf,
        cached: Mutex<Option<(Instant, Header)>>,
    },
}

impl Token {
    fn new(source: TokenSource) -> Result<Self> {
        Ok(match source {
            TokenSource::None => Token::None,
            TokenSource::Static(token) => Token::Static(bearer(&token)?),
            TokenSource::File(path) => Token::File {
                path,
                cached: Mutex::new(None),
            },
        })
    }

    /// Forgets the token read from a file, so the next call reads it again:
    /// a rotated token is picked up at once instead of after the refresh
    /// interval. Returns whether there was anything to forget.
    fn forget(&self) -> bool {
        match self {
            Token::None | Token::Static(_) => false,
            Token::File { cached, .. } => cached
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .is_some(),
        }
    }

    fn header(&self) -> Result<Option<Header>> {
        match self {
            Token::None => Ok(None),
            Token::Static(header) => Ok(Some(header.clone())),
            Token::File { path, cached } => {
                let mut cached = cached.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((read_at, header)) = &*cached
                    && read_at.elapsed() < TOKEN_FILE_REFRESH
                {
                    return Ok(Some(header.clone()));
                }
                let token = std::fs::read_to_string(path).map_err(|e| {
                    Error::Config(format!("read token file {}: {e}", path.display()))
                })?;
                let header = bearer(token.trim())?;
                *cached = Some((Instant::now(), header.clone()));
                Ok(Some(header))
            }
        }
    }
}

fn bearer(token: &str) -> Result<Header> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| Error::Config("the token has characters not allowed in a header".into()))
}

/// One RPC of the contract: its method name, and the name its client span
/// carries (`cloudgateway.v1/GetInstances`), both fixed at compile time.
#[derive(Clone, Copy, Debug)]
struct Rpc {
    method: &'static str,
    span: &'static str,
}

macro_rules! rpc {
    ($method:literal) => {
        Rpc {
            method: $method,
            span: concat!("cloudgateway.v1/", $method),
        }
    };
}

/// A typed method of the Volumes service: the request's cluster is this
/// client's, and the call has the token, deadline and retries of every
/// other.
macro_rules! volume_rpc {
    ($(#[$doc:meta])* $name:ident, $method:literal, $req:ident => $resp:ident) => {
        $(#[$doc])*
        pub async fn $name(&self, mut req: crate::v1::$req) -> Result<crate::v1::$resp> {
            req.cluster_name = self.cluster_name.clone();
            self.call(rpc!($method), req, |ch, r| async move {
                VolumesClient::new(ch).$name(r).await
            })
            .await
        }
    };
}

/// Whether the gateway answers this client: when it last answered (any
/// status the gateway itself sent counts), and the last attempt it did
/// not answer (no connection, or no answer within the deadline).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// When the gateway last answered.
    pub last_answer: Option<SystemTime>,
    /// When an attempt last got no answer, and why.
    pub last_no_answer: Option<(SystemTime, String)>,
}

impl Reach {
    /// Whether the last attempt got no answer.
    pub fn unreachable(&self) -> bool {
        match (&self.last_no_answer, self.last_answer) {
            (Some((failed, _)), Some(answered)) => *failed > answered,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    fn note(&mut self, answered: std::result::Result<(), String>) {
        let now = SystemTime::now();
        match answered {
            Ok(()) => self.last_answer = Some(now),
            Err(why) => self.last_no_answer = Some((now, why)),
        }
    }
}

/// TLS for an `https://` address: the gateway verified against the CA
/// bundle file (reloaded), never a fallback to plaintext; `http://` only
/// to this machine.
fn secure(endpoint: Endpoint, config: &ClientConfig) -> Result<Endpoint> {
    let tls_files = config.tls_ca.is_some() || config.client_cert.is_some();
    if !check_transport(&config.address, tls_files).map_err(Error::Config)? {
        return Ok(endpoint);
    }
    let host = endpoint.uri().host().unwrap_or_default().to_owned();
    let ca = config.tls_ca.as_ref().ok_or_else(|| {
        Error::Config(format!(
            "gateway address {:?}: https needs the CA bundle that signed the gateway's certificate",
            config.address
        ))
    })?;
    let verifier = crate::tls::CaFile::new(ca.clone()).map_err(Error::Config)?;
    let mut tls =
        ClientTlsConfig::new().domain_name(config.tls_server_name.clone().unwrap_or_else(|| {
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        }));
    if let Some((cert, key)) = &config.client_cert {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| Error::Config(format!("read {}: {e}", path.display())))
        };
        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    endpoint
        .tls_config_with_verifier(tls, Arc::new(verifier))
        .map_err(|e| Error::Config(format!("TLS: {e}")))
}

/// Whether `address` is one to reach over TLS (`https://`), or an error
/// saying why it may not be used: plaintext (`http://`) only to this
/// machine and with no TLS files given, and no other scheme.
pub fn check_transport(address: &str, tls_files: bool) -> std::result::Result<bool, String> {
    let uri: http::Uri = address
        .parse()
        .map_err(|e| format!("gateway address {address:?}: {e}"))?;
    match uri.scheme_str() {
        Some("https") => Ok(true),
        Some("http") if tls_files => Err(format!(
            "gateway address {address:?} is plaintext but TLS files are given: use https://"
        )),
        Some("http") if crate::tls::is_loopback(uri.host().unwrap_or_default()) => Ok(false),
        Some("http") => Err(format!(
            "gateway address {address:?}: plaintext only to this machine (localhost, 127.0.0.1); use https:// with the gateway's CA bundle"
        )),
        _ => Err(format!(
            "gateway address {address:?}: use https://host:port"
        )),
    }
}

/// A typed, cheaply cloneable client of every gateway service.
#[derive(Clone, Debug)]
pub struct GatewayClient {
    channel: Channel,
    cluster_name: String,
    token: Arc<Token>,
    timeout: Duration,
    retry: RetryPolicy,
    reach: Arc<Mutex<Reach>>,
}

impl GatewayClient {
    /// Builds a client. The connection is made on first use, so a gateway
    /// that is not up yet is not an error here; a fixed token that cannot
    /// be a header is.
    pub fn new(config: ClientConfig) -> Result<Self> {
        let mut endpoint = Endpoint::from_shared(config.address.clone())
            .map_err(|e| Error::Config(format!("gateway address {:?}: {e}", config.address)))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        endpoint = secure(endpoint, &config)?;
        Ok(Self {
            channel: endpoint.connect_lazy(),
            cluster_name: config.cluster_name,
            token: Arc::new(Token::new(config.token)?),
            timeout: config.timeout,
            retry: config.retry,
            reach: Arc::default(),
        })
    }

    /// Whether the gateway has been answering this client.
    pub fn reach(&self) -> Reach {
        self.reach.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn note_reach(&self, answered: std::result::Result<(), String>) {
        self.reach
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(answered);
    }

    /// The cluster this client names on every call.
    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }

    /// Runs one RPC with token, deadline and retries, as a client span
    /// whose W3C trace context goes with the request (when traces are on).
    async fn call<Req, Resp, F, Fut>(&self, name: Rpc, req: Req, rpc: F) -> Result<Resp>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<Response<Resp>, Status>>,
    {
        let span = tracing::info_span!(
            target: crate::spans::CALL_SPANS,
            "gateway call",
            otel.name = name.span,
            otel.kind = "client",
            rpc.method = name.method,
            attempts = tracing::field::Empty,
        );
        self.attempts(req, rpc).instrument(span).await
    }

    async fn attempts<Req, Resp, F, Fut>(&self, req: Req, rpc: F) -> Result<Resp>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<Response<Resp>, Status>>,
    {
        let mut attempt = 1;
        let mut reread = false;
        loop {
            let span = tracing::Span::current();
            let mut request = Request::new(req.clone());
            request.set_timeout(self.timeout);
            if let Some(header) = self.token.header()? {
                request.metadata_mut().insert("authorization", header);
            }
            // A span no subscriber wants (logs above info, no traces) has
            // no context to send.
            if !span.is_disabled() {
                span.record("attempts", attempt);
                let context = span.context();
                opentelemetry::global::get_text_map_propagator(|propagator| {
                    propagator
                        .inject_context(&context, &mut MetadataInjector(request.metadata_mut()))
                });
            }
            let started = Instant::now();
            // The deadline is enforced here as well as sent: a gateway that
            // stops answering must not hang the caller.
            let outcome =
                tokio::time::timeout(self.timeout, rpc(self.channel.clone(), request)).await;
            self.note_reach(match &outcome {
                Ok(Err(status)) if no_answer(status) => Err(status.message().to_owned()),
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
                Ok(_) => Ok(()),
            });
            let err = match outcome {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                // A tonic server answers an expired grpc-timeout with
                // CANCELLED (ours says DEADLINE_EXCEEDED; a vendor's may
                // not); past our own deadline, that is what it means.
                Ok(Err(status))
                    if status.code() == tonic::Code::Cancelled
                        && started.elapsed() >= self.timeout =>
                {
                    deadline_exceeded(self.timeout)
                }
                Ok(Err(status)) => Error::from_status(status),
                Err(_) => deadline_exceeded(self.timeout),
            };
            // A refused token may have been rotated on disk since it was
            // read: read it again and retry once.
            if matches!(err, Error::Unauthenticated { .. }) && !reread && self.token.forget() {
                reread = true;
                continue;
            }
            let Some(delay) = self.retry.delay_after(&err, attempt) else {
                return Err(err);
            };
            tracing::debug!(attempt, ?delay, error = %err, "retrying gateway call");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// What the provider is and supports.
    pub async fn provider_info(&self) -> Result<GetProviderInfoResponse> {
        self.call(
            rpc!("GetProviderInfo"),
            GetProviderInfoRequest {},
            |ch, r| async move { ProviderClient::new(ch).get_provider_info(r).await },
        )
        .await
    }

    /// Looks up the instances behind `nodes`, one result per node in order.
    pub async fn get_instances(
        &self,
        nodes: Vec<NodeRef>,
        purpose: LookupPurpose,
        fresh: bool,
    ) -> Result<Vec<InstanceResult>> {
        self.get_instances_drained(nodes, purpose, fresh, false)
            .await
    }

    /// [`Self::get_instances`], saying with `queue_drained` that nothing
    /// more waits behind these nodes: the gateway sends their batch
    /// without waiting for more.
    pub async fn get_instances_drained(
        &self,
        nodes: Vec<NodeRef>,
        purpose: LookupPurpose,
        fresh: bool,
        queue_drained: bool,
    ) -> Result<Vec<InstanceResult>> {
        let req = GetInstancesRequest {
            cluster_name: self.cluster_name.clone(),
            nodes,
            fresh,
            purpose: purpose.into(),
            queue_drained,
        };
        let resp = self
            .call(rpc!("GetInstances"), req, |ch, r| async move {
                InstancesClient::new(ch).get_instances(r).await
            })
            .await?;
        Ok(resp.results)
    }

    /// Adds `tags` to the instances behind `nodes` (each by provider ID),
    /// or with `remove` takes them away; one result per node in order.
    pub async fn tag_instances(
        &self,
        nodes: Vec<NodeRef>,
        tags: std::collections::HashMap<String, String>,
        remove: bool,
    ) -> Result<Vec<TagResult>> {
        let req = TagInstancesRequest {
            cluster_name: self.cluster_name.clone(),
            nodes,
            tags,
            remove,
        };
        let resp = self
            .call(rpc!("TagInstances"), req, |ch, r| async move {
                InstancesClient::new(ch).tag_instances(r).await
            })
            .await?;
        Ok(resp
            .results
            .into_iter()
            .map(|r| TagResult::try_from(r).unwrap_or(TagResult::Unspecified))
            .collect())
    }

    /// Whether the Service's load balancer exists, and its status.
    pub async fn get_load_balancer(&self, service: ServiceRef) -> Result<GetLoadBalancerResponse> {
        let req = GetLoadBalancerRequest {
            cluster_name: self.cluster_name.clone(),
            service: Some(service),
        };
        self.call(rpc!("GetLoadBalancer"), req, |ch, r| async move {
            LoadBalancersClient::new(ch).get_load_balancer(r).await
        })
        .await
    }

    /// Creates or updates the Service's load balancer.
    pub async fn ensure_load_balancer(
        &self,
        spec: LoadBalancerSpec,
        hosts: Vec<Host>,
    ) -> Result<LoadBalancerStatus> {
        let answer = self.ensure_load_balancer_answer(spec, hosts).await?;
        Ok(answer.status.unwrap_or_default())
    }

    /// [`Self::ensure_load_balancer`], with the whole answer: its
    /// `adopted` says when the gateway took over a load balancer another
    /// controller made.
    pub async fn ensure_load_balancer_answer(
        &self,
        spec: LoadBalancerSpec,
        hosts: Vec<Host>,
    ) -> Result<EnsureLoadBalancerResponse> {
        let req = EnsureLoadBalancerRequest {
            cluster_name: self.cluster_name.clone(),
            spec: Some(spec),
            hosts,
        };
        self.call(rpc!("EnsureLoadBalancer"), req, |ch, r| async move {
            LoadBalancersClient::new(ch).ensure_load_balancer(r).await
        })
        .await
    }

    /// Replaces the backend hosts of the Service's load balancer.
    pub async fn update_load_balancer_hosts(
        &self,
        spec: LoadBalancerSpec,
        hosts: Vec<Host>,
    ) -> Result<()> {
        let req = UpdateLoadBalancerHostsRequest {
            cluster_name: self.cluster_name.clone(),
            spec: Some(spec),
            hosts,
        };
        self.call(rpc!("UpdateLoadBalancerHosts"), req, |ch, r| async move {
            LoadBalancersClient::new(ch)
                .update_load_balancer_hosts(r)
                .await
        })
        .await
        .map(drop)
    }

    /// Deletes the Service's load balancer; succeeds when it is gone already.
    pub async fn delete_load_balancer(&self, service: ServiceRef) -> Result<()> {
        let req = DeleteLoadBalancerRequest {
            cluster_name: self.cluster_name.clone(),
            service: Some(service),
        };
        self.call(rpc!("DeleteLoadBalancer"), req, |ch, r| async move {
            LoadBalancersClient::new(ch).delete_load_balancer(r).await
        })
        .await
        .map(drop)
    }

    /// Every load balancer this cluster owns.
    pub async fn list_load_balancers(&self) -> Result<Vec<LoadBalancer>> {
        let req = ListLoadBalancersRequest {
            cluster_name: self.cluster_name.clone(),
        };
        let resp = self
            .call(rpc!("ListLoadBalancers"), req, |ch, r| async move {
                LoadBalancersClient::new(ch).list_load_balancers(r).await
            })
            .await?;
        Ok(resp.load_balancers)
    }

    /// Every route this cluster owns.
    pub async fn list_routes(&self) -> Result<Vec<Route>> {
        let req = ListRoutesRequest {
            cluster_name: self.cluster_name.clone(),
        };
        let resp = self
            .call(rpc!("ListRoutes"), req, |ch, r| async move {
                RoutesClient::new(ch).list_routes(r).await
            })
            .await?;
        Ok(resp.routes)
    }

    /// Creates a route (idempotent); `name_hint` is the target Node's UID.
    pub async fn create_route(&self, name_hint: impl Into<String>, route: Route) -> Result<Route> {
        let req = CreateRouteRequest {
            cluster_name: self.cluster_name.clone(),
            name_hint: name_hint.into(),
            route: Some(route),
        };
        let resp = self
            .call(rpc!("CreateRoute"), req, |ch, r| async move {
                RoutesClient::new(ch).create_route(r).await
            })
            .await?;
        resp.route
            .ok_or_else(|| Error::Config("gateway answered CreateRoute without a route".into()))
    }

    /// Deletes a route; succeeds when it is gone already.
    pub async fn delete_route(&self, route: Route) -> Result<()> {
        let req = DeleteRouteRequest {
            cluster_name: self.cluster_name.clone(),
            route: Some(route),
        };
        self.call(rpc!("DeleteRoute"), req, |ch, r| async move {
            RoutesClient::new(ch).delete_route(r).await
        })
        .await
        .map(drop)
    }

    volume_rpc!(
        /// Creates a volume, or answers the one of the same name.
        create_volume, "CreateVolume", CreateVolumeRequest => CreateVolumeResponse
    );
    volume_rpc!(
        /// Deletes a volume; succeeds when it is gone already.
        delete_volume, "DeleteVolume", DeleteVolumeRequest => DeleteVolumeResponse
    );
    volume_rpc!(
        /// One volume as the cloud has it.
        get_volume, "GetVolume", GetVolumeRequest => GetVolumeResponse
    );
    volume_rpc!(
        /// The cluster's volumes, a page at a time.
        list_volumes, "ListVolumes", ListVolumesRequest => ListVolumesResponse
    );
    volume_rpc!(
        /// Attaches a volume to an instance under a device the gateway picks.
        attach_volume, "AttachVolume", AttachVolumeRequest => AttachVolumeResponse
    );
    volume_rpc!(
        /// Detaches a volume from an instance; succeeds when it is not there.
        detach_volume, "DetachVolume", DetachVolumeRequest => DetachVolumeResponse
    );
    volume_rpc!(
        /// Grows a volume.
        expand_volume, "ExpandVolume", ExpandVolumeRequest => ExpandVolumeResponse
    );
    volume_rpc!(
        /// Changes a volume's mutable parameters.
        modify_volume, "ModifyVolume", ModifyVolumeRequest => ModifyVolumeResponse
    );
    volume_rpc!(
        /// Snapshots a volume, or answers the snapshot of the same name.
        create_snapshot, "CreateSnapshot", CreateSnapshotRequest => CreateSnapshotResponse
    );
    volume_rpc!(
        /// Deletes a snapshot; succeeds when it is gone already.
        delete_snapshot, "DeleteSnapshot", DeleteSnapshotRequest => DeleteSnapshotResponse
    );
    volume_rpc!(
        /// The cluster's snapshots, a page at a time.
        list_snapshots, "ListSnapshots", ListSnapshotsRequest => ListSnapshotsResponse
    );

    /// The raw SimAdmin client with this client's token, for the sandbox,
    /// tests and the command line. Calls through it are not retried.
    pub fn sim_admin(&self) -> Result<SimAdminClient<AuthorizedChannel>> {
        Ok(SimAdminClient::new(self.authorized_channel()?))
    }

    /// The connection, with no token: for the services open to everyone
    /// (health, reflection).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The connection with this client's token on every call, for raw
    /// calls outside the typed methods (the conformance suite sends bytes
    /// that are not a message). Not retried, no deadline of its own.
    pub fn authorized_channel(&self) -> Result<AuthorizedChannel> {
        let header = self.token.header()?;
        Ok(tonic::service::interceptor::InterceptedService::new(
            self.channel.clone(),
            AuthInterceptor { header },
        ))
    }
}

/// Writes W3C trace context into a request's metadata.
struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl opentelemetry::propagation::Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// Whether `status` is tonic's own word that no answer came (no
/// connection, a broken one), not one the gateway sent: tonic makes those
/// from a transport error, which it keeps as the status's source; a status
/// the gateway sent has none.
fn no_answer(status: &Status) -> bool {
    use std::error::Error as _;
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown
    ) && status.source().is_some()
}

fn deadline_exceeded(timeout: Duration) -> Error {
    Error::DeadlineExceeded {
        message: format!("no answer within {timeout:?}"),
    }
}

/// A connection that sends a fixed token on every call.
pub type AuthorizedChannel =
    tonic::service::interceptor::InterceptedService<Channel, AuthInterceptor>;

/// Adds a fixed `authorization` header to every request (none where the
/// caller has no token).
#[derive(Clone, Debug)]
pub struct AuthInterceptor {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> Error {
        Error::Unavailable {
            message: String::new(),
        }
    }

    fn retry_after(reason: &str, secs: u64) -> Error {
        Error::RetryAfter {
            delay: Duration::from_secs(secs),
            reason: reason.into(),
            message: String::new(),
        }
    }

    #[test]
    fn unavailable_is_retried_with_bounded_backoff_until_attempts_run_out() {
        let policy = RetryPolicy::default();
        for attempt in 1..policy.max_attempts {
            let delay = policy
                .delay_after(&unavailable(), attempt)
                .expect("retried");
            assert!(delay <= policy.max_backoff);
        }
        assert_eq!(
            policy.delay_after(&unavailable(), policy.max_attempts),
            None
        );
    }

    #[test]
    fn provisioning_is_left_to_the_caller() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.delay_after(&retry_after(reason::PROVISIONING, 1), 1),
            None
        );
    }

    #[test]
    fn short_throttling_delays_are_waited_out_long_ones_are_not() {
        let policy = RetryPolicy::default();
        let short = policy
            .delay_after(&retry_after(reason::CLOUD_THROTTLED, 1), 1)
            .expect("short delay retried");
        assert!(short >= Duration::from_secs(1));
        assert_eq!(
            policy.delay_after(&retry_after(reason::CLOUD_THROTTLED, 60), 1),
            None
        );
    }

    #[test]
    fn caller_errors_are_never_retried() {
        let policy = RetryPolicy::default();
        let invalid = Error::InvalidArgument {
            violations: vec![],
            message: String::new(),
        };
        let denied = Error::PermissionDenied {
            reason: String::new(),
            message: String::new(),
        };
        assert_eq!(policy.delay_after(&invalid, 1), None);
        assert_eq!(policy.delay_after(&denied, 1), None);
    }
}
