//! Secure serving, tested as an attacker would: what a stranger with
//! random tokens costs the API server through an admin port, whether one
//! identity borrows another's grant, whether a token a peer receives calls
//! the Kubernetes API, and whether the sandbox leaves its credentials
//! readable by others.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ccm_runtime::admin::access::{self, Access, ReviewLabels, ReviewLimits, Reviews};
use ccm_sandbox::admin::admin_get;
use ccm_sandbox::{Options, Sandbox};
use futures::StreamExt as _;
use kube_test_apiserver::{ADMIN_TOKEN, ApiServer, TokenUser};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const LIMIT: Duration = Duration::from_secs(120);

async fn within<T>(what: &str, work: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, work)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {LIMIT:?}"))
}

/// An admin port in this process that reviews tokens with `api` (as its
/// admin, whom RBAC lets create reviews) within `limits`; its address and
/// its counts of reviews.
async fn admin_port(api: &ApiServer, limits: &ReviewLimits) -> (SocketAddr, access::ReviewCounts) {
    let mut registry = Registry::default();
    let counts = access::register(&mut registry);
    let reviews = Reviews::new(api.client().await.unwrap(), limits, counts.clone());
    let security = ccm_runtime::admin::Security {
        tls: ccm_runtime::tls::ServerTls::self_signed(&["localhost".into()], &[b"http/1.1"])
            .unwrap(),
        access: Access::new(
            access::DEFAULT_ALWAYS_ALLOW
                .iter()
                .map(|p| (*p).to_owned())
                .collect(),
            Some(reviews.check()),
        ),
    };
    let readiness = ccm_runtime::admin::Readiness::new();
    readiness.set(true);
    let addr = ccm_runtime::admin::spawn(
        "127.0.0.1:0".parse().unwrap(),
        registry,
        readiness,
        ccm_runtime::inspect::Inspection::new(),
        security,
    )
    .await
    .unwrap();
    (addr, counts)
}

fn random_token() -> String {
    format!("{}.{}", uuid::Uuid::new_v4(), uuid::Uuid::new_v4())
}

/// Anyone who reaches an admin port can send it tokens; each new one used
/// to cost a TokenReview. Now a flood of 3,000 random tokens costs the API
/// server no more reviews than the limits allow (a burst of twice the rate,
/// then the rate), the rest are answered 429 and counted, concurrent
/// requests with one token share one review, the probes answer throughout,
/// and a real caller gets in once the flood ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_tokens_cost_the_api_server_a_bounded_number_of_reviews() {
    within("the flood", async {
        let api = ApiServer::start().await.unwrap();
        let limits = ReviewLimits {
            per_second: 5.0,
            in_flight: 2,
        };
        let (addr, counts) = admin_port(&api, &limits).await;

        // Fifty requests at once with one token the API server does not
        // know: one review, one answer for all.
        let before = api.token_reviews();
        let one = random_token();
        let answers: Vec<u16> = futures::stream::iter(0..50)
            .map(|_| admin_get(addr, "/metrics", Some(&one)))
            .buffer_unordered(50)
            .map(|r| r.unwrap().0)
            .collect()
            .await;
        assert!(answers.iter().all(|s| *s == 401), "{answers:?}");
        assert_eq!(api.token_reviews() - before, 1, "one review for one token");

        let flooding = Arc::new(AtomicBool::new(true));
        let probes = tokio::spawn({
            let flooding = flooding.clone();
            async move {
                let mut answered = 0;
                while flooding.load(Ordering::Relaxed) {
                    let (status, _) = admin_get(addr, "/healthz", None).await.unwrap();
                    assert_eq!(status, 200, "/healthz during the flood");
                    answered += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answered
            }
        });
        let before = api.token_reviews();
        let start = Instant::now();
        let answers: Vec<u16> = futures::stream::iter(0..3000)
            .map(|_| async { admin_get(addr, "/metrics", Some(&random_token())).await })
            .buffer_unordered(64)
            .map(|r| r.unwrap().0)
            .collect()
            .await;
        let elapsed = start.elapsed().as_secs_f64();
        flooding.store(false, Ordering::Relaxed);
        let probed = probes.await.unwrap();
        let reviews = api.token_reviews() - before;
        let allowed = 2.0 * limits.per_second + limits.per_second * elapsed;
        assert!(
            reviews as f64 <= allowed.ceil(),
            "{reviews} TokenReviews for 3,000 random tokens in {elapsed:.1} s; at most {allowed:.0}"
        );
        let limited = answers.iter().filter(|s| **s == 429).count();
        assert!(
            answers.iter().all(|s| *s == 401 || *s == 429),
            "only 401 and 429: {:?}",
            answers
                .iter()
                .filter(|s| **s != 401 && **s != 429)
                .collect::<Vec<_>>()
        );
        assert_eq!(
            limited + reviews as usize,
            3000,
            "each token reviewed or refused for load"
        );
        assert_eq!(
            counts
                .get_or_create(&ReviewLabels { result: "limited" })
                .get(),
            limited as u64,
            "every 429 counted"
        );
        assert!(probed > 0, "the probes were asked during the flood");

        // A caller the API server knows gets in once the flood is over.
        ccm_testkit::env::eventually("the admin token gets /metrics", || async {
            let (status, _) = admin_get(addr, "/metrics", Some(ADMIN_TOKEN))
                .await
                .unwrap();
            (status == 200).then_some(())
        })
        .await;
    })
    .await;
}

