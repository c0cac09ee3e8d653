//! In-cluster authentication at the gateway: controllers present projected
//! ServiceAccount tokens, the gateway asks the Kubernetes API (TokenReview,
//! here the test API server's) and maps the ServiceAccount to a role.

use std::collections::HashMap;
use std::time::Duration;

use ccm_proto::v1::{LookupPurpose, NodeRef};
use ccm_proto::{ClientConfig, Error, GatewayClient, RetryPolicy, TokenSource};
use cloud_gateway::Gateway;
use cloud_gateway::identity::Role;
use cloud_gateway::layers::service_accounts::ServiceAccountAuth;
use cloud_gateway::settings::Settings;
use kube_test_apiserver::{ApiServer, TokenUser};
use tokio_util::sync::CancellationToken;

const AUDIENCE: &str = "cloud-gateway";

struct Env {
    api: ApiServer,
    gateway: Gateway,
    dir: tempfile::TempDir,
    _shutdown: tokio_util::sync::DropGuard,
}

async fn start() -> Env {
    start_with(Duration::from_secs(30)).await
}

async fn start_with(cache_ttl: Duration) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::start().await.unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let mut settings = Settings::local(dir.path().join("gateway"));
    settings.service_accounts = Some(ServiceAccountAuth {
        roles: HashMap::from([
            (
                "system:serviceaccount:kube-system:ccm-node-controller".into(),
                Role::Node,
            ),
            (
                "system:serviceaccount:kube-system:ccm-service-controller".into(),
                Role::Service,
            ),
        ]),
        audience: AUDIENCE.into(),
        cache_ttl,
        kubeconfig: Some(kubeconfig),
        reviews_per_second: 20.0,
        reviews_in_flight: 8,
    });
    // The floods below open a connection per token: these tests are about
    // reviews, not about the connection and request limits.
    settings.limits.max_connections = 10_000;
    settings.limits.max_in_flight = 10_000;
    let shutdown = CancellationToken::new();
    let gateway = Gateway::start(settings, shutdown.clone()).await.unwrap();
    Env {
        api,
        gateway,
        dir,
        _shutdown: shutdown.drop_guard(),
    }
}

impl Env {
    fn client(&self, token: TokenSource) -> GatewayClient {
        let mut config = ClientConfig::new(
            format!("http://{}", self.gateway.grpc_addr),
            "kubernetes",
            token,
        );
        config.retry = RetryPolicy::none();
        GatewayClient::new(config).unwrap()
    }

    fn with_token(&self, token: &str) -> GatewayClient {
        self.client(TokenSource::Static(token.into()))
    }

    /// A client with a valid token of the node controller, `node-token`.
    fn node_controller(&self) -> GatewayClient {
        self.api
            .register_token("node-token", node_controller(&[AUDIENCE]));
        self.with_token("node-token")
    }
}

fn node_controller(audiences: &[&str]) -> TokenUser {
    TokenUser::service_account("kube-system", "ccm-node-controller", audiences)
}

async fn lookup(client: &GatewayClient) -> Result<(), Error> {
    let nodes = vec![NodeRef {
        name: "nobody".into(),
        provider_id: String::new(),
    }];
    client
        .get_instances(nodes, LookupPurpose::Refresh, false)
        .await
        .map(drop)
}

#[tokio::test]
async fn a_service_account_token_for_the_gateway_gets_its_role_and_nothing_more() {
    let env = start().await;
    let node = env.node_controller();
    lookup(&node).await.unwrap();
    assert!(matches!(
        node.list_load_balancers().await,
        Err(Error::PermissionDenied { .. })
    ));
    assert!(matches!(
        node.list_routes().await,
        Err(Error::PermissionDenied { .. })
    ));
}

#[tokio::test]
async fn tokens_for_another_audience_unknown_accounts_and_forgeries_are_refused() {
    let env = start().await;
    // A token meant for the API server, not for the gateway.
    env.api.register_token("api-token", node_controller(&[]));
    // A valid token of a ServiceAccount the gateway gives no role.
    env.api.register_token(
        "stranger",
        TokenUser::service_account("default", "ccm-node-controller", &[AUDIENCE]),
    );
    for token in ["api-token", "stranger", "forged"] {
        let got = lookup(&env.with_token(token)).await;
        assert!(
            matches!(got, Err(Error::Unauthenticated { .. })),
            "{token}: {got:?}"
        );
    }
}

#[tokio::test]
async fn concurrent_calls_with_one_token_cause_one_review() {
    let env = start().await;
    let node = env.node_controller();
    let calls = (0..50).map(|_| lookup(&node));
    for result in futures::future::join_all(calls).await {
        result.unwrap();
    }
    lookup(&node).await.unwrap();
    assert_eq!(env.api.token_reviews(), 1);
}

