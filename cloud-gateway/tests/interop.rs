//! The gateway as tools outside this project see it: malformed bytes on the
//! wire, health checks, server reflection driven by a Python client with
//! none of our code, the admin endpoints, and the real binary.

mod harness;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::{Buf, BufMut};
use ccm_proto::v1::instances_client::InstancesClient;
use ccm_proto::v1::load_balancers_client::LoadBalancersClient;
use ccm_proto::v1::routes_client::RoutesClient;
use ccm_proto::v1::{
    CreateRouteRequest, EnsureLoadBalancerRequest, GetInstancesRequest, LoadBalancerSpec, NodeRef,
    Route, ServicePort, ServiceRef,
};
use cloud_gateway::identity::Role;
use harness::{TestGateway, timed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Status};

fn authed<T>(gw: &TestGateway, role: Role, message: T) -> Request<T> {
    let token = std::fs::read_to_string(gw.token_file(role)).unwrap();
    let mut request = Request::new(message);
    let header: MetadataValue<_> = format!("Bearer {}", token.trim()).parse().unwrap();
    request.metadata_mut().insert("authorization", header);
    request
}

async fn channel(gw: &TestGateway) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(gw.address())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn fields(status: &Status) -> Vec<String> {
    use tonic_types::StatusExt;
    status
        .get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_naming_every_field() {
    let gw = TestGateway::start(|_| {}).await;
    let ch = channel(&gw).await;

    let too_many = GetInstancesRequest {
        cluster_name: "kubernetes".into(),
        nodes: vec![
            NodeRef {
                name: "n".into(),
                provider_id: String::new()
            };
            5000
        ],
        ..Default::default()
    };
    let err = InstancesClient::new(ch.clone())
        .get_instances(authed(&gw, Role::Node, too_many))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(fields(&err), ["nodes"]);

    let empty = GetInstancesRequest {
        cluster_name: String::new(),
        nodes: vec![
            NodeRef::default(),
            NodeRef {
                name: "Not_A_Name".into(),
                provider_id: String::new(),
            },
        ],
        ..Default::default()
    };
    let err = InstancesClient::new(ch.clone())
        .get_instances(authed(&gw, Role::Node, empty))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(fields(&err), ["cluster_name", "nodes[0]", "nodes[1].name"]);

    let no_spec = EnsureLoadBalancerRequest {
        cluster_name: "kubernetes".into(),
        ..Default::default()
    };
    let err = LoadBalancersClient::new(ch.clone())
        .ensure_load_balancer(authed(&gw, Role::Service, no_spec))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), fields(&err)),
        (Code::InvalidArgument, vec!["spec".to_owned()])
    );

    let huge = EnsureLoadBalancerRequest {
        cluster_name: "kubernetes".into(),
        spec: Some(LoadBalancerSpec {
            service: Some(ServiceRef {
                namespace: "default".into(),
                name: "web".into(),
                uid: "u-1".into(),
            }),
            ports: vec![ServicePort {
                name: String::new(),
                protocol: 1,
                port: 80,
                node_port: 30000,
            }],
            annotations: [("big".to_owned(), "x".repeat(300 * 1024))].into(),
            ..Default::default()
        }),
        hosts: vec![],
    };
    let err = LoadBalancersClient::new(ch.clone())
        .ensure_load_balancer(authed(&gw, Role::Service, huge))
        .await
        .unwrap_err();
    assert_eq!(fields(&err), ["spec.annotations"]);

    let bad_route = CreateRouteRequest {
        cluster_name: "kubernetes".into(),
        name_hint: "u".into(),
        route: Some(Route {
            destination_cidr: "10.0.0.0/99".into(),
            ..Default::default()
        }),
    };
    let err = RoutesClient::new(ch.clone())
        .create_route(authed(&gw, Role::Route, bad_route))
        .await
        .unwrap_err();
    assert_eq!(
        fields(&err),
        ["route.target_node", "route.destination_cidr"]
    );
    assert!(
        gw.client(Role::Route)
            .list_routes()
            .await
            .unwrap()
            .is_empty(),
        "nothing was written"
    );
}

/// Sends raw bytes as a request body, whatever they are.
#[derive(Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let out = src.chunk().to_vec();
        src.advance(out.len());
        Ok(Some(out))
    }
}