const METRICS_FOR_SRE: &str = r#"
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: metrics}
rules:
  - {nonResourceURLs: [/metrics], verbs: [get]}
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: sre-metrics}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics}
subjects: [{kind: Group, name: sre}]
"#;

/// A grant belongs to the whole identity the API server reviewed: two
/// tokens of one user name in other groups are two questions, even within
/// the time an answer is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_name_in_other_groups_does_not_borrow_a_grant() {
    within("the grants", async {
        let api = ApiServer::start().await.unwrap();
        api.enforce_rbac(&kube_test_apiserver::documents(METRICS_FOR_SRE).unwrap());
        let user = |groups: &[&str]| TokenUser {
            username: "alice".into(),
            uid: String::new(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            audiences: Vec::new(),
        };
        api.register_token("alice-on-call", user(&["sre"]));
        api.register_token("alice-off-call", user(&["dev"]));
        let (addr, _) = admin_port(&api, &ReviewLimits::default()).await;
        let get = |token: &'static str| async move {
            admin_get(addr, "/metrics", Some(token)).await.unwrap().0
        };
        let start = Instant::now();
        assert_eq!(get("alice-on-call").await, 200);
        assert_eq!(get("alice-off-call").await, 403);
        assert_eq!(get("alice-on-call").await, 200);
        assert!(
            start.elapsed() < access::CACHE_FOR,
            "all asked while the first answer was kept"
        );
    })
    .await;
}

/// A sandbox under the chart's RBAC, with kube-apiserver's view of the
/// diagnostics API, as `kubectl ccm` uses it.
async fn sandbox_under_rbac(dir: &Path) -> Sandbox {
    let policy = dir.join("chart.yaml");
    ccm_testkit::chart::render_to(&policy, &["gateway.provider=sim"]).unwrap();
    Sandbox::start(Options {
        rbac: Some(policy),
        ..Options::new(dir.join("state"), ccm_testkit::bin_dir())
    })
    .await
    .unwrap()
}

/// A server holding the gateway's own certificate and key (as whoever took
/// a gateway's place would), which answers `{}` to everything and hands
/// over each request's `Authorization` header.
async fn impostor(
    cert: PathBuf,
    key: PathBuf,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let tls = ccm_runtime::tls::ServerTls::from_files(
        ccm_runtime::tls::PemFiles {
            cert,
            key,
            client_ca: None,
        },
        &[b"http/1.1"],
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, seen) = (tls.acceptor(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request);
                if let Some(token) = text.lines().find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("authorization")
                        .then(|| value.trim().trim_start_matches("Bearer ").to_owned())
                }) {
                    let _ = seen.send(token);
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                    )
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, heard)
}