/// Waits up to 5 s for the API server to have answered `n` reviews.
async fn until_reviews(env: &Env, n: u64) {
    let start = std::time::Instant::now();
    while env.api.token_reviews() < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{} reviews, waited for {n}",
            env.api.token_reviews()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_caller_in_use_is_reviewed_again_before_its_answer_expires() {
    let env = start_with(Duration::from_secs(4)).await;
    let node = env.node_controller();
    lookup(&node).await.unwrap();
    assert_eq!(env.api.token_reviews(), 1);
    // In the last fifth of the answer's life a call is answered from the
    // cache and starts the review in the background.
    tokio::time::sleep(Duration::from_millis(3400)).await;
    lookup(&node).await.unwrap();
    until_reviews(&env, 2).await;
    // Past the first answer's life no call waits for a review: the new
    // answer serves.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    lookup(&node).await.unwrap();
    assert_eq!(env.api.token_reviews(), 2);
}

#[tokio::test]
async fn a_token_revoked_is_refused_as_soon_as_the_review_ahead_says_so() {
    let env = start_with(Duration::from_secs(4)).await;
    let node = env.node_controller();
    lookup(&node).await.unwrap();
    env.api.revoke_token("node-token");
    tokio::time::sleep(Duration::from_millis(3400)).await;
    // Still the cached answer (as before the review ahead existed)...
    lookup(&node).await.unwrap();
    until_reviews(&env, 2).await;
    // ...but once the API has said no, the token is refused at once, not
    // when the old answer would have expired.
    let got = lookup(&node).await;
    assert!(matches!(got, Err(Error::Unauthenticated { .. })), "{got:?}");
}

#[tokio::test]
async fn a_rotated_token_file_is_read_again_as_soon_as_the_old_token_is_refused() {
    // No review cache, so the revoked token is refused at once.
    let env = start_with(Duration::ZERO).await;
    let file = env.dir.path().join("token");
    env.api
        .register_token("first", node_controller(&[AUDIENCE]));
    std::fs::write(&file, "first\n").unwrap();
    let node = env.client(TokenSource::File(file.clone()));
    lookup(&node).await.unwrap();
    // The kubelet rotates the projected token; the old one stops working
    // long before the client's 30 s refresh would read the file again.
    env.api
        .register_token("second", node_controller(&[AUDIENCE]));
    std::fs::write(&file, "second\n").unwrap();
    env.api.revoke_token("first");
    lookup(&node).await.unwrap();
}

#[tokio::test]
async fn without_the_kubernetes_api_callers_are_asked_to_retry_not_refused() {
    let Env {
        api,
        gateway,
        dir,
        _shutdown,
    } = start().await;
    api.register_token("node-token", node_controller(&[AUDIENCE]));
    drop(api);
    let env_less = GatewayClient::new({
        let mut c = ClientConfig::new(
            format!("http://{}", gateway.grpc_addr),
            "kubernetes",
            TokenSource::Static("node-token".into()),
        );
        c.retry = RetryPolicy::none();
        c
    })
    .unwrap();
    let got = lookup(&env_less).await;
    assert!(matches!(got, Err(Error::Unavailable { .. })), "{got:?}");
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_one_bad_token_makes_a_handful_of_reviews() {
    let env = start().await;
    let bad = env.with_token("not-a-token");
    let calls = (0..500).map(|_| lookup(&bad));
    for result in futures::future::join_all(calls).await {
        assert!(
            matches!(result, Err(Error::Unauthenticated { .. })),
            "{result:?}"
        );
    }
    assert!(
        env.api.token_reviews() <= 2,
        "{} reviews",
        env.api.token_reviews()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_bad_tokens_is_bounded_and_known_callers_go_on() {
    let env = start_with(Duration::from_secs(1)).await;
    let node = env.node_controller();
    lookup(&node).await.unwrap();
    let reviews_before = env.api.token_reviews();
    let started = std::time::Instant::now();
    let flood = {
        let clients: Vec<GatewayClient> = (0..2000)
            .map(|i| env.with_token(&format!("bad-{i}")))
            .collect();
        tokio::spawn(async move {
            let calls = clients.iter().map(lookup);
            futures::future::join_all(calls).await
        })
    };
    // The known caller's token expires from the cache (1 s) during the
    // flood; its re-review does not wait behind the bad ones.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        lookup(&node).await.unwrap();
    }
    let results = flood.await.unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    assert!(results.iter().all(|r| r.is_err()));
    let limited = results
        .iter()
        .filter(|r| matches!(r, Err(Error::Unavailable { .. })))
        .count();
    assert!(
        limited > 0,
        "some unknown tokens were turned away unreviewed"
    );
    let reviews = env.api.token_reviews() - reviews_before;
    // A burst of 40, then 20 a second, plus the known caller's re-reviews.
    let bound = 40.0 + 20.0 * elapsed + 5.0;
    assert!(
        (reviews as f64) <= bound,
        "{reviews} reviews in {elapsed:.1} s (bound {bound:.0})"
    );
}
