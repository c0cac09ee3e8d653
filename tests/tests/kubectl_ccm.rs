//! `kubectl ccm` end to end: the sandbox's processes registered as the
//! chart's Pods, the API server enforcing the chart's RBAC, and the plugin
//! run through the real kubectl by an operator bound only to the chart's
//! viewer roles. Each cause of a pending Service or an uninitialised Node
//! is made on purpose, and `kubectl ccm why` names it in its first line and
//! in `-o json`; `kubectl ccm status` exits 0 on a healthy sandbox and 1
//! when something needs a person.

use std::time::{Duration, Instant};

use ccm_sandbox::{Options, Sandbox};
use ccm_testkit::{PluginAnswer, kubectl_ccm};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, PostParams};
use kube_test_apiserver::fixtures;

const LIMIT: Duration = Duration::from_secs(90);
/// The operator the chart's viewer roles are bound to.
const OPERATOR: &str = "operator";

struct Cluster {
    sandbox: Sandbox,
    kubelets: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// The simulated kubelets: each Node of a running instance Ready, every
/// other one Unknown (as the node lifecycle would mark it).
fn kubelets(sandbox: &Sandbox) -> tokio::task::JoinHandle<()> {
    let handle = sandbox.handle();
    tokio::spawn(async move {
        loop {
            let _ = handle.heartbeat().await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

impl Cluster {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("chart.yaml");
        ccm_testkit::chart::render_to(
            &policy,
            &[
                "gateway.provider=sim",
                "nodeController.approveKubeletServingCSRs=true",
                "viewer.subjects=[{kind: User, name: operator}]",
            ],
        )
        .unwrap();
        let options = Options {
            nodes: 3,
            services: 1,
            replicas: 2,
            rbac: Some(policy),
            ..Options::new(dir.path().join("state"), ccm_testkit::bin_dir())
        };
        let sandbox = Sandbox::start(options).await.unwrap();
        sandbox.populate().await.unwrap();
        let kubelets = kubelets(&sandbox);
        let cluster = Self {
            sandbox,
            kubelets,
            _dir: dir,
        };
        cluster
            .until("convergence", async |c| {
                c.sandbox
                    .handle()
                    .progress()
                    .await
                    .is_ok_and(|p| p.converged(&c.sandbox.options))
            })
            .await;
        cluster
    }

    /// `kubectl ccm <args>` as the operator.
    async fn ccm(&self, args: &[&str]) -> PluginAnswer {
        let mut all = args.to_vec();
        all.extend(["--as", OPERATOR]);
        let kubeconfig = self.sandbox.kubeconfig.clone();
        let all: Vec<String> = all.into_iter().map(String::from).collect();
        let run = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            kubectl_ccm(&kubeconfig, &args)
        });
        tokio::time::timeout(LIMIT, run)
            .await
            .expect("kubectl ccm answered in time")
            .unwrap()
    }

    /// The verdict's cause for `object` (`-o json`).
    async fn cause(&self, object: &str) -> (String, PluginAnswer) {
        let answer = self.ccm(&["why", object, "-o", "json"]).await;
        let cause = answer
            .json()
            .pointer("/verdict/cause")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_owned();
        (cause, answer)
    }

    /// Waits until `why object` names `cause`; checks the text answer's
    /// first line then names it too (its words, `says`).
    async fn until_cause(&self, object: &str, cause: &str, says: &str) {
        let start = Instant::now();
        loop {
            let (found, answer) = self.cause(object).await;
            if found == cause {
                break;
            }
            assert!(
                start.elapsed() < LIMIT,
                "{object}: wanted {cause}, still {found}: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let text = self.ccm(&["why", object]).await;
        let first = text.stdout.lines().next().unwrap_or_default();
        assert!(first.contains(says), "{object}: {first:?} in {text:?}");
    }

    async fn until(&self, what: &str, mut check: impl AsyncFnMut(&Self) -> bool) {
        let start = Instant::now();
        while !check(self).await {
            assert!(start.elapsed() < LIMIT, "{what}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn status_code(&self) -> (Option<i32>, PluginAnswer) {
        let answer = self.ccm(&["status"]).await;
        (answer.code, answer)
    }

    async fn services(&self) -> Api<Service> {
        Api::namespaced(self.sandbox.client().await.unwrap(), "default")
    }

    /// Stops the sandbox; checks that only the stranger was refused, and
    /// the operator only what proxies (when `proxied`): the controllers
    /// and the operator had all else they asked for.
    async fn finish(self, proxied: bool) {
        self.kubelets.abort();
        let report = self.sandbox.rbac_report().await.unwrap().expect("RBAC on");
        self.sandbox.stop().await;
        let denied = report["denied"].as_array().cloned().unwrap_or_default();
        assert!(!denied.is_empty(), "the stranger was refused: {report:#}");
        let expected = |d: &serde_json::Value| {
            let resource = d["resource"].as_str().unwrap_or_default();
            d["user"] == "stranger"
                || (proxied
                    && d["user"] == OPERATOR
                    && (resource.starts_with("pods") || resource.starts_with("services")))
        };
        assert!(denied.iter().all(expected), "{report:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_ccm_names_each_cause_of_a_pending_service_or_node() {
    let mut c = Cluster::start().await;
    let services = c.services().await;
    let mut sim = c
        .sandbox
        .handle()
        .gateway_client("admin")
        .unwrap()
        .sim_admin()
        .unwrap();

    // Healthy: status needs no one; a converged Service is ready.
    let (code, status) = c.status_code().await;
    assert_eq!(code, Some(0), "{status:?}");
    assert!(status.stdout.contains("nothing needs you"), "{status:?}");
    // Every process says which release it is, here all the same one.
    let release = format!("{} (", ccm_runtime::version::VERSION);
    assert_eq!(
        status.stdout.matches(&release).count(),
        4,
        "three controllers and the gateway: {status:?}"
    );
    assert!(!status.stdout.contains("releases differ"), "{status:?}");
    let svc = services.list(&Default::default()).await.unwrap().items[0].clone();
    let ready = format!("service/{}", svc.metadata.name.unwrap());
    c.until_cause(&ready, "ready", "ready: the load balancer answers at")
        .await;
    c.until_cause("node/node-0", "ready", "initialised: provider ID sim://")
        .await;

    // The namespace flag, as kubectl's.
    let named = c.ccm(&["why", &ready, "-n", "default", "-o", "yaml"]).await;
    assert!(named.stdout.contains("cause: ready"), "{named:?}");

    // Without the viewer binding, the plugin is refused and says so.
    let kubeconfig = c.sandbox.kubeconfig.clone();
    let refused = tokio::task::spawn_blocking(move || {
        kubectl_ccm(&kubeconfig, &["status", "--as", "stranger"])
    })
    .await
    .unwrap();
    assert_eq!(refused.code, Some(2), "{refused:?}");
    assert!(refused.stderr.contains("forbidden"), "{refused:?}");

    // An invalid annotation: refused, with the annotation named.
    let bad = fixtures::load_balancer("default", "bad")
        .annotation("sim.cloudgateway.io/algorithm", "fastest")
        .build();
    services.create(&PostParams::default(), &bad).await.unwrap();
    c.until_cause("service/bad", "refused", "refused: ").await;
    let (_, answer) = c.cause("service/bad").await;
    let summary = answer.json()["verdict"]["summary"].to_string();
    assert!(summary.contains("algorithm"), "{summary}");

    // Another controller's class.
    let other = fixtures::load_balancer("default", "other")
        .class("example.com/other")
        .build();
    services
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    c.until_cause(
        "service/other",
        "another_controller",
        "another controller owns it: loadBalancerClass example.com/other",
    )
    .await;

    // A load balancer the cloud takes a minute to provision.
    sim.set_faults(ccm_proto::v1::Faults {
        lb_provisioning_delay: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let slow = fixtures::load_balancer("default", "slow").build();
    services
        .create(&PostParams::default(), &slow)
        .await
        .unwrap();
    c.until_cause(
        "service/slow",
        "provisioning",
        "waiting for the cloud to finish provisioning",
    )
    .await;
    let (code, status) = c.status_code().await;
    assert_eq!(
        code,
        Some(1),
        "the invalid annotation needs a person: {status:?}"
    );

    // The cloud throttling every call.
    sim.set_faults(ccm_proto::v1::Faults {
        throttle_rate: 1.0,
        ..Default::default()
    })
    .await
    .unwrap();
    let busy = fixtures::load_balancer("default", "busy").build();
    services
        .create(&PostParams::default(), &busy)
        .await
        .unwrap();
    c.until_cause("service/busy", "throttling", "cloud throttling: ")
        .await;
    let (_, answer) = c.cause("service/busy").await;
    let summary = answer.json()["verdict"]["summary"].to_string();
    assert!(summary.contains("this one at high priority"), "{summary}");

    // The cloud failing every ensure.
    sim.set_faults(ccm_proto::v1::Faults {
        error_rate_by_operation: [("ensure_load_balancer".to_owned(), 1.0)].into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let broken = fixtures::load_balancer("default", "broken").build();
    services
        .create(&PostParams::default(), &broken)
        .await
        .unwrap();
    c.until_cause("service/broken", "failing", "failing: ")
        .await;
    sim.set_faults(ccm_proto::v1::Faults::default())
        .await
        .unwrap();
    for name in ["bad", "other", "slow", "busy", "broken"] {
        services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    // A Node whose instance the cloud does not have, its kubelet up (a
    // NotReady one would be deleted on the cloud's confirmed answer, so the
    // simulated kubelets, which would mark it so, pause meanwhile).
    c.kubelets.abort();
    let nodes: Api<Node> = Api::all(c.sandbox.client().await.unwrap());
    let ghost = fixtures::node("ghost").uninitialized().ready().build();
    let status = ghost.status.clone();
    nodes.create(&PostParams::default(), &ghost).await.unwrap();
    nodes
        .patch_status(
            "ghost",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": status})),
        )
        .await
        .unwrap();
    c.until_cause(
        "node/ghost",
        "instance_missing",
        "the cloud has no instance for this node",
    )
    .await;
    nodes
        .delete("ghost", &DeleteParams::default())
        .await
        .unwrap();
    c.kubelets = kubelets(&c.sandbox);

    // The service controller's leader killed: until the standby takes
    // over, the leader the Lease names does not answer.
    let leader = c
        .sandbox
        .leader("ccm-service-controller")
        .await
        .unwrap()
        .expect("a service-controller leads");
    c.sandbox.kill(&leader).await.unwrap();
    let waiting = fixtures::load_balancer("default", "leaderless").build();
    services
        .create(&PostParams::default(), &waiting)
        .await
        .unwrap();
    c.until_cause(
        "service/leaderless",
        "leader_unreachable",
        &format!("the service-controller leader {leader} does not answer"),
    )
    .await;
    c.sandbox.restart(&leader).unwrap();

    // The gateway stopped: the leader cannot reach it.
    c.sandbox.kill("cloud-gateway").await.unwrap();
    let orphan = fixtures::load_balancer("default", "unreached").build();
    services
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    c.until_cause(
        "service/unreached",
        "gateway_unreachable",
        "gateway unreachable from the service-controller leader",
    )
    .await;
    let (code, status) = c.status_code().await;
    assert_eq!(code, Some(1), "{status:?}");
    assert!(
        status.stdout.contains("gateway: does not answer"),
        "{status:?}"
    );
    c.sandbox.restart("cloud-gateway").unwrap();
    c.until_cause("service/unreached", "ready", "ready: ").await;

    // Every service-controller replica stopped: no leader since the lease
    // ran out.
    for replica in ["service-controller-0", "service-controller-1"] {
        c.sandbox.kill(replica).await.unwrap();
    }
    let late = fixtures::load_balancer("default", "late").build();
    services
        .create(&PostParams::default(), &late)
        .await
        .unwrap();
    c.until_cause(
        "service/late",
        "no_leader",
        "no leader for service-controller since ",
    )
    .await;
    let (code, status) = c.status_code().await;
    assert_eq!(code, Some(1), "{status:?}");
    assert!(
        status.stdout.contains("service-controller: no leader"),
        "{status:?}"
    );
    for replica in ["service-controller-0", "service-controller-1"] {
        c.sandbox.restart(replica).unwrap();
    }
    c.until_cause("service/late", "ready", "ready: ").await;
    c.finish(false).await;
}

/// A client of the sandbox's API server acting as `user` (impersonated by
/// the admin, as kubectl's `--as`).
async fn client_as(sandbox: &Sandbox, user: &str) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&sandbox.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).unwrap()
}

/// `GET path` through the API server: the body, or the status code it was
/// refused with.
async fn get_raw(client: &kube::Client, path: &str, accept: &str) -> Result<String, u16> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())
        .unwrap();
    client.request_text(request).await.map_err(|e| match e {
        kube::Error::Api(s) => s.code,
        other => panic!("{path}: {other}"),
    })
}

/// `GET path` straight to a diagnostics port, over TLS trusting the
/// sandbox's CA, with `client` (certificate and key files) when given and
/// `headers`; the status code, or why there is none.
async fn direct_get(
    port: u16,
    ca: &std::path::Path,
    client: Option<(&std::path::Path, &std::path::Path)>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let client_pem = client.map(|(c, k)| (std::fs::read(c).unwrap(), std::fs::read(k).unwrap()));
    let config = ccm_runtime::tls::client_config(
        &std::fs::read(ca).unwrap(),
        "the sandbox CA",
        client_pem
            .as_ref()
            .map(|(c, k)| (c.as_slice(), k.as_slice())),
        &[],
    )
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("ccm-diagnostics.kube-system.svc").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: diagnostics\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    // A server that refuses the certificate after the handshake (TLS 1.3)
    // shows it here, as a read error.
    tls.read_to_end(&mut answer)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status line: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diagnostics_api_answers_viewers_through_the_api_server_and_no_one_else() {
    let mut c = Cluster::start().await;
    let admin = c.sandbox.client().await.unwrap();
    let operator = client_as(&c.sandbox, OPERATOR).await;
    let stranger = client_as(&c.sandbox, "stranger").await;
    const API: &str = "/apis/diagnostics.cloudgateway.io/v1";
    const JSON: &str = "application/json";
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

    // The API server sees the API available, and an operator bound only to
    // the viewer roles reads it as any other API, in kubectl's Tables too.
    c.until("the APIService available", async |_| {
        let api = get_raw(
            &admin,
            "/apis/apiregistration.k8s.io/v1/apiservices/v1.diagnostics.cloudgateway.io",
            JSON,
        )
        .await;
        api.is_ok_and(|text| {
            let api: serde_json::Value = serde_json::from_str(&text).unwrap();
            api["status"]["conditions"][0]["status"] == "True"
        })
    })
    .await;
    let table = get_raw(
        &operator,
        &format!("{API}/namespaces/kube-system/components"),
        TABLE,
    )
    .await
    .unwrap();
    let table: serde_json::Value = serde_json::from_str(&table).unwrap();
    assert_eq!(table["kind"], "Table", "{table:#}");
    let rows: Vec<(String, String)> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["cells"][0].as_str().unwrap().to_owned(),
                r["cells"][2].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for name in [
        "node-controller",
        "service-controller",
        "route-controller",
        "gateway",
    ] {
        assert!(
            rows.contains(&(name.to_owned(), "True".to_owned())),
            "{name} answered: {rows:?}"
        );
    }
    let services = c.services().await;
    let svc = services.list(&Default::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let one = format!("{API}/namespaces/default/servicediagnoses/{svc}");
    let diagnosis: serde_json::Value =
        serde_json::from_str(&get_raw(&operator, &one, JSON).await.unwrap()).unwrap();
    assert_eq!(diagnosis["kind"], "ServiceDiagnosis");
    assert_eq!(
        diagnosis["controller"]["answer"]["leading"], true,
        "{diagnosis:#}"
    );
    assert_eq!(
        diagnosis["object"]["answer"]["key"],
        format!("default/{svc}")
    );
    assert!(diagnosis["gateway"]["answer"].is_object(), "{diagnosis:#}");
    // A list holds what its controller is having trouble with: not the
    // settled Service.
    for (list, kind) in [
        (format!("{API}/servicediagnoses"), "ServiceDiagnosis"),
        (format!("{API}/nodediagnoses"), "NodeDiagnosis"),
    ] {
        let listed: serde_json::Value =
            serde_json::from_str(&get_raw(&operator, &list, JSON).await.unwrap()).unwrap();
        assert_eq!(listed["kind"], format!("{kind}List"), "{list}: {listed:#}");
        assert_eq!(listed["apiVersion"], "diagnostics.cloudgateway.io/v1");
        let items = listed["items"].as_array().unwrap();
        assert!(items.iter().all(|i| i["kind"] == kind), "{listed:#}");
        assert!(
            !items.iter().any(|i| i["metadata"]["name"] == svc.as_str()),
            "{list} lists the settled {svc}: {listed:#}"
        );
    }

    // No proxying grant anywhere: the operator reaches no pod's or
    // Service's port through the API server, and a stranger not even the
    // diagnostics.
    let pod = c
        .sandbox
        .leader("ccm-service-controller")
        .await
        .unwrap()
        .unwrap();
    for path in [
        format!("/api/v1/namespaces/kube-system/pods/{pod}/proxy/debug/status"),
        "/api/v1/namespaces/kube-system/services/ccm-gateway:admin/proxy/debug/status".to_owned(),
    ] {
        assert_eq!(get_raw(&operator, &path, JSON).await, Err(403), "{path}");
    }
    assert_eq!(get_raw(&stranger, &one, JSON).await, Err(403));

    // Straight to a replica's port: only the API server's front-proxy
    // certificate is believed, whatever headers a caller sends.
    let state = c.sandbox.options.state_dir.clone();
    let ca = state.join("pki/ca.crt");
    let endpoints: Api<k8s_openapi::api::core::v1::Endpoints> =
        Api::namespaced(c.sandbox.client().await.unwrap(), "kube-system");
    let ports: Vec<u16> = endpoints
        .get("ccm-diagnostics")
        .await
        .unwrap()
        .subsets
        .unwrap_or_default()
        .into_iter()
        .flat_map(|s| s.ports.unwrap_or_default())
        .map(|p| p.port as u16)
        .collect();
    assert_eq!(
        ports.len(),
        6,
        "two replicas of three controllers: {ports:?}"
    );
    let path = "/apis/diagnostics.cloudgateway.io/v1/namespaces/kube-system/components";
    let forged = [
        ("X-Remote-User", "system:admin"),
        ("X-Remote-Group", "system:masters"),
    ];
    assert_eq!(
        direct_get(ports[0], &ca, None, path, &forged).await,
        Ok(401)
    );
    let other =
        ccm_sandbox::pki::Pki::create(&state.join("other-ca"), "not the front proxy").unwrap();
    let stranger_cert = other
        .client("front-proxy-client", None, "front-proxy-client", false)
        .unwrap();
    let refused = direct_get(
        ports[0],
        &ca,
        Some((&stranger_cert.cert, &stranger_cert.key)),
        path,
        &forged,
    )
    .await;
    assert!(
        refused.is_err(),
        "a certificate another CA signed: {refused:?}"
    );
    let front_proxy = (
        state.join("apiserver/front-proxy-client.crt"),
        state.join("apiserver/front-proxy-client.key"),
    );
    let front = Some((front_proxy.0.as_path(), front_proxy.1.as_path()));
    assert_eq!(
        direct_get(ports[0], &ca, front, path, &[]).await,
        Ok(401),
        "no user named"
    );
    assert_eq!(
        direct_get(ports[0], &ca, front, path, &[("X-Remote-User", "operator")]).await,
        Ok(200)
    );
    assert_eq!(
        direct_get(ports[0], &ca, None, "/healthz", &[]).await,
        Ok(200)
    );

    // Every admin port as upstream serves its secure port: HTTPS only;
    // the probes' paths to anyone; /metrics and /debug/* only to a token
    // the API server reviews and lets get the path (the chart grants the
    // controllers /debug/* for the diagnostics API, the gateway neither).
    let api_token = |binary: &str| {
        let kubeconfig =
            std::fs::read_to_string(state.join(format!("kubeconfig-{binary}"))).unwrap();
        let kubeconfig: serde_json::Value = serde_norway::from_str(&kubeconfig).unwrap();
        kubeconfig["users"][0]["user"]["token"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let controller = Some(api_token("service-controller"));
    let gateway = Some(api_token("cloud-gateway"));
    let admin_token = Some(kube_test_apiserver::ADMIN_TOKEN.to_owned());
    let admin_ports: Vec<(String, std::net::SocketAddr)> = c
        .sandbox
        .endpoints
        .iter()
        .filter(|(name, _)| name.ends_with("_admin"))
        .map(|(name, url)| {
            (
                name.clone(),
                url.trim_start_matches("https://").parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(admin_ports.len(), 7, "{admin_ports:?}");
    for (name, addr) in &admin_ports {
        let get = async |path: &str, token: &Option<String>| {
            ccm_sandbox::admin::admin_get(*addr, path, token.as_deref())
                .await
                .map(|(code, _)| code)
                .unwrap_or_else(|e| panic!("{name} {path}: {e}"))
        };
        for path in ["/livez", "/readyz", "/healthz"] {
            assert_eq!(get(path, &None).await, 200, "{name} {path}");
        }
        for path in ["/metrics", "/debug/status"] {
            assert_eq!(get(path, &None).await, 401, "{name} {path} anonymous");
            assert_eq!(
                get(path, &Some("not-a-token".into())).await,
                401,
                "{name} {path}"
            );
            assert_eq!(get(path, &admin_token).await, 200, "{name} {path} as admin");
        }
        assert_eq!(
            get("/metrics", &gateway).await,
            403,
            "{name}: the gateway may not scrape"
        );
        assert_eq!(get("/debug/status", &gateway).await, 403, "{name}");
        assert_eq!(get("/metrics", &controller).await, 403, "{name}");
        assert_eq!(get("/debug/status", &controller).await, 200, "{name}");
        // Nothing in clear: an HTTP request gets no HTTP answer.
        let plain = ccm_sandbox::admin::try_http_get(*addr, "/livez").await;
        assert!(!matches!(plain, Ok((200, _))), "{name} in clear: {plain:?}");
    }

    // A replica killed (the service controller's leader): the API keeps
    // answering from the others, and the plugin with it.
    c.sandbox.kill(&pod).await.unwrap();
    for _ in 0..6 {
        let again = get_raw(
            &operator,
            &format!("{API}/namespaces/kube-system/components"),
            JSON,
        )
        .await;
        assert!(again.is_ok(), "{again:?}");
    }
    c.until_cause(&format!("service/{svc}"), "ready", "ready: ")
        .await;
    c.sandbox.restart(&pod).unwrap();
    c.finish(true).await;
}
