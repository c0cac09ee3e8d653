//! API aggregation end to end: a TLS backend made here stands for an
//! aggregated API server (`diagnostics.cloudgateway.io/v1`, served for
//! `diag.kube-system.svc`); it accepts only clients with a certificate the
//! front proxy's CA signed, as read from the ConfigMap
//! `kube-system/extension-apiserver-authentication`, and records the
//! headers of every request. An APIService, a Service and its Endpoints
//! point at it, and requests through the test API server reach it (or
//! fail) as they would through kube-apiserver.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::routing::any;
use kube_test_apiserver::{ADMIN_TOKEN, ApiServer, Config, TokenUser, front_proxy};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const GROUP: &str = "diagnostics.cloudgateway.io";
const API_SERVICE: &str = "v1.diagnostics.cloudgateway.io";
const DIAGNOSES: &str = "/apis/diagnostics.cloudgateway.io/v1/namespaces/default/servicediagnoses";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
/// How long anything awaited here may take.
const LIMIT: Duration = Duration::from_secs(60);

/// Runs a test's body within [`LIMIT`].
async fn within<T>(body: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, body)
        .await
        .expect("the test finishes in time")
}

/// Polls `check` until it holds, failing after [`LIMIT`].
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A CA and a serving certificate it signed for `diag.kube-system.svc`.
struct ServingPki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl ServingPki {
    fn new() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(vec!["diag.kube-system.svc".to_owned()]).unwrap();
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// The APIService's `caBundle`: base64 of the CA's PEM.
    fn ca_bundle(&self) -> String {
        data_encoding::BASE64.encode(self.ca_pem.as_bytes())
    }
}

/// Accepts TLS connections whose client presents a certificate the front
/// proxy's CA signed; a failed handshake is dropped.
struct TlsListener {
    tcp: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            let handshake = self.acceptor.accept(tcp);
            if let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(5), handshake).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// The aggregated API server: its address, the headers of every request
/// it answered, and its task (abort it to take it away).
struct Backend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    task: JoinHandle<()>,
}

impl Backend {
    /// Serves with `pki`'s certificate, trusting clients signed by
    /// `client_ca_pem`.
    async fn start(pki: &ServingPki, client_ca_pem: &str) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        )
        .build()
        .unwrap();
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes())
                .map(Result::unwrap)
                .collect();
        let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let app = axum::Router::new().fallback(any(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                recorded.lock().unwrap().push(headers.clone());
                async move { answer(&method, &uri, &headers, &body) }
            },
        ));
        let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, seen, task }
    }

    /// How many requests it answered, availability checks included.
    fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// The headers of every request forwarded for a caller: not the
    /// availability checks (made as `system:kube-aggregator`).
    fn forwarded(&self) -> Vec<HeaderMap> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|h| values(h, "x-remote-user") != ["system:kube-aggregator"])
            .cloned()
            .collect()
    }

    /// The headers of the last request forwarded for a caller.
    fn last(&self) -> HeaderMap {
        self.forwarded().pop().expect("a forwarded request")
    }
}

/// What the aggregated server answers: its discovery document, a Table or
/// list of ServiceDiagnoses, or what it was sent.
fn answer(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> (StatusCode, [(header::HeaderName, &'static str); 1], String) {
    let json_type = [(header::CONTENT_TYPE, "application/json")];
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let answer = match (method.as_str(), uri.path()) {
        ("GET", "/apis/diagnostics.cloudgateway.io/v1") => json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "diagnostics.cloudgateway.io/v1",
            "resources": [{"name": "servicediagnoses", "singularName": "servicediagnosis", "namespaced": true,
                           "kind": "ServiceDiagnosis", "verbs": ["get", "list"]}],
        }),
        ("GET", DIAGNOSES) if accept.contains("as=Table") => json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0},
                {"name": "Verdict", "type": "string", "format": "", "description": "", "priority": 0},
            ],
            "rows": [{"cells": ["web", "Healthy"], "object": {"kind": "PartialObjectMetadata",
                      "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "web", "namespace": "default"}}}],
        }),
        _ => json!({
            "method": method.as_str(),
            "path": uri.path(),
            "query": uri.query(),
            "body": String::from_utf8_lossy(body),
        }),
    };
    (StatusCode::OK, json_type, answer.to_string())
}

