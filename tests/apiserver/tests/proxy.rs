//! `pods/proxy` and `services/proxy` end to end: a backend on loopback
//! stands for a controller's admin server, a Pod and a Service with its
//! Endpoints point at it, and requests through the test API server reach
//! it (or fail) as they would through kube-apiserver.

use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Uri, header};
use axum::routing::{any, get};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::{Api, PostParams};
use kube_test_apiserver::{ADMIN_TOKEN, ApiServer, TokenUser};
use serde_json::{Value, json};

/// The admin server of a controller, as far as these tests need one.
async fn backend() -> SocketAddr {
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    "ccm_up 1\n",
                )
            }),
        )
        .route(
            "/teapot",
            get(|| async {
                (
                    axum::http::StatusCode::IM_A_TEAPOT,
                    [(header::CONTENT_TYPE, "application/problem+json")],
                    r#"{"title":"short and stout"}"#,
                )
            }),
        )
        .route(
            "/stream",
            get(|| async {
                let chunks =
                    ["one ", "two ", "three"].map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
                Body::from_stream(tokio_stream::iter(chunks))
            }),
        )
        .route("/{*path}", any(echo))
        .route("/", any(echo));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// What the backend was sent.
async fn echo(
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> ([(header::HeaderName, &'static str); 1], String) {
    let echoed = json!({
        "method": method.as_str(),
        "path": uri.path(),
        "query": uri.query(),
        "body": String::from_utf8_lossy(&body),
        "authorization": headers.get(header::AUTHORIZATION).is_some(),
        "requestId": headers.get("x-request-id").and_then(|v| v.to_str().ok()),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        echoed.to_string(),
    )
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// A client presenting `token`, without kube's retries of 503s (they
/// would make every refusal here take minutes).
fn client(server: &ApiServer, token: &str) -> kube::Client {
    let mut config = server.client_config(Some(token));
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// The status, Content-Type and body of one request.
async fn call(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String, String) {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("x-request-id", "42")
        .body(kube::client::Body::from(body.as_bytes().to_vec()))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect_bytes().await.unwrap();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

async fn get_json(client: &kube::Client, path: &str) -> (u16, Value) {
    let (status, content_type, body) = call(client, "GET", path, "").await;
    assert_eq!(content_type, "application/json", "{path}: {body}");
    (status, serde_json::from_str(&body).unwrap())
}

/// Asserts a kube-apiserver `Status` refusal.
async fn refused(client: &kube::Client, path: &str, code: u16, reason: &str, message: &str) {
    let (status, body) = get_json(client, path).await;
    assert_eq!(status, code, "{path}: {body}");
    assert_eq!(body["kind"], "Status", "{path}: {body}");
    assert_eq!(body["code"], code, "{path}: {body}");
    assert_eq!(body["reason"], reason, "{path}: {body}");
    assert_eq!(body["message"], message, "{path}: {body}");
}

const PODS: &str = "/api/v1/namespaces/default/pods";
const SERVICES: &str = "/api/v1/namespaces/default/services";

/// A controller pod serving admin on `port` (named `admin`), at 127.0.0.1.
fn pod(name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "ccm"}},
        "spec": {"containers": [{"name": "controller", "image": "ccm:test",
                                 "ports": [{"name": "admin", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]},
    })
}

/// A Service whose port `admin` (8080) has its endpoints at 127.0.0.1:`port`.
fn service(name: &str, port: u16) -> (Value, Value) {
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"app": "ccm"},
                 "ports": [{"name": "admin", "port": 8080, "targetPort": "admin"}]},
    });
    let endpoints = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": name, "namespace": "default"},
        "subsets": [{
            "addresses": [{"ip": "127.0.0.1", "targetRef": {"kind": "Pod", "namespace": "default", "name": "ccm-0"}}],
            "ports": [{"name": "admin", "port": port, "protocol": "TCP"}],
        }],
    });
    (service, endpoints)
}

async fn create<K>(client: &kube::Client, obj: Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Clone
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), "default");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj).unwrap(),
    )
    .await
    .unwrap();
}