/// Whoever answers a controller's question in a peer's place (here, a
/// server with the gateway's own certificate, listed as its endpoint)
/// receives a token the API server refuses: the controllers' API
/// credentials never leave their process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_a_peer_receives_calls_no_kubernetes_api() {
    let dir = tempfile::tempdir().unwrap();
    within("the captured token", async {
        let sandbox = sandbox_under_rbac(dir.path()).await;
        let state = sandbox.options.state_dir.clone();
        let (addr, mut heard) =
            impostor(state.join("pki/gateway.crt"), state.join("pki/gateway.key")).await;
        let admin = sandbox.client().await.unwrap();
        let endpoints: kube::Api<k8s_openapi::api::core::v1::Endpoints> =
            kube::Api::namespaced(admin.clone(), ccm_sandbox::NAMESPACE);
        endpoints
            .patch(
                "ccm-gateway",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"subsets": [{
                    "addresses": [{"ip": "127.0.0.1"}],
                    "ports": [{"name": "admin", "port": addr.port(), "protocol": "TCP"}],
                }]})),
            )
            .await
            .unwrap();
        // The diagnostics API asks the gateway (its endpoint, now the
        // impostor) for its status.
        let token = loop {
            let request = http::Request::get(
                "/apis/diagnostics.cloudgateway.io/v1/namespaces/kube-system/components/gateway",
            )
            .body(Vec::new())
            .unwrap();
            let _ = admin.request_text(request).await;
            if let Ok(token) = heard.try_recv() {
                break token;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        assert!(!token.is_empty(), "the peer was sent a token");
        // The token is of the controllers' ServiceAccounts, for the admin
        // ports only: the API server does not take it.
        let mut config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&sandbox.kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        let captured = kube::Client::try_from(config).unwrap();
        let refused = kube::Api::<k8s_openapi::api::core::v1::Node>::all(captured)
            .list(&Default::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(s) if s.code == 401),
            "the captured token reached the API: {refused:?}"
        );
    })
    .await;
}

/// The files of a directory tree, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else if path.is_file() {
            found.push(path);
        }
    }
    found
}

/// Whether a file holds a credential: a private key, a token, or a
/// kubeconfig or tokens file (which carry tokens).
fn holds_a_secret(path: &Path) -> bool {
    let name = path.file_name().unwrap().to_string_lossy();
    if name.ends_with(".log") {
        // Logs name no secret (tests elsewhere prove it); their words are
        // not read as one here.
        return false;
    }
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b[..b.len().min(1 << 20)]).into_owned())
        .unwrap_or_default();
    name.ends_with(".key")
        || name.ends_with(".token")
        || name.starts_with("kubeconfig")
        || name.contains("tokens")
        || text.contains("PRIVATE KEY")
        || text.contains("token:")
}

/// Every file the sandbox writes that holds a key or a token is its
/// owner's alone (0600), as a Secret the kubelet mounts: the gateway's and
/// the diagnostics API's keys, the autoscaler's, the API server's CA and
/// signing keys, every token and kubeconfig.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_keeps_every_key_and_token_to_its_owner() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    within("the sandbox's files", async {
        let sandbox = Sandbox::start(Options::new(
            dir.path().join("state"),
            ccm_testkit::bin_dir(),
        ))
        .await
        .unwrap();
        let state = sandbox.options.state_dir.clone();
        let secrets: Vec<PathBuf> = files(&state)
            .into_iter()
            .filter(|p| holds_a_secret(p))
            .collect();
        let names: Vec<String> = secrets
            .iter()
            .map(|p| p.strip_prefix(&state).unwrap().display().to_string())
            .collect();
        for expected in [
            "kubeconfig",
            "kubeconfig-node-controller",
            "kubeconfig-cloud-gateway",
            "tokens/node.token",
            "tokens/admin.token",
            "tokens/node-controller-peer.token",
            "gateway-tokens.yaml",
            "apiserver-tokens.yaml",
            "pki/gateway.key",
            "pki/diagnostics.key",
            "client-pki/autoscaler.key",
            "apiserver/ca.key",
            "apiserver/sa.key",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} not among {names:?}"
            );
        }
        let loose: Vec<String> = secrets
            .iter()
            .filter(|p| std::fs::metadata(p).unwrap().permissions().mode() & 0o077 != 0)
            .map(|p| {
                let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
                format!("{} ({mode:o})", p.strip_prefix(&state).unwrap().display())
            })
            .collect();
        assert!(loose.is_empty(), "readable by others: {loose:?}");
    })
    .await;
}