/// A client presenting `token` (none if empty), without kube's retries
/// of 503s.
fn client(server: &ApiServer, token: &str) -> kube::Client {
    let mut config = server.client_config(Some(token).filter(|t| !t.is_empty()));
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// The status and JSON body of one request with extra `headers`.
async fn call(
    client: &kube::Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, Value) {
    let mut request = axum::http::Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let response = client
        .send(request.body(kube::client::Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect_bytes().await.unwrap();
    let parsed = serde_json::from_slice(&body)
        .unwrap_or_else(|_| json!(String::from_utf8_lossy(&body).into_owned()));
    (status, parsed)
}

async fn get(client: &kube::Client, path: &str) -> (u16, Value) {
    call(client, "GET", path, &[], Value::Null).await
}

/// Creates `obj` at `path`, failing the test unless it is created.
async fn create(admin: &kube::Client, path: &str, obj: Value) {
    let (status, body) = call(
        admin,
        "POST",
        path,
        &[("content-type", "application/json")],
        obj,
    )
    .await;
    assert_eq!(status, 201, "{path}: {body}");
}

/// The Service `kube-system/diag` (port 443, named `https`) and its
/// Endpoints: one subset per address, in order.
async fn create_service(admin: &kube::Client, addresses: &[SocketAddr]) {
    create(
        admin,
        "/api/v1/namespaces/kube-system/services",
        json!({"metadata": {"name": "diag"}, "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}),
    )
    .await;
    let subsets: Vec<Value> = addresses
        .iter()
        .map(|a| json!({"addresses": [{"ip": a.ip().to_string()}], "ports": [{"name": "https", "port": a.port()}]}))
        .collect();
    create(
        admin,
        "/api/v1/namespaces/kube-system/endpoints",
        json!({"metadata": {"name": "diag"}, "subsets": subsets}),
    )
    .await;
}

/// The APIService handing the group to `kube-system/diag`, trusting
/// `ca_bundle`.
async fn create_api_service(admin: &kube::Client, ca_bundle: &str) {
    create(
        admin,
        "/apis/apiregistration.k8s.io/v1/apiservices",
        json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": API_SERVICE},
            "spec": {"group": GROUP, "version": "v1", "groupPriorityMinimum": 1000, "versionPriority": 15,
                     "service": {"namespace": "kube-system", "name": "diag", "port": 443},
                     "caBundle": ca_bundle},
        }),
    )
    .await;
}

/// The front proxy's CA, as an aggregated server reads it.
async fn client_ca(admin: &kube::Client) -> String {
    let (status, cm) = get(
        admin,
        "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
    )
    .await;
    assert_eq!(status, 200, "{cm}");
    cm["data"]["requestheader-client-ca-file"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A server checking availability every 100 ms.
async fn server() -> ApiServer {
    ApiServer::start_with(Config {
        aggregation_check_interval: Duration::from_millis(100),
        ..Config::default()
    })
    .await
    .unwrap()
}

/// A server with the backend behind `diag` and the APIService for it.
async fn cluster() -> (ApiServer, kube::Client, Backend) {
    let server = server().await;
    let admin = client(&server, ADMIN_TOKEN);
    let pki = ServingPki::new();
    let backend = Backend::start(&pki, &client_ca(&admin).await).await;
    create_service(&admin, &[backend.addr]).await;
    create_api_service(&admin, &pki.ca_bundle()).await;
    (server, admin, backend)
}

/// The APIService's `Available` condition, if it has one.
async fn available(admin: &kube::Client) -> Option<Value> {
    let (_, a) = get(
        admin,
        &format!("/apis/apiregistration.k8s.io/v1/apiservices/{API_SERVICE}"),
    )
    .await;
    a["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")
        .cloned()
}

/// Waits until the APIService's `Available` condition has `status` and
/// `reason`, and returns it.
async fn until_available(admin: &kube::Client, status: &str, reason: &str) -> Value {
    let mut last = None;
    until(&format!("Available {status} ({reason})"), async || {
        last = available(admin).await;
        last.as_ref()
            .is_some_and(|c| c["status"] == status && c["reason"] == reason)
    })
    .await;
    last.unwrap()
}

fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

#[tokio::test]
async fn requests_go_to_the_backend_as_the_caller_without_its_credentials() {
    within(async {
        let (server, _admin, backend) = cluster().await;
        server.register_token(
            "alice-token",
            TokenUser {
                username: "alice".into(),
                uid: "alice-uid".into(),
                groups: vec!["devs".into()],
                audiences: Vec::new(),
            },
        );
        let alice = client(&server, "alice-token");
        let forged = [
            ("accept", TABLE),
            ("x-remote-user", "admin"),
            ("x-remote-group", "system:masters"),
            ("x-remote-uid", "0"),
        ];
        let (status, table) = call(&alice, "GET", DIAGNOSES, &forged, Value::Null).await;
        assert_eq!(status, 200, "{table}");
        assert_eq!(table["kind"], "Table", "the backend saw the Accept header");
        assert_eq!(table["rows"][0]["cells"], json!(["web", "Healthy"]));
        let seen = backend.last();
        assert_eq!(values(&seen, "x-remote-user"), ["alice"]);
        assert_eq!(
            values(&seen, "x-remote-group"),
            ["devs", "system:authenticated"]
        );
        assert_eq!(values(&seen, "x-remote-uid"), ["alice-uid"]);
        assert!(seen.get(header::AUTHORIZATION).is_none(), "{seen:?}");
        assert_eq!(values(&seen, "accept"), [TABLE]);

        // A body, its type and the query go as they are; so does the answer.
        let (status, echoed) = call(
            &alice,
            "POST",
            &format!("{DIAGNOSES}?dryRun=All"),
            &[("content-type", "application/json")],
            json!({"spec": {"service": "web"}}),
        )
        .await;
        assert_eq!(status, 200, "{echoed}");
        assert_eq!(echoed["method"], "POST");
        assert_eq!(echoed["path"], DIAGNOSES);
        assert_eq!(echoed["query"], "dryRun=All");
        assert_eq!(echoed["body"], r#"{"spec":{"service":"web"}}"#);
        assert_eq!(
            values(&backend.last(), "content-type"),
            ["application/json"]
        );

        // Counted as requests for resources served here are.
        let (_, counts) = get(&client(&server, ADMIN_TOKEN), "/debug/requests").await;
        assert_eq!(
            counts["alice"]["requests"],
            json!({"create servicediagnoses": 1, "list servicediagnoses": 1})
        );
    })
    .await;
}

#[tokio::test]
async fn rbac_is_checked_before_anything_is_forwarded() {
    within(async {
        let (server, _admin, backend) = cluster().await;
        let policy: Vec<Value> = serde_norway::from_str(
            r#"
- kind: ClusterRole
  metadata: {name: diagnoses-reader}
  rules: [{apiGroups: [diagnostics.cloudgateway.io], resources: [servicediagnoses], verbs: [list]}]
- kind: ClusterRoleBinding
  metadata: {name: diagnoses-reader}
  roleRef: {kind: ClusterRole, name: diagnoses-reader}
  subjects: [{kind: User, name: alice}]
"#,
        )
        .unwrap();
        server.enforce_rbac(&policy);
        for (token, user) in [("alice-token", "alice"), ("bob-token", "bob")] {
            server.register_token(
                token,
                TokenUser {
                    username: user.into(),
                    uid: String::new(),
                    groups: Vec::new(),
                    audiences: Vec::new(),
                },
            );
        }
        let (alice, bob) = (client(&server, "alice-token"), client(&server, "bob-token"));
        let nobody = client(&server, "");

        let (status, body) = get(&nobody, DIAGNOSES).await;
        assert_eq!((status, &body["reason"]), (401, &json!("Unauthorized")));
        let (status, body) = get(&bob, DIAGNOSES).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(
            body["message"],
            "servicediagnoses is forbidden: User \"bob\" cannot list resource \"servicediagnoses\" in API group \"diagnostics.cloudgateway.io\" in the namespace \"default\""
        );
        let (status, body) = get(&alice, &format!("{DIAGNOSES}/web")).await;
        assert_eq!(status, 403, "a list grant is not a get grant: {body}");
        assert!(backend.forwarded().is_empty(), "refused, never forwarded");
        let (status, body) = get(&alice, DIAGNOSES).await;
        assert_eq!(status, 200, "{body}");
        let users: Vec<String> = backend
            .forwarded()
            .iter()
            .flat_map(|h| values(h, "x-remote-user"))
            .map(str::to_owned)
            .collect();
        assert_eq!(users, ["alice"]);
        // The discovery document is a URL every authenticated user may
        // read, as `system:discovery` allows.
        let (status, body) = get(&bob, "/apis/diagnostics.cloudgateway.io/v1").await;
        assert_eq!(status, 200, "{body}");
        let report = server.rbac_report().unwrap();
        assert_eq!(report["unused"], json!([]), "{report}");
        assert_eq!(report["denied"].as_array().unwrap().len(), 2, "{report}");
    })
    .await;
}

#[tokio::test]
async fn discovery_lists_the_aggregated_group_and_forwards_its_version() {
    within(async {
        let (_server, admin, _backend) = cluster().await;
        let (_, groups) = get(&admin, "/apis").await;
        let names: Vec<&str> = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"apiregistration.k8s.io"), "{names:?}");
        assert_eq!(names.last(), Some(&GROUP), "{names:?}");
        let (status, group) = get(&admin, "/apis/diagnostics.cloudgateway.io").await;
        assert_eq!(status, 200, "{group}");
        assert_eq!(group["kind"], "APIGroup");
        assert_eq!(
            group["preferredVersion"],
            json!({"groupVersion": "diagnostics.cloudgateway.io/v1", "version": "v1"})
        );
        let (status, resources) = get(&admin, "/apis/diagnostics.cloudgateway.io/v1").await;
        assert_eq!(status, 200, "{resources}");
        assert_eq!(resources["resources"][0]["name"], "servicediagnoses");
        let (status, _) = get(&admin, "/apis/nothing.example").await;
        assert_eq!(status, 404);
    })
    .await;
}

#[tokio::test]
async fn available_follows_the_backend_and_is_written_only_when_it_changes() {
    within(async {
        let (_server, admin, backend) = cluster().await;
        let up = until_available(&admin, "True", "Passed").await;
        assert_eq!(up["message"], "all checks passed");
        // Checks every 100 ms that find nothing new write nothing.
        let rv = |a: &Value| a["metadata"]["resourceVersion"].clone();
        let path = format!("/apis/apiregistration.k8s.io/v1/apiservices/{API_SERVICE}");
        let (_, before) = get(&admin, &path).await;
        let checks = backend.calls();
        until("five more checks", async || backend.calls() >= checks + 5).await;
        let (_, after) = get(&admin, &path).await;
        assert_eq!(rv(&after), rv(&before), "{after}");

        backend.task.abort();
        let down = until_available(&admin, "False", "FailedDiscoveryCheck").await;
        let message = down["message"].as_str().unwrap();
        assert!(
            message.contains("failing or missing response from https://")
                && message.contains("/apis/diagnostics.cloudgateway.io/v1"),
            "{message}"
        );
        let (status, _) = call(
            &admin,
            "DELETE",
            "/api/v1/namespaces/kube-system/endpoints/diag",
            &[],
            Value::Null,
        )
        .await;
        assert_eq!(status, 200);
        let missing = until_available(&admin, "False", "MissingEndpoints").await;
        assert_eq!(
            missing["lastTransitionTime"], down["lastTransitionTime"],
            "still unavailable: no transition"
        );
        let (status, body) = get(&admin, DIAGNOSES).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(
            body["message"],
            "no endpoints available for service \"diag\""
        );

        // The group versions served here are local, and always available.
        let (_, core) = get(&admin, "/apis/apiregistration.k8s.io/v1/apiservices/v1.").await;
        assert_eq!(core["spec"]["group"], "");
        let local = &core["status"]["conditions"][0];
        assert_eq!(
            (&local["status"], &local["reason"]),
            (&json!("True"), &json!("Local"))
        );
    })
    .await;
}

#[tokio::test]
async fn a_dead_endpoint_is_skipped() {
    within(async {
        let server = server().await;
        let admin = client(&server, ADMIN_TOKEN);
        let pki = ServingPki::new();
        let backend = Backend::start(&pki, &client_ca(&admin).await).await;
        let dead = {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            listener.local_addr().unwrap()
        };
        create_service(&admin, &[dead, backend.addr]).await;
        create_api_service(&admin, &pki.ca_bundle()).await;
        // Requests start at each endpoint in turn; every one gets through.
        for _ in 0..4 {
            let (status, body) = get(&admin, DIAGNOSES).await;
            assert_eq!(status, 200, "{body}");
        }
        until_available(&admin, "True", "Passed").await;
    })
    .await;
}

#[tokio::test]
async fn a_backend_the_ca_bundle_did_not_sign_is_not_reached() {
    within(async {
        let server = server().await;
        let admin = client(&server, ADMIN_TOKEN);
        let backend = Backend::start(&ServingPki::new(), &client_ca(&admin).await).await;
        create_service(&admin, &[backend.addr]).await;
        create_api_service(&admin, &ServingPki::new().ca_bundle()).await;
        let (status, body) = get(&admin, DIAGNOSES).await;
        assert_eq!(status, 503, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.starts_with("error trying to reach service: ")
                && message.contains("invalid peer certificate"),
            "{message}"
        );
        let down = until_available(&admin, "False", "FailedDiscoveryCheck").await;
        assert!(
            down["message"]
                .as_str()
                .unwrap()
                .contains("invalid peer certificate"),
            "{down}"
        );
        assert_eq!(
            backend.calls(),
            0,
            "no request, not even a check, got through"
        );
    })
    .await;
}

#[tokio::test]
async fn without_a_service_the_group_is_unavailable() {
    within(async {
        let server = server().await;
        let admin = client(&server, ADMIN_TOKEN);
        create_api_service(&admin, &ServingPki::new().ca_bundle()).await;
        let (status, body) = get(&admin, DIAGNOSES).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["message"], "service unavailable");
        let down = until_available(&admin, "False", "ServiceNotFound").await;
        assert_eq!(
            down["message"],
            "service/diag in \"kube-system\" is not present"
        );
    })
    .await;
}

#[tokio::test]
async fn the_front_proxy_config_map_is_readable_through_the_bootstrap_roles() {
    within(async {
        let server = server().await;
        let policy: Vec<Value> = serde_norway::from_str(
            r#"
- kind: RoleBinding
  metadata: {name: diag-auth-reader, namespace: kube-system}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
  subjects: [{kind: ServiceAccount, name: diag, namespace: kube-system}]
- kind: ClusterRoleBinding
  metadata: {name: diag-auth-delegator}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:auth-delegator}
  subjects: [{kind: ServiceAccount, name: diag, namespace: kube-system}]
"#,
        )
        .unwrap();
        server.enforce_rbac(&policy);
        server.register_token("diag", TokenUser::service_account("kube-system", "diag", &[]));
        let diag = client(&server, "diag");
        let path = "/api/v1/namespaces/kube-system/configmaps";
        let (status, cm) = get(&diag, &format!("{path}/extension-apiserver-authentication")).await;
        assert_eq!(status, 200, "{cm}");
        let fp = server.front_proxy();
        assert_eq!(cm["data"]["requestheader-client-ca-file"], fp.ca_pem);
        assert_eq!(
            cm["data"]["requestheader-allowed-names"],
            r#"["front-proxy-client"]"#
        );
        let (status, list) = get(
            &diag,
            &format!("{path}?fieldSelector=metadata.name%3Dextension-apiserver-authentication"),
        )
        .await;
        assert_eq!(status, 200, "{list}");
        assert_eq!(list["items"].as_array().unwrap().len(), 1);
        let (status, _) = get(&diag, path).await;
        assert_eq!(status, 403, "only the one ConfigMap");
        let (status, _) = get(&diag, "/api/v1/namespaces/default/configmaps").await;
        assert_eq!(status, 403);
        let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                            "spec": {"token": "diag"}});
        let (status, body) = call(
            &diag,
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &[("content-type", "application/json")],
            review,
        )
        .await;
        assert_eq!(status, 201, "{body}");
        let access = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                            "spec": {"user": "alice", "nonResourceAttributes": {"path": "/healthz", "verb": "get"}}});
        let (status, body) = call(
            &diag,
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            &[("content-type", "application/json")],
            access,
        )
        .await;
        assert_eq!(status, 201, "{body}");
        let report = server.rbac_report().unwrap();
        assert_eq!(
            report["unused"],
            json!([]),
            "bootstrap roles are not the manifests' to trim"
        );
        assert_eq!(report["roles"], 0);
    })
    .await;
}

