//! Leader election against the test API server: one leader among
//! candidates, takeover within the lease duration when the leader stops
//! renewing, a leader that cannot renew stops at its deadline and leads
//! again, in the same process, once it reaches the API server, and a clean
//! shutdown hands the lease over at once.

use std::time::{Duration, Instant};

use ccm_runtime::common_args::LeaseSettings;
use ccm_runtime::leader::{self, Leadership};
use kube_test_apiserver::ApiServer;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

fn settings() -> LeaseSettings {
    LeaseSettings {
        enabled: true,
        name: "test-controller".into(),
        namespace: "kube-system".into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
    }
}

async fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// A TCP proxy to the API server that can be cut, as a network partition,
/// and restored.
struct Proxy {
    addr: std::net::SocketAddr,
    target: std::net::SocketAddr,
    /// The API server's CA, which the proxy's clients verify it with.
    pki: kube_test_apiserver::ClusterPki,
    tasks: JoinSet<()>,
}

impl Proxy {
    async fn to(server: &ApiServer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut proxy = Self {
            addr: listener.local_addr().unwrap(),
            target: server.addr(),
            pki: server.pki().clone(),
            tasks: JoinSet::new(),
        };
        proxy.forward(listener);
        proxy
    }

    fn forward(&mut self, listener: TcpListener) {
        let target = self.target;
        self.tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
    }

    async fn client(&self) -> kube::Client {
        let url = format!("https://{}", self.addr);
        let config = kube_test_apiserver::client_config(&url, &self.pki, None);
        kube::Client::try_from(config).unwrap()
    }

    /// Drops every connection and refuses new ones.
    fn cut(&mut self) {
        self.tasks.abort_all();
    }

    /// Forwards again, on the same address.
    async fn restore(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.forward(listener);
    }
}

fn candidate(client: kube::Client, name: &str) -> (Leadership, CancellationToken) {
    let shutdown = CancellationToken::new();
    let leadership = leader::start(client, &settings(), name.into(), shutdown.clone());
    (leadership, shutdown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_two_candidates_leads() {
    let server = ApiServer::start().await.unwrap();
    let (a, _stop_a) = candidate(server.client().await.unwrap(), "a");
    let (b, _stop_b) = candidate(server.client().await.unwrap(), "b");
    wait_for("a leader", Duration::from_secs(10), || {
        a.is_leader() || b.is_leader()
    })
    .await;
    // Over several renewals, never both and never neither.
    for _ in 0..60 {
        assert!(
            a.is_leader() != b.is_leader(),
            "a={} b={}",
            a.is_leader(),
            b.is_leader()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leader_stops_renewing_it_stops_and_the_standby_takes_over() {
    let server = ApiServer::start().await.unwrap();
    let mut proxy = Proxy::to(&server).await;
    let (a, _stop_a) = candidate(proxy.client().await, "a");
    let term = tokio::time::timeout(Duration::from_secs(10), a.acquired())
        .await
        .unwrap()
        .expect("a leads");
    let (b, _stop_b) = candidate(server.client().await.unwrap(), "b");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(a.is_leader() && !b.is_leader());

    // The leader is cut off from the API server.
    let cut_at = Instant::now();
    proxy.cut();
    let lost = tokio::time::timeout(Duration::from_secs(10), a.lost(term)).await;
    assert!(lost.is_ok(), "the cut-off leader noticed");
    assert!(
        !a.is_leader(),
        "a leader past its renew deadline stops writing"
    );
    assert!(
        !b.is_leader(),
        "the old leader stopped before anyone else could lead"
    );
    let stopped = cut_at.elapsed();
    assert!(
        stopped <= settings().renew_deadline + Duration::from_millis(600),
        "stopped after {stopped:?}"
    );

    wait_for("b takes over", Duration::from_secs(10), || b.is_leader()).await;
    let takeover = cut_at.elapsed();
    // The lease was last renewed before the cut; b needs it expired, plus
    // one retry period and the settle check to notice.
    let limit = settings().lease_duration + 2 * settings().retry_period + Duration::from_secs(1);
    assert!(
        takeover <= limit,
        "took over after {takeover:?}, limit {limit:?}"
    );

    // Back in touch, the old leader stands by in the same process: the
    // new one keeps the lease.
    proxy.restore().await;
    tokio::time::sleep(3 * settings().retry_period).await;
    assert!(b.is_leader() && !a.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_leads_again_when_it_reaches_the_api_server() {
    let server = ApiServer::start().await.unwrap();
    let mut proxy = Proxy::to(&server).await;
    let (a, _stop_a) = candidate(proxy.client().await, "a");
    let first = tokio::time::timeout(Duration::from_secs(10), a.acquired())
        .await
        .unwrap()
        .expect("a leads");
    assert_eq!((first.number, first.continues), (1, false));

    // Cut off past its lease: it stops, and nobody else leads meanwhile.
    proxy.cut();
    tokio::time::timeout(Duration::from_secs(10), a.lost(first))
        .await
        .unwrap();
    tokio::time::sleep(settings().lease_duration).await;
    assert!(!a.is_leader());

    // Back in touch, the same process leads again, and knows no other
    // replica led in between.
    proxy.restore().await;
    let second = tokio::time::timeout(Duration::from_secs(10), a.acquired())
        .await
        .unwrap()
        .expect("a leads again");
    assert_eq!((second.number, second.continues), (2, true));

    // Cut off again; this time another replica leads meanwhile, and hands
    // the lease back when it stops.
    proxy.cut();
    tokio::time::timeout(Duration::from_secs(10), a.lost(second))
        .await
        .unwrap();
    let (b, stop_b) = candidate(server.client().await.unwrap(), "b");
    wait_for("b takes over", Duration::from_secs(10), || b.is_leader()).await;
    proxy.restore().await;
    stop_b.cancel();
    let third = tokio::time::timeout(Duration::from_secs(10), a.acquired())
        .await
        .unwrap()
        .expect("a leads once b has stopped");
    assert_eq!(
        (third.number, third.continues),
        (3, false),
        "another replica led in between: what a remembers may be stale"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_shuts_down_hands_the_lease_over_at_once() {
    let server = ApiServer::start().await.unwrap();
    let (a, stop_a) = candidate(server.client().await.unwrap(), "a");
    wait_for("a leads", Duration::from_secs(10), || a.is_leader()).await;
    let (b, _stop_b) = candidate(server.client().await.unwrap(), "b");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let stopped_at = Instant::now();
    stop_a.cancel();
    wait_for("b takes over", Duration::from_secs(10), || b.is_leader()).await;
    assert!(!a.is_leader());
    let handover = stopped_at.elapsed();
    assert!(
        handover < settings().lease_duration,
        "handed over after {handover:?}, before the lease could expire"
    );
}

#[tokio::test]
async fn without_leader_election_a_replica_always_leads() {
    let always = Leadership::always();
    assert!(always.is_leader());
    assert!(always.acquired().await.is_some());
}