#[tokio::test]
async fn bytes_that_are_not_protobuf_get_invalid_argument_and_the_gateway_lives_on() {
    let gw = TestGateway::start(|_| {}).await;
    let mut grpc = tonic::client::Grpc::new(channel(&gw).await);
    for garbage in [
        vec![0xff; 64],
        vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        b"hello".to_vec(),
    ] {
        grpc.ready().await.unwrap();
        let err = grpc
            .unary(
                authed(&gw, Role::Node, garbage),
                "/cloudgateway.v1.Instances/GetInstances".parse().unwrap(),
                RawCodec,
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
    timed(gw.client(Role::Node).provider_info())
        .await
        .expect("still serving");
}

#[tokio::test]
async fn health_reports_serving_for_the_server_and_each_service() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let gw = TestGateway::start(|_| {}).await;
    let mut health = HealthClient::new(channel(&gw).await);
    for service in [
        "",
        "cloudgateway.v1.Instances",
        "cloudgateway.v1.LoadBalancers",
        "cloudgateway.v1.Routes",
    ] {
        let status = timed(async {
            loop {
                // Readiness flips as soon as the provider answers; wait for it.
                let reply = health
                    .check(HealthCheckRequest {
                        service: service.into(),
                    })
                    .await
                    .map(|r| r.into_inner().status());
                if let Ok(ServingStatus::Serving) = reply {
                    break reply;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert_eq!(status.unwrap(), ServingStatus::Serving, "{service:?}");
    }
}

/// A CA made here and an admin certificate it signed, as PEM files in
/// `dir`: the gateway's admin port serves the certificate, and the test
/// trusts the CA.
fn admin_certificate(dir: &Path) -> (ccm_runtime::tls::PemFiles, Vec<u8>) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let issuer =
        rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let files = ccm_runtime::tls::PemFiles {
        cert: dir.join("admin.crt"),
        key: dir.join("admin.key"),
        client_ca: None,
    };
    std::fs::write(&files.cert, leaf.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    (files, issuer.pem().into_bytes())
}

/// `GET path` on the admin port over HTTPS, trusting `ca`, with `token`.
async fn https_get(
    addr: std::net::SocketAddr,
    ca: &[u8],
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let config = ccm_runtime::tls::client_config(ca, "the test CA", None, &[b"http/1.1"]).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn admin_endpoints_report_liveness_readiness_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (files, ca) = admin_certificate(dir.path());
    let gw = TestGateway::start(|s| s.admin.tls = Some(files)).await;
    gw.create_instance("node-a").await;
    let node = gw.client(Role::Node);
    for _ in 0..2 {
        node.get_instances(
            vec![NodeRef {
                name: "node-a".into(),
                provider_id: String::new(),
            }],
            ccm_proto::v1::LookupPurpose::Refresh,
            false,
        )
        .await
        .unwrap();
    }
    let _ = gw
        .client(Role::Route)
        .get_instances(vec![], ccm_proto::v1::LookupPurpose::Refresh, false)
        .await;
    let admin = gw.gateway.admin_addr;
    let http_get = |path: &'static str, token: Option<String>| {
        let ca = ca.clone();
        async move { https_get(admin, &ca, path, token.as_deref()).await }
    };
    // Probes answer anyone; the rest only the gateway's admin role, with
    // no API server to review other tokens.
    assert_eq!(timed(http_get("/livez", None)).await.0, 200);
    assert_eq!(timed(http_get("/healthz", None)).await.0, 200);
    let ready = timed(async {
        loop {
            if http_get("/readyz", None).await.0 == 200 {
                break true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(ready);
    let token = |role| {
        Some(
            std::fs::read_to_string(gw.token_file(role))
                .unwrap()
                .trim()
                .to_owned(),
        )
    };
    assert_eq!(timed(http_get("/metrics", None)).await.0, 401);
    assert_eq!(timed(http_get("/debug/status", None)).await.0, 401);
    assert_eq!(timed(http_get("/metrics", token(Role::Node))).await.0, 401);
    let (status, metrics) = timed(http_get("/metrics", token(Role::Admin))).await;
    assert_eq!(status, 200);
    for expected in [
        r#"cloud_gateway_grpc_requests_total{method="/cloudgateway.v1.Instances/GetInstances",code="Ok"} 2"#,
        r#"cloud_gateway_grpc_requests_total{method="/cloudgateway.v1.Instances/GetInstances",code="PermissionDenied"} 1"#,
        r#"cloud_gateway_cloud_calls_total{operation="get_instances",outcome="ok"} 1"#,
        r#"cloud_gateway_instance_cache_total{result="hit"} 1"#,
        r#"cloud_gateway_instance_cache_total{result="miss"} 1"#,
        "cloud_gateway_budget_wait_seconds_bucket",
        "cloud_gateway_cloud_call_duration_seconds_bucket",
    ] {
        assert!(metrics.contains(expected), "missing {expected}\n{metrics}");
    }
}

fn python_client(args: &[&str]) -> (i32, serde_json::Value) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tools/reflect_client.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("ModuleNotFoundError"),
        "the Python gRPC client needs its packages: pip install -r tests/requirements.txt\n{stderr}"
    );
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON from the client ({e}): {stderr}"));
    (out.status.code().unwrap_or(-1), json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_none_of_our_code_uses_reflection_and_a_token() {
    let gw = TestGateway::start(|_| {}).await;
    gw.create_instance("node-a").await;
    let addr = gw.gateway.grpc_addr.to_string();
    let node_token = gw.token_file(Role::Node).to_str().unwrap().to_owned();
    let result = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for version in ["v1", "v1alpha"] {
            out.push(python_client(&[&addr, "list", "--reflection", version]));
        }
        out.push(python_client(&[&addr, "health"]));
        let body =
            r#"{"cluster_name": "kubernetes", "nodes": [{"name": "node-a"}, {"name": "ghost"}]}"#;
        out.push(python_client(&[
            &addr,
            "call",
            "cloudgateway.v1.Instances/GetInstances",
            body,
            "--token-file",
            &node_token,
        ]));
        out.push(python_client(&[
            &addr,
            "call",
            "cloudgateway.v1.Instances/GetInstances",
            body,
        ]));
        out
    })
    .await
    .unwrap();
    for (code, services) in &result[..2] {
        assert_eq!(*code, 0);
        for name in [
            "cloudgateway.v1.Instances",
            "cloudgateway.v1.LoadBalancers",
            "cloudgateway.v1.Routes",
            "cloudgateway.v1.SimAdmin",
            "grpc.health.v1.Health",
        ] {
            assert!(
                services.as_array().unwrap().iter().any(|s| s == name),
                "{name} missing: {services}"
            );
        }
    }
    assert_eq!(result[2].1["status"], "SERVING");
    let (code, answer) = &result[3];
    assert_eq!(*code, 0, "{answer}");
    assert_eq!(answer["results"][0]["state"], "INSTANCE_STATE_RUNNING");
    assert_eq!(
        answer["results"][0]["instance"]["provider_id"],
        "sim://i-000001"
    );
    assert_eq!(answer["results"][1]["state"], "INSTANCE_STATE_NOT_FOUND");
    let (code, refused) = &result[4];
    assert_eq!(
        (*code, refused["code"].as_str()),
        (3, Some("UNAUTHENTICATED"))
    );
}

fn gateway_binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cloud-gateway"))
}

#[test]
fn invalid_configuration_exits_non_zero_listing_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, "tokens:\n  - {token: short, role: wizard}\n").unwrap();
    let out = gateway_binary()
        .args([
            "--listen",
            "nowhere",
            "--budget-rate=-1",
            "--batch-window",
            "5s",
            "--log-format",
            "xml",
        ])
        .arg("--tokens-file")
        .arg(&tokens)
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for key in [
        "listen:",
        "provider: required",
        "budget-rate:",
        "batch-window:",
        "log-format:",
        "tokens[0].token",
        "tokens[0].role",
    ] {
        assert!(stderr.contains(key), "{key} missing from:\n{stderr}");
    }
    assert!(!dir.path().join("sim-cloud.db").exists(), "nothing started");
}

#[test]
fn the_binary_serves_audits_writes_without_leaking_tokens_and_drains_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = gateway_binary()
        .args([
            "--provider",
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--insecure-plaintext",
            "true",
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = Vec::new();
    let grpc = loop {
        let line = lines.next().expect("gateway logs its address").unwrap();
        log.push(line.clone());
        let entry: serde_json::Value = serde_json::from_str(&line).unwrap();
        if let Some(addr) = entry["grpc"].as_str() {
            break addr.to_owned();
        }
    };
    let token = std::fs::read_to_string(dir.path().join("tokens/service.token")).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = ccm_proto::GatewayClient::new(ccm_proto::ClientConfig::new(
            format!("http://{grpc}"),
            "kubernetes",
            ccm_proto::TokenSource::Static(token.trim().to_owned()),
        ))
        .unwrap();
        let spec = LoadBalancerSpec {
            service: Some(ServiceRef {
                namespace: "default".into(),
                name: "web".into(),
                uid: "0000-1".into(),
            }),
            ports: vec![ServicePort {
                name: String::new(),
                protocol: 1,
                port: 80,
                node_port: 30000,
            }],
            ..Default::default()
        };
        timed(client.ensure_load_balancer(spec, vec![]))
            .await
            .unwrap();
    });
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    log.extend(lines.map_while(Result::ok));
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
    let log = log.join("\n");
    assert!(
        log.contains(r#""operation":"ensure_load_balancer""#)
            && log.contains(r#""target":"audit""#),
        "no audit line:\n{log}"
    );
    assert!(log.contains(r#""caller":"generated-service""#), "{log}");
    assert!(!log.contains(token.trim()), "a token leaked into the log");
    assert!(log.contains("cloud-gateway stopped"), "{log}");
}