#[tokio::test]
async fn a_restarted_server_publishes_the_front_proxy_of_its_state_dir() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let start = || {
            ApiServer::start_with(Config {
                state_dir: Some(dir.path().to_path_buf()),
                ..Config::default()
            })
        };
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        let published = async |server: &ApiServer| client_ca(&client(server, ADMIN_TOKEN)).await;

        let first = start().await.unwrap();
        let ca = first.front_proxy().ca_pem.clone();
        assert_eq!(read(front_proxy::CA_FILE), ca);
        assert_eq!(
            read(front_proxy::CLIENT_CERT_FILE),
            first.front_proxy().client_cert_pem
        );
        assert_eq!(
            read(front_proxy::CLIENT_KEY_FILE),
            first.front_proxy().client_key_pem
        );
        assert_eq!(published(&first).await, ca);
        drop(first);

        let again = start().await.unwrap();
        assert_eq!(again.front_proxy().ca_pem, ca, "the kept CA is reused");
        assert_eq!(published(&again).await, ca);
        drop(again);

        // Without its files, a new CA, and the kept ConfigMap follows it.
        std::fs::remove_file(dir.path().join(front_proxy::CLIENT_KEY_FILE)).unwrap();
        let renewed = start().await.unwrap();
        let new_ca = renewed.front_proxy().ca_pem.clone();
        assert_ne!(new_ca, ca);
        assert_eq!(read(front_proxy::CA_FILE), new_ca);
        assert_eq!(published(&renewed).await, new_ca);
    })
    .await;
}

