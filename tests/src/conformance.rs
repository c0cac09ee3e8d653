//! The contract checks `gateway-conformance` runs against any
//! `cloudgateway.v1` gateway: each names the rule of the contract it tests
//! (`proto/CONTRACT.md` lists the rules, each with its check's name; the
//! fields are in the proto comments) and passes, fails with what it saw,
//! or is skipped with why. They use only the public gRPC contract and the
//! callers' tokens, never anything of our gateway's insides, so a vendor's
//! gateway in any language can be checked the same way.

use std::time::{Duration, Instant};

use ccm_proto::v1::{
    Host, InstanceState, LoadBalancerSpec, LookupPurpose, NodeRef, Protocol, ServicePort,
    ServiceRef,
};
use ccm_proto::{ClientConfig, Error, GatewayClient, RetryPolicy, TokenSource, reason};

/// Every check, in the order [`run`] runs them. `proto/CONTRACT.md` names
/// each beside its rule.
pub const CHECKS: [&str; 16] = [
    "health.serving",
    "provider.info",
    "auth.no-token",
    "auth.wrong-role",
    "provider.unimplemented",
    "request.malformed-cluster",
    "instances.foreign-provider-id",
    "instances.not-found",
    "instances.found-by-name",
    "instances.batch-in-order",
    "lb.update-hosts-missing",
    "lb.invalid-spec",
    "lb.ensure-idempotent",
    "lb.delete-idempotent",
    "routes.delete-missing",
    "routes.create-idempotent",
];

/// Where the gateway is and who may call it.
#[derive(Clone, Debug)]
pub struct Target {
    /// `http://host:port` or `https://host:port`.
    pub address: String,
    /// A PEM CA bundle for https.
    pub tls_ca: Option<std::path::PathBuf>,
    /// The token of each role (`node`, `service`, `route`).
    pub tokens: std::collections::BTreeMap<String, TokenSource>,
    /// The cluster the checks act for; the cloud must be set up for it
    /// (on AWS: subnets and route tables tagged for it).
    pub cluster: String,
    /// A second cluster, which must never see the first one's resources.
    pub other_cluster: String,
    /// The name of a node whose instance exists, for checks that need one.
    pub node: Option<String>,
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
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match client
            .ensure_load_balancer(spec.clone(), hosts.to_vec())
            .await
        {
            Ok(_) => return Ok(()),
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
            if !target.address.starts_with("http://") {
                return Ok(Outcome::Skip("checked over plain HTTP/2 only".into()));
            }
            let channel = tonic::transport::Endpoint::from_shared(target.address.clone())
                .map_err(|e| e.to_string())?
                .connect_lazy();
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let mut services = vec![String::new(), "cloudgateway.v1.Provider".to_owned()];
            if let Some(i) = &info {
                for (offered, name) in [
                    (i.instances, "Instances"),
                    (i.load_balancers, "LoadBalancers"),
                    (i.routes, "Routes"),
                ] {
                    if offered {
                        services.push(format!("cloudgateway.v1.{name}"));
                    }
                }
            }
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
            let Some(name) = &target.node else {
                return Ok(Outcome::Skip("no --node named".into()));
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
            let Some(name) = &target.node else {
                return Ok(Outcome::Skip("no --node named".into()));
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
            let Some(node) = &target.node else {
                return Ok(Outcome::Skip("no --node named".into()));
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
            let Some(node) = &target.node else {
                return Ok(Outcome::Skip("no --node named".into()));
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
/// with the role tokens in `tokens`, acting for `cluster`, with `node` as
/// the node that has an instance.
pub async fn run_binary(
    bin_dir: &std::path::Path,
    address: &str,
    tokens: &std::path::Path,
    cluster: &str,
    node: Option<&str>,
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
        .arg(tokens);
    if let Some(node) = node {
        command.args(["--node", node]);
    }
    Ok(tokio::time::timeout(Duration::from_secs(300), command.output()).await??)
}