/// A server with a backend, the pod `ccm-0` and the Service `ccm-gateway`
/// in front of it; the admin's client; the backend's port.
async fn cluster() -> (ApiServer, kube::Client, u16) {
    let server = ApiServer::start().await.unwrap();
    let admin = client(&server, ADMIN_TOKEN);
    let port = backend().await.port();
    create::<Pod>(&admin, pod("ccm-0", port)).await;
    let (svc, endpoints) = service("ccm-gateway", port);
    create::<Service>(&admin, svc).await;
    create::<Endpoints>(&admin, endpoints).await;
    (server, admin, port)
}

#[tokio::test]
async fn pods_proxy_forwards_to_the_pod_and_returns_its_answer_unchanged() {
    let (_server, admin, port) = cluster().await;
    for id in [
        format!("ccm-0:{port}"),
        format!("http:ccm-0:{port}"),
        "ccm-0".into(),
    ] {
        let (status, content_type, body) =
            call(&admin, "GET", &format!("{PODS}/{id}/proxy/metrics"), "").await;
        assert_eq!(
            (status, content_type.as_str(), body.as_str()),
            (200, "text/plain; version=0.0.4", "ccm_up 1\n"),
            "{id}"
        );
    }
    let base = format!("{PODS}/ccm-0:{port}/proxy");

    let (status, echoed) = get_json(
        &admin,
        &format!("{base}/debug/object?key=default%2Fweb&verbose"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(echoed["path"], "/debug/object");
    assert_eq!(echoed["query"], "key=default%2Fweb&verbose");
    assert_eq!(echoed["requestId"], "42", "the caller's headers pass");
    assert_eq!(
        echoed["authorization"], false,
        "the caller's token does not"
    );

    let (status, _, body) = call(
        &admin,
        "POST",
        &format!("{base}/debug/poke/"),
        r#"{"now":true}"#,
    )
    .await;
    let echoed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        (&echoed["method"], &echoed["path"], &echoed["body"]),
        (
            &json!("POST"),
            &json!("/debug/poke/"),
            &json!(r#"{"now":true}"#)
        )
    );
    for method in ["PUT", "PATCH", "DELETE"] {
        let (_, _, body) = call(&admin, method, &format!("{base}/x"), "").await;
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["method"],
            method
        );
    }

    let (status, content_type, body) = call(&admin, "HEAD", &format!("{base}/metrics"), "").await;
    assert_eq!(
        (status, content_type.as_str(), body.as_str()),
        (200, "text/plain; version=0.0.4", "")
    );
    let (status, content_type, body) = call(&admin, "GET", &format!("{base}/teapot"), "").await;
    assert_eq!(
        (status, content_type.as_str(), body.as_str()),
        (
            418,
            "application/problem+json",
            r#"{"title":"short and stout"}"#
        )
    );
    let (status, _, body) = call(&admin, "GET", &format!("{base}/stream"), "").await;
    assert_eq!((status, body.as_str()), (200, "one two three"));
    let (_, echoed) = get_json(&admin, &format!("{base}/")).await;
    assert_eq!(echoed["path"], "/");

    // As kube-apiserver: no path is redirected to the root.
    let request = axum::http::Request::get(format!("{base}?x=1"))
        .body(kube::client::Body::empty())
        .unwrap();
    let response = admin.send(request).await.unwrap();
    assert_eq!(response.status(), 301);
    assert_eq!(response.headers()[header::LOCATION], format!("{base}/?x=1"));
}

#[tokio::test]
async fn pods_proxy_refuses_as_kube_apiserver_does() {
    let (_server, admin, _port) = cluster().await;
    let dead = closed_port().await;
    create::<Pod>(&admin, pod("dead", dead)).await;
    let mut pending = pod("pending", 1);
    pending["status"] = json!({"phase": "Pending"});
    create::<Pod>(&admin, pending).await;

    refused(
        &admin,
        &format!("{PODS}/nowhere/proxy/"),
        404,
        "NotFound",
        "pods \"nowhere\" not found",
    )
    .await;
    refused(
        &admin,
        &format!("{PODS}/pending/proxy/"),
        400,
        "BadRequest",
        "address not allowed",
    )
    .await;
    refused(
        &admin,
        &format!("{PODS}/dead/proxy/metrics"),
        503,
        "ServiceUnavailable",
        &format!(
            "error trying to reach service: dial tcp 127.0.0.1:{dead}: connect: connection refused"
        ),
    )
    .await;
    // kube-apiserver dials the port as written: container port names are
    // not looked up.
    refused(
        &admin,
        &format!("{PODS}/ccm-0:admin/proxy/metrics"),
        503,
        "ServiceUnavailable",
        "error trying to reach service: dial tcp: address tcp/admin: unknown port",
    )
    .await;
    refused(
        &admin,
        &format!("{PODS}/ftp:ccm-0:80/proxy/"),
        400,
        "BadRequest",
        "invalid pod request \"ftp:ccm-0:80\"",
    )
    .await;
    let (status, body) = get_json(&admin, &format!("{PODS}/https:ccm-0:443/proxy/")).await;
    assert_eq!(status, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("http backends only"),
        "{body}"
    );
    let (status, _) = get_json(&admin, &format!("{PODS}/ccm-0/status/extra")).await;
    assert_eq!(status, 404, "only proxy takes a path");
}

#[tokio::test]
async fn services_proxy_forwards_to_the_first_endpoint_at_the_port_named() {
    let (_server, admin, _port) = cluster().await;
    for id in [
        "ccm-gateway:admin",
        "http:ccm-gateway:admin",
        "ccm-gateway:8080",
    ] {
        let (status, content_type, body) =
            call(&admin, "GET", &format!("{SERVICES}/{id}/proxy/metrics"), "").await;
        assert_eq!(
            (status, content_type.as_str(), body.as_str()),
            (200, "text/plain; version=0.0.4", "ccm_up 1\n"),
            "{id}"
        );
    }
    let (_, echoed) = get_json(
        &admin,
        &format!("{SERVICES}/ccm-gateway:admin/proxy/debug/status?verbose=1"),
    )
    .await;
    assert_eq!(
        (&echoed["path"], &echoed["query"]),
        (&json!("/debug/status"), &json!("verbose=1"))
    );

    // The only port is named, so a request must name it, as on a real
    // cluster.
    refused(
        &admin,
        &format!("{SERVICES}/ccm-gateway/proxy/metrics"),
        503,
        "ServiceUnavailable",
        "no endpoints available for service \"ccm-gateway\"",
    )
    .await;
    refused(
        &admin,
        &format!("{SERVICES}/ccm-gateway:grpc/proxy/"),
        503,
        "ServiceUnavailable",
        "no endpoints available for service \"ccm-gateway:grpc\"",
    )
    .await;
    refused(
        &admin,
        &format!("{SERVICES}/ccm-gateway:9999/proxy/"),
        503,
        "ServiceUnavailable",
        "no service port 9999 found for service \"ccm-gateway\"",
    )
    .await;

    let (svc, mut endpoints) = service("idle", 1);
    endpoints["subsets"] = json!([]);
    create::<Service>(&admin, svc).await;
    create::<Endpoints>(&admin, endpoints).await;
    refused(
        &admin,
        &format!("{SERVICES}/idle:admin/proxy/"),
        503,
        "ServiceUnavailable",
        "no endpoints available for service \"idle\"",
    )
    .await;

    let dead = closed_port().await;
    let (svc, endpoints) = service("dead", dead);
    create::<Service>(&admin, svc).await;
    create::<Endpoints>(&admin, endpoints).await;
    refused(
        &admin,
        &format!("{SERVICES}/dead:admin/proxy/metrics"),
        503,
        "ServiceUnavailable",
        &format!(
            "error trying to reach service: dial tcp 127.0.0.1:{dead}: connect: connection refused"
        ),
    )
    .await;

    let (svc, _) = service("unbacked", 1);
    create::<Service>(&admin, svc).await;
    refused(
        &admin,
        &format!("{SERVICES}/unbacked:admin/proxy/"),
        404,
        "NotFound",
        "endpoints \"unbacked\" not found",
    )
    .await;
}

#[tokio::test]
async fn proxy_is_authorized_as_a_subresource_on_the_name_as_written() {
    let (server, _admin, port) = cluster().await;
    let policy = kube_test_apiserver::documents(
        r#"
kind: Role
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: ccm-inspect, namespace: default}
rules:
  - {apiGroups: [""], resources: [services/proxy], verbs: [get], resourceNames: ["ccm-gateway:admin"]}
  - {apiGroups: [""], resources: [pods/proxy], verbs: [get]}
---
kind: RoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: ccm-inspect, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: ccm-inspect}
subjects: [{kind: User, name: operator}]
"#,
    )
    .unwrap();
    server.enforce_rbac(&policy);
    for user in ["operator", "stranger"] {
        server.register_token(
            format!("{user}-token"),
            TokenUser {
                username: user.into(),
                uid: user.into(),
                groups: vec![],
                audiences: vec![],
            },
        );
    }
    let operator = client(&server, "operator-token");
    let stranger = client(&server, "stranger-token");

    let metrics = |id: &str| format!("{PODS}/{id}/proxy/metrics");
    let (status, _, body) = call(&operator, "GET", &metrics(&format!("ccm-0:{port}")), "").await;
    assert_eq!((status, body.as_str()), (200, "ccm_up 1\n"));
    refused(
        &stranger,
        &metrics(&format!("ccm-0:{port}")),
        403,
        "Forbidden",
        &format!("pods/proxy \"ccm-0:{port}\" is forbidden: User \"stranger\" cannot get resource \"pods/proxy\" in API group \"\" in the namespace \"default\""),
    )
    .await;
    let (status, _, _) = call(&operator, "POST", &metrics(&format!("ccm-0:{port}")), "").await;
    assert_eq!(status, 403, "POST is create, which the role does not grant");

    let (status, _, body) = call(
        &operator,
        "GET",
        &format!("{SERVICES}/ccm-gateway:admin/proxy/metrics"),
        "",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "ccm_up 1\n"));
    // resourceNames match the name segment as written, port and scheme
    // included, as kube-apiserver matches them.
    for other in ["ccm-gateway:8080", "http:ccm-gateway:admin"] {
        let (status, _, body) = call(
            &operator,
            "GET",
            &format!("{SERVICES}/{other}/proxy/metrics"),
            "",
        )
        .await;
        assert_eq!(status, 403, "{other}: {body}");
    }

    let report = server.rbac_report().unwrap();
    let denied: Vec<String> = report["denied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            format!(
                "{} {} {} {}",
                d["user"].as_str().unwrap(),
                d["verb"].as_str().unwrap(),
                d["resource"].as_str().unwrap(),
                d["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        denied,
        [
            format!("stranger get pods/proxy ccm-0:{port}"),
            format!("operator create pods/proxy ccm-0:{port}"),
            "operator get services/proxy ccm-gateway:8080".into(),
            "operator get services/proxy http:ccm-gateway:admin".into(),
        ]
    );
    assert_eq!(report["unused"], json!([]), "both grants were used");
}

