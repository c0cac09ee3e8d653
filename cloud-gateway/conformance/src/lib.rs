//! The contract checks `gateway-conformance` runs against any
//! `cloudgateway.v1` gateway: each names the rule of the contract it tests
//! (`proto/CONTRACT.md` lists the rules, each with its check's name; the
//! fields are in the proto comments) and passes, fails with what it saw,
//! or is skipped with why. They use only the public gRPC contract and the
//! callers' tokens, never anything of our gateway's insides, so a vendor's
//! gateway in any language can be checked the same way.

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use ccm_proto::v1::sim_admin_client::SimAdminClient;
use ccm_proto::v1::{
    CreateInstanceRequest, Faults, GetFaultsRequest, GetInstancesRequest, Host, InstanceId,
    InstanceState, LoadBalancerSpec, LoadBalancerStatus, LookupPurpose, NodeRef, Protocol,
    ServicePort, ServiceRef, SimInstance,
};
use ccm_proto::{
    AuthorizedChannel, ClientConfig, Error, GatewayClient, RetryPolicy, TokenSource, reason,
};
use prost::Message as _;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

/// Every check, in the order [`run`] runs them. `proto/CONTRACT.md` names
/// each beside its rule.
pub const CHECKS: [&str; 24] = [
    "health.serving",
    "health.reflection",
    "provider.info",
    "auth.no-token",
    "auth.wrong-role",
    "provider.unimplemented",
    "request.malformed-cluster",
    "request.undecodable",
    "request.deadline",
    "instances.foreign-provider-id",
    "instances.not-found",
    "instances.found-by-name",
    "instances.batch-in-order",
    "instances.lifecycle",
    "lb.update-hosts-missing",
    "lb.invalid-spec",
    "lb.invalid-annotation",
    "lb.ensure-idempotent",
    "lb.update-hosts",
    "lb.provisioning",
    "lb.delete-idempotent",
    "routes.delete-missing",
    "routes.create-idempotent",
    "routes.blackhole",
];

/// Where the gateway is and who may call it.
#[derive(Clone, Debug)]
pub struct Target {
    /// `http://host:port` or `https://host:port`.
    pub address: String,
    /// A PEM CA bundle for https.
    pub tls_ca: Option<std::path::PathBuf>,
    /// The token of each role (`node`, `service`, `route`, and `admin` for
    /// the admin hook).
    pub tokens: std::collections::BTreeMap<String, TokenSource>,
    /// The cluster the checks act for; the cloud must be set up for it
    /// (on AWS: subnets and route tables tagged for it).
    pub cluster: String,
    /// A second cluster, which must never see the first one's resources.
    pub other_cluster: String,
    /// The name of a node whose instance exists, for checks that need one;
    /// without it, one is made through the admin hook where there is one.
    pub node: Option<String>,
    /// An annotation (key, value) the provider refuses, for the check that
    /// a refused annotation writes nothing.
    pub invalid_annotation: Option<(String, String)>,
    /// The longest any one check may wait (for provisioning, say).
    pub patience: Duration,
}

/// How a check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

/// One check's result.
#[derive(Clone, Debug)]
pub struct Checked {
    /// Short name, e.g. `lb.ensure-idempotent`.
    pub name: &'static str,
    /// The rule of the contract it tests.
    pub rule: &'static str,
    pub outcome: Outcome,
}

impl std::fmt::Display for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Outcome::Pass => write!(f, "PASS {} ({})", self.name, self.rule),
            Outcome::Fail(why) => write!(f, "FAIL {} ({}): {why}", self.name, self.rule),
            Outcome::Skip(why) => write!(f, "SKIP {} ({}): {why}", self.name, self.rule),
        }
    }
}

type Check = Result<Outcome, String>;

fn fail(why: impl Into<String>) -> Check {
    Err(why.into())
}

impl Target {
    fn client(&self, role: &str, cluster: &str) -> Result<GatewayClient, String> {
        let token = self
            .tokens
            .get(role)
            .cloned()
            .ok_or_else(|| format!("no token for the {role} role"))?;
        self.client_with(token, cluster)
    }

    fn client_with(&self, token: TokenSource, cluster: &str) -> Result<GatewayClient, String> {
        let mut config = ClientConfig::new(self.address.clone(), cluster, token);
        config.retry = RetryPolicy::none();
        config.tls_ca = self.tls_ca.clone();
        GatewayClient::new(config).map_err(|e| e.to_string())
    }
}

fn service(uid: &str) -> ServiceRef {
    ServiceRef {
        namespace: "conformance".into(),
        name: format!("svc-{}", &uid[..8]),
        uid: uid.into(),
    }
}

fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn spec(uid: &str) -> LoadBalancerSpec {
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

/// Ensures until the load balancer is provisioned, as a controller does:
/// PROVISIONING must come with a retry delay, and is asked again after it.
async fn ensure(
    client: &GatewayClient,
    spec: &LoadBalancerSpec,
    hosts: &[Host],
    patience: Duration,
) -> Result<LoadBalancerStatus, String> {
    let start = Instant::now();
    loop {
        match client
            .ensure_load_balancer(spec.clone(), hosts.to_vec())
            .await
        {
            Ok(status) => return Ok(status),
            Err(Error::RetryAfter {
                reason: r, delay, ..
            }) if r == reason::PROVISIONING => {
                if start.elapsed() > patience {
                    return Err(format!("still provisioning after {patience:?}"));
                }
                tokio::time::sleep(delay.min(Duration::from_secs(5))).await;
            }
            Err(e) => return Err(format!("ensure: {e}")),
        }
    }
}

async fn lb_count(client: &GatewayClient, uid: &str) -> Result<usize, String> {
    Ok(client
        .list_load_balancers()
        .await
        .map_err(|e| format!("list: {e}"))?
        .iter()
        .filter(|lb| lb.service.as_ref().is_some_and(|s| s.uid == uid))
        .count())
}

/// The gRPC names of Provider and each service the provider offers.
fn offered_services(info: Option<&ccm_proto::v1::GetProviderInfoResponse>) -> Vec<String> {
    let mut names = vec!["cloudgateway.v1.Provider".to_owned()];
    if let Some(i) = info {
        for (offered, name) in [
            (i.instances, "Instances"),
            (i.load_balancers, "LoadBalancers"),
            (i.routes, "Routes"),
        ] {
            if offered {
                names.push(format!("cloudgateway.v1.{name}"));
            }
        }
    }
    names
}

async fn lb_hosts(client: &GatewayClient, uid: &str) -> Result<Vec<String>, String> {
    Ok(client
        .list_load_balancers()
        .await
        .map_err(|e| format!("list: {e}"))?
        .into_iter()
        .filter(|lb| lb.service.as_ref().is_some_and(|s| s.uid == uid))
        .flat_map(|lb| lb.hosts)
        .collect())
}

/// The one answer for `node`, fresh from the cloud.
async fn lookup(
    client: &GatewayClient,
    node: NodeRef,
) -> Result<ccm_proto::v1::InstanceResult, String> {
    let mut answers = client
        .get_instances(vec![node.clone()], LookupPurpose::Lifecycle, true)
        .await
        .map_err(|e| format!("look up {node:?}: {e}"))?;
    match answers.len() {
        1 => Ok(answers.remove(0)),
        n => Err(format!("{n} answers for one node")),
    }
}

/// The backend host a Service would get for the node `name`.
async fn host(target: &Target, name: &str) -> Result<Host, String> {
    let answer = lookup(
        &target.client("node", &target.cluster)?,
        NodeRef {
            name: name.to_owned(),
            provider_id: String::new(),
        },
    )
    .await?;
    let instance = answer
        .instance
        .ok_or_else(|| format!("node {name} has no instance ({:?})", answer.state))?;
    Ok(Host {
        name: name.to_owned(),
        provider_id: instance.provider_id,
        addresses: instance.addresses,
        labels: Default::default(),
    })
}

/// The admin hook: the subset of `SimAdmin` a gateway offers the `admin`
/// token to act as the cloud's console would (create, stop and terminate
/// instances; make calls slow and load balancers slow to provision).
#[derive(Clone)]
struct Hook(SimAdminClient<AuthorizedChannel>);

impl Hook {
    /// The hook, or why there is none (no admin token, or the gateway does
    /// not serve it to that token).
    async fn probe(target: &Target) -> Result<Hook, String> {
        let client = target
            .client("admin", &target.cluster)
            .map_err(|_| "no admin token, so no admin hook".to_owned())?;
        let mut admin =
            SimAdminClient::new(client.authorized_channel().map_err(|e| e.to_string())?);
        match admin.get_faults(GetFaultsRequest {}).await {
            Ok(_) => Ok(Hook(admin)),
            Err(status) => Err(format!(
                "the gateway offers no admin hook (GetFaults: {:?})",
                status.code()
            )),
        }
    }

    async fn create(&self, prefix: &str) -> Result<SimInstance, String> {
        let name = format!("{prefix}-{:08x}", fastrand::u32(..));
        self.0
            .clone()
            .create_instance(CreateInstanceRequest {
                name: name.clone(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|e| format!("admin hook: create instance {name}: {}", e.message()))
    }

    /// Stops the instance (it still exists), or terminates it for good.
    async fn end(&self, instance: &SimInstance, terminate: bool) -> Result<(), String> {
        let mut admin = self.0.clone();
        let id = InstanceId {
            id: instance.id.clone(),
        };
        let (verb, done) = if terminate {
            ("terminate", admin.terminate_instance(id).await.map(|_| ()))
        } else {
            ("stop", admin.stop_instance(id).await.map(|_| ()))
        };
        done.map_err(|e| format!("admin hook: {verb} {}: {}", instance.id, e.message()))
    }

    /// Changes the injected faults; returns the ones before, to restore.
    async fn faults(&self, change: impl FnOnce(&mut Faults)) -> Result<Faults, String> {
        let mut admin = self.0.clone();
        let before = admin
            .get_faults(GetFaultsRequest {})
            .await
            .map_err(|e| format!("admin hook: get faults: {}", e.message()))?
            .into_inner();
        let mut faults = before.clone();
        change(&mut faults);
        self.set_faults(faults).await?;
        Ok(before)
    }

    async fn set_faults(&self, faults: Faults) -> Result<(), String> {
        self.0
            .clone()
            .set_faults(faults)
            .await
            .map(|_| ())
            .map_err(|e| format!("admin hook: set faults: {}", e.message()))
    }
}

/// Passes bytes through untouched, to send what is not a message.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// One unary call of `path` with `body` sent as it is.
async fn raw_unary(
    client: &GatewayClient,
    path: &'static str,
    body: Bytes,
) -> Result<Bytes, Status> {
    let channel = client
        .authorized_channel()
        .map_err(|e| Status::internal(e.to_string()))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    grpc.unary(
        tonic::Request::new(body),
        http::uri::PathAndQuery::from_static(path),
        RawCodec,
    )
    .await
    .map(|r| r.into_inner())
}

const GET_INSTANCES: &str = "/cloudgateway.v1.Instances/GetInstances";

/// A gRPC message on the wire: uncompressed flag, length, message.
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

/// One unary call over a bare HTTP/2 connection with `grpc-timeout` set to
/// `deadline`: a gRPC client library would enforce that deadline itself and
/// hide what the gateway does at it. Returns the gateway's code and how long
/// it took to answer.
async fn call_with_deadline(
    address: &str,
    token: &TokenSource,
    path: &str,
    message: &[u8],
    deadline: Duration,
) -> Result<(Code, Duration), String> {
    let token = match token {
        TokenSource::Static(token) => token.clone(),
        TokenSource::File(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("read {}: {e}", path.display()))?
            .trim()
            .to_owned(),
    };
    let authority = address.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connect {authority}: {e}"))?;
    let (send, connection) = h2::client::handshake(tcp)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    let driver = tokio::spawn(connection);
    let request = http::Request::post(format!("{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .header("grpc-timeout", format!("{}m", deadline.as_millis()))
        .body(())
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let answer = async {
        let mut send = send.ready().await?;
        let (response, mut body) = send.send_request(request, false)?;
        body.send_data(grpc_frame(message), true)?;
        let response = response.await?;
        let status = |headers: &http::HeaderMap| {
            headers
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map(Code::from_i32)
        };
        if let Some(code) = status(response.headers()) {
            return Ok::<_, h2::Error>(code);
        }
        let mut body = response.into_body();
        while let Some(data) = body.data().await {
            data?;
        }
        Ok(body
            .trailers()
            .await?
            .as_ref()
            .and_then(status)
            .unwrap_or(Code::Unknown))
    };
    let answer = tokio::time::timeout(deadline + Duration::from_secs(5), answer).await;
    driver.abort();
    match answer {
        Ok(Ok(code)) => Ok((code, started.elapsed())),
        Ok(Err(e)) => Err(format!("the call failed at the HTTP/2 level: {e}")),
        Err(_) => Err(format!("no answer 5 s after a deadline of {deadline:?}")),
    }
}

/// Runs every check, in order; `on` sees each result as it comes.
pub async fn run(target: &Target, mut on: impl FnMut(&Checked)) -> Vec<Checked> {
    let mut out = Vec::new();
    let a = target.cluster.clone();
    let b = target.other_cluster.clone();
    let info = match target.client("service", &a) {
        Ok(c) => c.provider_info().await.ok(),
        Err(_) => None,
    };
    let has = |f: fn(&ccm_proto::v1::GetProviderInfoResponse) -> bool| info.as_ref().is_some_and(f);
    let hook = Hook::probe(target).await;
    // A node with an instance: the one named, or one made for the run.
    let mut made = None;
    let node = match (&target.node, &hook) {
        (Some(name), _) => Some(name.clone()),
        (None, Ok(hook)) if has(|i| i.instances) => match hook.create("conformance-node").await {
            Ok(instance) => {
                let name = instance.name.clone();
                made = Some(instance);
                Some(name)
            }
            Err(_) => None,
        },
        _ => None,
    };
    let no_node = || Outcome::Skip("no --node named and no admin hook to make one".into());
    // `check!(name, rule, body)`, or with a capability the check needs
    // (`instances`, `load_balancers`, `routes`): skipped without it.
    macro_rules! check {
        ($name:expr, $rule:expr, $cap:ident, $body:expr) => {{
            if has(|i| i.$cap) {
                check!($name, $rule, $body);
            } else {
                let checked = Checked {
                    name: $name,
                    rule: $rule,
                    outcome: Outcome::Skip(format!(
                        "the provider has no {} capability",
                        stringify!($cap)
                    )),
                };
                on(&checked);
                out.push(checked);
            }
        }};
        ($name:expr, $rule:expr, $body:expr) => {{
            let outcome = match $body.await {
                Ok(o) => o,
                Err(why) => Outcome::Fail(why),
            };
            let checked = Checked {
                name: $name,
                rule: $rule,
                outcome,
            };
            on(&checked);
            out.push(checked);
        }};
    }

    check!(
        "health.serving",
        "grpc.health.v1 answers SERVING for the server and each offered service",
        async {
            let channel = target
                .client_with(TokenSource::Static(String::new()), &a)?
                .channel();
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let mut services = vec![String::new()];
            services.extend(offered_services(info.as_ref()));
            for service in services {
                let answer = health
                    .check(tonic_health::pb::HealthCheckRequest {
                        service: service.clone(),
                    })
                    .await
                    .map_err(|e| format!("health of {service:?}: {e}"))?;
                if answer.get_ref().status
                    != tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return fail(format!("{service:?} is not SERVING"));
                }
            }
            Ok(Outcome::Pass)
        }
    );
    check!(
        "health.reflection",
        "server reflection (v1) lists the contract's services, without a token",
        async {
            let channel = target
                .client_with(TokenSource::Static(String::new()), &a)?
                .channel();
            let request = tonic_reflection::pb::v1::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let answer = tokio::time::timeout(Duration::from_secs(10), async {
                let mut stream = ServerReflectionClient::new(channel)
                    .server_reflection_info(tokio_stream::once(request))
                    .await?
                    .into_inner();
                stream.message().await
            })
            .await
            .map_err(|_| "no reflection answer in 10 s".to_owned())?
            .map_err(|e| format!("reflection: {e}"))?;
            let listed: Vec<String> = match answer.and_then(|a| a.message_response) {
                Some(MessageResponse::ListServicesResponse(list)) => {
                    list.service.into_iter().map(|s| s.name).collect()
                }
                other => return fail(format!("expected a list of services, got {other:?}")),
            };
            let expected = offered_services(info.as_ref());
            let missing: Vec<String> = expected
                .into_iter()
                .filter(|e| !listed.contains(e))
                .collect();
            if missing.is_empty() {
                Ok(Outcome::Pass)
            } else {
                fail(format!("reflection does not list {missing:?}"))
            }
        }
    );
    check!(
        "provider.info",
        "GetProviderInfo names the provider and its capabilities",
        async {
            match &info {
                Some(i) if !i.name.is_empty() => Ok(Outcome::Pass),
                Some(_) => fail("the provider's name is empty"),
                None => fail("GetProviderInfo failed"),
            }
        }
    );
    check!(
        "auth.no-token",
        "a call without a valid token is UNAUTHENTICATED",
        async {
            let client = target.client_with(TokenSource::Static("not-a-token".into()), &a)?;
            match client.provider_info().await {
                Err(Error::Unauthenticated { .. }) => Ok(Outcome::Pass),
                other => fail(format!("expected UNAUTHENTICATED, got {other:?}")),
            }
        }
    );
    check!(
        "auth.wrong-role",
        "a role calling a service it is not allowed is PERMISSION_DENIED",
        async {
            let client = target.client("route", &a)?;
            match client.get_load_balancer(service(&new_uid())).await {
                Err(Error::PermissionDenied { reason: r, .. }) if r == reason::ROLE_NOT_ALLOWED => {
                    Ok(Outcome::Pass)
                }
                other => fail(format!(
                    "expected PERMISSION_DENIED ({}), got {other:?}",
                    reason::ROLE_NOT_ALLOWED
                )),
            }
        }
    );
    check!(
        "provider.unimplemented",
        "a capability the provider lacks answers UNIMPLEMENTED",
        async {
            let Some(i) = &info else {
                return fail("no provider info");
            };
            let mut tried = 0;
            if !i.load_balancers {
                tried += 1;
                let c = target.client("service", &a)?;
                if !matches!(
                    c.list_load_balancers().await,
                    Err(Error::Unimplemented { .. })
                ) {
                    return fail("LoadBalancers is not UNIMPLEMENTED though not offered");
                }
            }
            if !i.routes {
                tried += 1;
                let c = target.client("route", &a)?;
                if !matches!(c.list_routes().await, Err(Error::Unimplemented { .. })) {
                    return fail("Routes is not UNIMPLEMENTED though not offered");
                }
            }
            Ok(if tried == 0 {
                Outcome::Skip("the provider offers every capability".into())
            } else {
                Outcome::Pass
            })
        }
    );
    check!(
        "request.malformed-cluster",
        "a cluster name that is not a DNS label is INVALID_ARGUMENT",
        async {
            let c = target.client("node", "Not_A_Label")?;
            match c
                .get_instances(
                    vec![NodeRef {
                        name: "n".into(),
                        provider_id: String::new(),
                    }],
                    LookupPurpose::Initialize,
                    true,
                )
                .await
            {
                Err(Error::InvalidArgument { violations, .. })
                    if violations.iter().any(|v| v.field == "cluster_name") =>
                {
                    Ok(Outcome::Pass)
                }
                other => fail(format!(
                    "expected INVALID_ARGUMENT naming cluster_name, got {other:?}"
                )),
            }
        }
    );
    check!(
        "request.undecodable",
        "bytes that are not a valid message are INVALID_ARGUMENT, and the gateway stays up",
        async {
            let c = target.client("node", &a)?;
            // Field 1 (cluster_name) claims 16 bytes; one follows.
            let garbage = Bytes::from_static(b"\x0a\x10a");
            match raw_unary(&c, GET_INSTANCES, garbage).await {
                Err(status) if status.code() == Code::InvalidArgument => {}
                other => {
                    return fail(format!(
                        "expected INVALID_ARGUMENT, got {:?}",
                        other.map_err(|s| s.code())
                    ));
                }
            }
            match c.provider_info().await {
                Ok(_) => Ok(Outcome::Pass),
                Err(e) => fail(format!("the gateway no longer answers: {e}")),
            }
        }
    );
    check!(
        "request.deadline",
        "a call still running at the caller's deadline ends with DEADLINE_EXCEEDED at that deadline",
        instances,
        async {
            if !target.address.starts_with("http://") {
                return Ok(Outcome::Skip("checked over plain HTTP/2 only".into()));
            }
            let hook = match &hook {
                Ok(hook) => hook,
                Err(why) => return Ok(Outcome::Skip(why.clone())),
            };
            let Some(name) = &node else {
                return Ok(no_node());
            };
            let before = hook
                .faults(|f| {
                    f.latency.insert(
                        "get_instances".into(),
                        prost_types::Duration {
                            seconds: 3,
                            nanos: 0,
                        },
                    );
                })
                .await?;
            let token = target
                .tokens
                .get("node")
                .ok_or("no token for the node role")?;
            let request = GetInstancesRequest {
                cluster_name: a.clone(),
                nodes: vec![NodeRef {
                    name: name.clone(),
                    provider_id: String::new(),
                }],
                fresh: true,
                purpose: LookupPurpose::Lifecycle as i32,
            };
            let deadline = Duration::from_millis(500);
            let answer = call_with_deadline(
                &target.address,
                token,
                GET_INSTANCES,
                &request.encode_to_vec(),
                deadline,
            )
            .await;
            hook.set_faults(before).await?;
            match answer? {
                (Code::DeadlineExceeded, waited) if waited < deadline * 4 => Ok(Outcome::Pass),
                (code, waited) => fail(format!(
                    "expected DEADLINE_EXCEEDED at the deadline of {deadline:?} (the call takes 3 s), got {code:?} after {waited:?}"
                )),
            }
        }
    );
    check!(
        "instances.foreign-provider-id",
        "a provider ID of another cloud is INVALID_ARGUMENT, never NOT_FOUND",
        instances,
        async {
            let c = target.client("node", &a)?;
            let node = NodeRef {
                name: "n".into(),
                provider_id: "conformance-elsewhere://zone/x".into(),
            };
            match c
                .get_instances(vec![node], LookupPurpose::Initialize, true)
                .await
            {
                Err(Error::InvalidArgument { .. }) => Ok(Outcome::Pass),
                other => fail(format!("expected INVALID_ARGUMENT, got {other:?}")),
            }
        }
    );
    check!(
        "instances.not-found",
        "a node the cloud has no instance for is NOT_FOUND in its own answer",
        instances,
        async {
            let c = target.client("node", &a)?;
            let node = NodeRef {
                name: format!("conformance-missing-{}.example", fastrand::u32(..)),
                provider_id: String::new(),
            };
            match c
                .get_instances(vec![node], LookupPurpose::Initialize, true)
                .await
            {
                Ok(r) if r.len() == 1 && r[0].state == InstanceState::NotFound as i32 => {
                    Ok(Outcome::Pass)
                }
                other => fail(format!("expected one NOT_FOUND answer, got {other:?}")),
            }
        }
    );
    check!(
        "instances.found-by-name",
        "a node is found by name, with a provider ID of the provider's scheme",
        instances,
        async {
            let Some(name) = &node else {
                return Ok(no_node());
            };
            let c = target.client("node", &a)?;
            let scheme = format!(
                "{}://",
                info.as_ref().map(|i| i.name.as_str()).unwrap_or_default()
            );
            let node = NodeRef {
                name: name.clone(),
                provider_id: String::new(),
            };
            match c
                .get_instances(vec![node], LookupPurpose::Initialize, true)
                .await
            {
                Ok(r)
                    if r.len() == 1
                        && r[0].state == InstanceState::Running as i32
                        && r[0]
                            .instance
                            .as_ref()
                            .is_some_and(|i| i.provider_id.starts_with(&scheme)) =>
                {
                    Ok(Outcome::Pass)
                }
                other => fail(format!(
                    "expected a running instance with a {scheme} provider ID, got {other:?}"
                )),
            }
        }
    );
    check!(
        "instances.batch-in-order",
        "a batch answers every node in order; one invalid node fails the whole call, never part of it",
        instances,
        async {
            let Some(name) = &node else {
                return Ok(no_node());
            };
            let c = target.client("node", &a)?;
            let found = NodeRef {
                name: name.clone(),
                provider_id: String::new(),
            };
            let missing = NodeRef {
                name: format!("conformance-missing-{}.example", fastrand::u32(..)),
                provider_id: String::new(),
            };
            let states: Vec<i32> = c
                .get_instances(
                    vec![missing.clone(), found.clone()],
                    LookupPurpose::Initialize,
                    true,
                )
                .await
                .map_err(|e| format!("batch: {e}"))?
                .iter()
                .map(|r| r.state)
                .collect();
            if states
                != [
                    InstanceState::NotFound as i32,
                    InstanceState::Running as i32,
                ]
            {
                return fail(format!("answers {states:?} for [missing, found]"));
            }
            let foreign = NodeRef {
                name: "n".into(),
                provider_id: "conformance-elsewhere://zone/x".into(),
            };
            match c
                .get_instances(
                    vec![found, foreign, missing],
                    LookupPurpose::Initialize,
                    true,
                )
                .await
            {
                Err(Error::InvalidArgument { .. }) => Ok(Outcome::Pass),
                other => fail(format!(
                    "a batch with a foreign provider ID answered {other:?}"
                )),
            }
        }
    );
    check!(
        "instances.lifecycle",
        "an instance is RUNNING by name and by provider ID, SHUTDOWN once stopped, NOT_FOUND once terminated",
        instances,
        async {
            let hook = match &hook {
                Ok(hook) => hook,
                Err(why) => return Ok(Outcome::Skip(why.clone())),
            };
            let c = target.client("node", &a)?;
            let instance = hook.create("conformance-life").await?;
            let by_name = NodeRef {
                name: instance.name.clone(),
                provider_id: String::new(),
            };
            let found = lookup(&c, by_name.clone()).await?;
            let provider_id = found
                .instance
                .as_ref()
                .map(|i| i.provider_id.clone())
                .unwrap_or_default();
            if found.state != InstanceState::Running as i32 || provider_id.is_empty() {
                let _ = hook.end(&instance, true).await;
                return fail(format!("a new instance by name: {found:?}"));
            }
            let by_id = NodeRef {
                name: String::new(),
                provider_id: provider_id.clone(),
            };
            let mut states = vec![lookup(&c, by_id.clone()).await?.state];
            hook.end(&instance, false).await?;
            states.push(lookup(&c, by_id.clone()).await?.state);
            hook.end(&instance, true).await?;
            states.push(lookup(&c, by_id).await?.state);
            states.push(lookup(&c, by_name).await?.state);
            let expected = [
                InstanceState::Running as i32,
                InstanceState::Shutdown as i32,
                InstanceState::NotFound as i32,
                InstanceState::NotFound as i32,
            ];
            if states == expected {
                Ok(Outcome::Pass)
            } else {
                fail(format!(
                    "states {states:?} for [by provider ID, stopped, terminated, terminated by name]; expected {expected:?}"
                ))
            }
        }
    );
    check!(
        "lb.update-hosts-missing",
        "updating the hosts of a load balancer that does not exist is NOT_FOUND",
        load_balancers,
        async {
            let c = target.client("service", &a)?;
            match c
                .update_load_balancer_hosts(spec(&new_uid()), Vec::new())
                .await
            {
                Err(Error::NotFound { .. }) => Ok(Outcome::Pass),
                other => fail(format!("expected NOT_FOUND, got {other:?}")),
            }
        }
    );
    check!(
        "lb.invalid-spec",
        "an invalid load balancer spec is INVALID_ARGUMENT with a BadRequest naming the field",
        load_balancers,
        async {
            let c = target.client("service", &a)?;
            let mut bad = spec(&new_uid());
            bad.ports.clear();
            match c.ensure_load_balancer(bad, Vec::new()).await {
                Err(Error::InvalidArgument { violations, .. })
                    if violations.iter().any(|v| v.field.starts_with("spec.ports")) =>
                {
                    Ok(Outcome::Pass)
                }
                other => fail(format!(
                    "expected INVALID_ARGUMENT naming spec.ports, got {other:?}"
                )),
            }
        }
    );
    check!(
        "lb.invalid-annotation",
        "an annotation the provider refuses is INVALID_ARGUMENT naming it, and nothing is made",
        load_balancers,
        async {
            let Some((key, value)) = &target.invalid_annotation else {
                return Ok(Outcome::Skip("no --invalid-annotation given".into()));
            };
            let c = target.client("service", &a)?;
            let uid = new_uid();
            let mut bad = spec(&uid);
            bad.annotations.insert(key.clone(), value.clone());
            let field = format!("spec.annotations[{key:?}]");
            match c.ensure_load_balancer(bad, Vec::new()).await {
                Err(Error::InvalidArgument { violations, .. })
                    if violations.iter().any(|v| v.field == field) => {}
                other => {
                    let _ = c.delete_load_balancer(service(&uid)).await;
                    return fail(format!(
                        "expected INVALID_ARGUMENT naming {field}, got {other:?}"
                    ));
                }
            }
            let exists = c
                .get_load_balancer(service(&uid))
                .await
                .map_err(|e| format!("get: {e}"))?
                .exists;
            if exists || lb_count(&c, &uid).await? > 0 {
                let _ = c.delete_load_balancer(service(&uid)).await;
                return fail("the refused ensure made a load balancer");
            }
            Ok(Outcome::Pass)
        }
    );
    check!(
        "lb.ensure-idempotent",
        "ensuring twice gives one load balancer; the other cluster never sees it",
        load_balancers,
        async {
            let c = target.client("service", &a)?;
            let other = target.client("service", &b)?;
            let uid = new_uid();
            let s = spec(&uid);
            ensure(&c, &s, &[], target.patience).await?;
            ensure(&c, &s, &[], target.patience).await?;
            let n = lb_count(&c, &uid).await?;
            let seen = lb_count(&other, &uid).await?;
            let exists = other
                .get_load_balancer(service(&uid))
                .await
                .map_err(|e| format!("get: {e}"))?
                .exists;
            let _ = c.delete_load_balancer(service(&uid)).await;
            match (n, seen, exists) {
                (1, 0, false) => Ok(Outcome::Pass),
                (n, 0, false) => fail(format!("{n} load balancers after two ensures")),
                _ => fail("another cluster sees the load balancer"),
            }
        }
    );
    check!(
        "lb.update-hosts",
        "updating hosts changes the backends only: the load balancer and its status stay",
        load_balancers,
        async {
            let Some(name) = &node else {
                return Ok(no_node());
            };
            let backend = host(target, name).await?;
            let c = target.client("service", &a)?;
            let uid = new_uid();
            let s = spec(&uid);
            let created = ensure(&c, &s, std::slice::from_ref(&backend), target.patience).await?;
            let hosts_before = lb_hosts(&c, &uid).await?;
            let updated = c.update_load_balancer_hosts(s.clone(), Vec::new()).await;
            let after = c.get_load_balancer(service(&uid)).await;
            let hosts_after = lb_hosts(&c, &uid).await;
            let count = lb_count(&c, &uid).await;
            let _ = c.delete_load_balancer(service(&uid)).await;
            updated.map_err(|e| format!("update hosts: {e}"))?;
            let after = after.map_err(|e| format!("get: {e}"))?;
            let (hosts_after, count) = (hosts_after?, count?);
            if !after.exists || count != 1 {
                return fail(format!(
                    "after the update: exists {}, {count} listed",
                    after.exists
                ));
            }
            if after.status.as_ref() != Some(&created) {
                return fail(format!(
                    "the status changed from {created:?} to {:?}",
                    after.status
                ));
            }
            // Providers that report hosts must report the new set.
            if !hosts_before.is_empty()
                && (hosts_before != [name.clone()] || !hosts_after.is_empty())
            {
                return fail(format!(
                    "hosts listed {hosts_before:?} after ensure with [{name}], {hosts_after:?} after update to none"
                ));
            }
            Ok(Outcome::Pass)
        }
    );
    check!(
        "lb.provisioning",
        "while provisioning, ensure is UNAVAILABLE (PROVISIONING) with a RetryInfo delay, and get shows it with no ingress",
        load_balancers,
        async {
            let hook = match &hook {
                Ok(hook) => hook,
                Err(why) => return Ok(Outcome::Skip(why.clone())),
            };
            let provisioning = Duration::from_secs(2);
            let before = hook
                .faults(|f| {
                    f.lb_provisioning_delay = Some(prost_types::Duration {
                        seconds: 2,
                        nanos: 0,
                    });
                })
                .await?;
            let c = target.client("service", &a)?;
            let uid = new_uid();
            let s = spec(&uid);
            let first = c.ensure_load_balancer(s.clone(), Vec::new()).await;
            let during = c.get_load_balancer(service(&uid)).await;
            let done = ensure(&c, &s, &[], target.patience).await;
            hook.set_faults(before).await?;
            let _ = c.delete_load_balancer(service(&uid)).await;
            match first {
                Err(Error::RetryAfter {
                    reason: r, delay, ..
                }) if r == reason::PROVISIONING
                    && !delay.is_zero()
                    && delay <= provisioning + Duration::from_secs(1) => {}
                other => {
                    return fail(format!(
                        "expected UNAVAILABLE ({}) with a delay of at most {provisioning:?}, got {other:?}",
                        reason::PROVISIONING
                    ));
                }
            }
            match during {
                Ok(g) if g.exists && g.status.as_ref().is_none_or(|s| s.ingress.is_empty()) => {}
                other => {
                    return fail(format!(
                        "while provisioning, get answered {other:?}; expected exists with no ingress"
                    ));
                }
            }
            match done {
                Ok(status) if !status.ingress.is_empty() => Ok(Outcome::Pass),
                other => fail(format!("once provisioned, ensure answered {other:?}")),
            }
        }
    );
    check!(
        "lb.delete-idempotent",
        "delete succeeds when the load balancer is gone, and an ensure after it makes a new one",
        load_balancers,
        async {
            let c = target.client("service", &a)?;
            let uid = new_uid();
            let s = spec(&uid);
            ensure(&c, &s, &[], target.patience).await?;
            for attempt in ["first", "second"] {
                c.delete_load_balancer(service(&uid))
                    .await
                    .map_err(|e| format!("{attempt} delete: {e}"))?;
            }
            if lb_count(&c, &uid).await? != 0 {
                return fail("listed after delete");
            }
            ensure(&c, &s, &[], target.patience).await?;
            let n = lb_count(&c, &uid).await?;
            let _ = c.delete_load_balancer(service(&uid)).await;
            if n == 1 {
                Ok(Outcome::Pass)
            } else {
                fail(format!("{n} load balancers after ensure, delete, ensure"))
            }
        }
    );
    check!(
        "routes.delete-missing",
        "deleting a route that does not exist succeeds",
        routes,
        async {
            let Some(node) = &node else {
                return Ok(no_node());
            };
            let c = target.client("route", &a)?;
            let route = ccm_proto::v1::Route {
                name: format!("{a}-10.255.0.0/24"),
                target_node: node.clone(),
                destination_cidr: "10.255.0.0/24".into(),
                ..Default::default()
            };
            match c.delete_route(route).await {
                Ok(()) => Ok(Outcome::Pass),
                Err(e) => fail(format!("delete of a missing route: {e}")),
            }
        }
    );
    check!(
        "routes.create-idempotent",
        "creating a route twice gives one route, IPv4 and IPv6; the other cluster never sees it",
        routes,
        async {
            let Some(node) = &node else {
                return Ok(no_node());
            };
            let c = target.client("route", &a)?;
            let other = target.client("route", &b)?;
            for cidr in ["10.254.7.0/24", "fd00:254:7::/64"] {
                let route = ccm_proto::v1::Route {
                    target_node: node.clone(),
                    destination_cidr: cidr.into(),
                    ..Default::default()
                };
                let mut created = None;
                for _ in 0..2 {
                    created = Some(
                        c.create_route(format!("conformance-{}", cidr.len()), route.clone())
                            .await
                            .map_err(|e| format!("create {cidr}: {e}"))?,
                    );
                }
                let listed = c.list_routes().await.map_err(|e| format!("list: {e}"))?;
                let n = listed.iter().filter(|r| r.destination_cidr == cidr).count();
                // A cluster the cloud is not set up for sees nothing either.
                let seen = match other.list_routes().await {
                    Ok(routes) => routes.iter().any(|r| r.destination_cidr == cidr),
                    Err(Error::Other {
                        code: tonic::Code::FailedPrecondition,
                        ..
                    }) => false,
                    Err(e) => return fail(format!("list in the other cluster: {e}")),
                };
                if let Some(r) = created {
                    let _ = c.delete_route(r).await;
                }
                if n != 1 {
                    return fail(format!("{n} routes for {cidr} after two creates"));
                }
                if seen {
                    return fail(format!("another cluster lists the route for {cidr}"));
                }
            }
            Ok(Outcome::Pass)
        }
    );
    check!(
        "routes.blackhole",
        "a route whose target instance is gone is listed as a blackhole, and can be deleted",
        routes,
        async {
            let hook = match &hook {
                Ok(hook) => hook,
                Err(why) => return Ok(Outcome::Skip(why.clone())),
            };
            let instance = hook.create("conformance-route").await?;
            let target_host = host(target, &instance.name).await;
            let c = target.client("route", &a)?;
            let cidr = "10.253.9.0/24";
            let created = match target_host {
                Ok(h) => {
                    c.create_route(
                        "conformance-blackhole",
                        ccm_proto::v1::Route {
                            target_node: instance.name.clone(),
                            destination_cidr: cidr.into(),
                            target_provider_id: h.provider_id,
                            target_node_addresses: h.addresses,
                            ..Default::default()
                        },
                    )
                    .await
                }
                Err(why) => {
                    let _ = hook.end(&instance, true).await;
                    return fail(why);
                }
            };
            hook.end(&instance, true).await?;
            let created = created.map_err(|e| format!("create {cidr}: {e}"))?;
            let listed = c.list_routes().await.map_err(|e| format!("list: {e}"))?;
            let blackhole = listed
                .iter()
                .find(|r| r.destination_cidr == cidr)
                .map(|r| r.blackhole);
            let deleted = c.delete_route(created).await;
            let left = c
                .list_routes()
                .await
                .map_err(|e| format!("list: {e}"))?
                .iter()
                .any(|r| r.destination_cidr == cidr);
            match (blackhole, deleted, left) {
                (Some(true), Ok(()), false) => Ok(Outcome::Pass),
                (Some(false), ..) => {
                    fail("the route is listed without blackhole though its instance is gone")
                }
                (None, ..) => fail("the route is not listed once its instance is gone"),
                (_, Err(e), _) => fail(format!("delete of the blackhole route: {e}")),
                (_, Ok(()), true) => fail("the blackhole route is still listed after delete"),
            }
        }
    );
    if let (Some(instance), Ok(hook)) = (&made, &hook) {
        let _ = hook.end(instance, true).await;
    }
    out
}

/// The summary line, and whether every check passed or was skipped.
pub fn summary(results: &[Checked]) -> (String, bool) {
    let count = |f: fn(&Outcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
    let failed = count(|o| matches!(o, Outcome::Fail(_)));
    (
        format!(
            "{} checks: {} passed, {failed} failed, {} skipped",
            results.len(),
            count(|o| *o == Outcome::Pass),
            count(|o| matches!(o, Outcome::Skip(_))),
        ),
        failed == 0,
    )
}

/// Runs the `gateway-conformance` binary in `bin_dir` against `address`
/// with the role tokens in `tokens`, acting for `cluster`, with more flags
/// in `args` (`--node`, `--invalid-annotation`).
pub async fn run_binary(
    bin_dir: &std::path::Path,
    address: &str,
    tokens: &std::path::Path,
    cluster: &str,
    args: &[&str],
) -> anyhow::Result<std::process::Output> {
    let mut command = tokio::process::Command::new(bin_dir.join("gateway-conformance"));
    command
        .args([
            "--address",
            address,
            "--cluster",
            cluster,
            "--patience",
            "60",
        ])
        .arg("--tokens-dir")
        .arg(tokens)
        .args(args);
    Ok(tokio::time::timeout(Duration::from_secs(300), command.output()).await??)
}