/// kubectl, when it is installed: it creates the APIService, lists it
/// with kube-aggregator's columns, and reads the aggregated resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_lists_apiservices_and_gets_the_aggregated_resources() {
    let installed = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        eprintln!("kubectl is not installed; nothing to check");
        return;
    }
    within(async {
        let server = server().await;
        let admin = client(&server, ADMIN_TOKEN);
        let pki = ServingPki::new();
        let backend = Backend::start(&pki, &client_ca(&admin).await).await;
        create_service(&admin, &[backend.addr]).await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let manifest = dir.path().join("apiservice.yaml");
        std::fs::write(
            &manifest,
            format!(
                "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: {API_SERVICE}\nspec:\n  group: {GROUP}\n  version: v1\n  groupPriorityMinimum: 1000\n  versionPriority: 15\n  service: {{namespace: kube-system, name: diag, port: 443}}\n  caBundle: {}\n",
                pki.ca_bundle()
            ),
        )
        .unwrap();
        let kubectl = async |args: &[&str]| {
            let output = tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["--request-timeout", "20s"])
                .args(args)
                .env("KUBECACHEDIR", dir.path().join("cache"))
                .output()
                .await
                .unwrap();
            let (out, err) = (
                String::from_utf8_lossy(&output.stdout).into_owned(),
                String::from_utf8_lossy(&output.stderr).into_owned(),
            );
            assert!(output.status.success(), "kubectl {args:?}: {err}");
            out
        };
        let manifest = manifest.to_str().unwrap();
        kubectl(&["apply", "-f", manifest]).await;
        until_available(&admin, "True", "Passed").await;
        let listed = kubectl(&["get", "apiservices"]).await;
        let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header, ["NAME", "SERVICE", "AVAILABLE", "AGE"], "{listed}");
        let row = listed
            .lines()
            .find(|l| l.starts_with(API_SERVICE))
            .unwrap_or_else(|| panic!("{listed}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[..3], [API_SERVICE, "kube-system/diag", "True"], "{listed}");
        assert!(
            listed.lines().any(|l| l.starts_with("v1.coordination.k8s.io") && l.contains("Local")),
            "{listed}"
        );
        let got = kubectl(&["get", "servicediagnoses.diagnostics.cloudgateway.io", "-n", "default"]).await;
        let lines: Vec<Vec<&str>> = got.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines, [vec!["NAME", "VERDICT"], vec!["web", "Healthy"]], "{got}");
        let raw = kubectl(&["get", "--raw", "/apis/diagnostics.cloudgateway.io/v1"]).await;
        let raw: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(raw["groupVersion"], "diagnostics.cloudgateway.io/v1");
        let accept = backend
            .forwarded()
            .iter()
            .any(|h| values(h, "accept").iter().any(|a| a.contains("as=Table")));
        assert!(accept, "kubectl's Table request reached the backend as sent");
    })
    .await;
}