#[tokio::test]
async fn discovery_lists_the_proxy_subresources_and_endpoints() {
    let server = ApiServer::start().await.unwrap();
    let admin = client(&server, ADMIN_TOKEN);
    let (_, list) = get_json(&admin, "/api/v1").await;
    let find = |name: &str| {
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing from {list}"))
    };
    let verbs = json!(["create", "delete", "get", "patch", "update"]);
    for (name, kind) in [
        ("pods/proxy", "PodProxyOptions"),
        ("services/proxy", "ServiceProxyOptions"),
    ] {
        let r = find(name);
        assert_eq!(
            (&r["kind"], &r["verbs"], &r["namespaced"]),
            (&json!(kind), &verbs, &json!(true)),
            "{r}"
        );
    }
    assert_eq!(
        find("pods/status")["verbs"],
        json!(["get", "patch", "update"])
    );
    let endpoints = find("endpoints");
    assert_eq!(
        (&endpoints["kind"], &endpoints["shortNames"]),
        (&json!("Endpoints"), &json!(["ep"]))
    );
    let (_, csr) = get_json(&admin, "/apis/certificates.k8s.io/v1").await;
    let names: Vec<&str> = csr["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "certificatesigningrequests",
            "certificatesigningrequests/approval",
            "certificatesigningrequests/status"
        ]
    );
}
