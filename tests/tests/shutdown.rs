//! SIGTERM in every phase of every binary: waiting for the gateway, waiting
//! for the API server, standby, leading, serving calls. Each process exits
//! 0 within a few seconds, and a leader hands its lease over so a standby
//! leads before the lease would have expired.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ccm_sandbox::admin::admin_get;
use ccm_sandbox::gateway::GatewayProcess;
use ccm_testkit::env::TestEnv;
use cloud_gateway::identity::Role;
use k8s_openapi::api::coordination::v1::Lease;
use tokio::process::{Child, Command};

/// How long a process may take to exit after SIGTERM.
const EXIT_WITHIN: Duration = Duration::from_secs(4);
const CONTROLLERS: [(&str, Role); 3] = [
    ("node-controller", Role::Node),
    ("service-controller", Role::Service),
    ("route-controller", Role::Route),
];

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], ccm_sandbox::ports::free_port().unwrap()))
}

struct Proc {
    name: String,
    child: Child,
    admin: SocketAddr,
    log: PathBuf,
}

fn spawn(dir: &Path, name: &str, binary: &str, args: &[String]) -> Proc {
    let admin = free_addr();
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(ccm_testkit::bin_dir().join(binary))
        .args(args)
        .arg("--admin-listen")
        .arg(admin.to_string())
        .env("POD_NAME", name)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    Proc {
        name: name.into(),
        child,
        admin,
        log,
    }
}

impl Proc {
    async fn alive(&self) {
        let start = Instant::now();
        while admin_get(self.admin, "/livez", None).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{} never served /livez:\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then the exit status must be 0 within [`EXIT_WITHIN`].
    async fn terminate(mut self, phase: &str) -> Duration {
        let pid = self.child.id().unwrap();
        let started = Instant::now();
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        let status = tokio::time::timeout(EXIT_WITHIN, self.child.wait()).await;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let status = status
            .unwrap_or_else(|_| {
                panic!(
                    "{} ({phase}) still running after SIGTERM:\n{log}",
                    self.name
                )
            })
            .unwrap();
        assert!(
            status.success(),
            "{} ({phase}) exited with {status}:\n{log}",
            self.name
        );
        started.elapsed()
    }
}

fn controller_args(kubeconfig: &Path, gateway: &str, token: &Path, binary: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--gateway-address",
        gateway,
        "--gateway-token-file",
        token.to_str().unwrap(),
        "--leader-elect-lease-duration",
        "6s",
        "--leader-elect-renew-deadline",
        "4s",
        "--leader-elect-retry-period",
        "1s",
    ]
    .map(String::from)
    .to_vec();
    if binary == "route-controller" {
        args.extend(["--cluster-cidr".into(), "10.244.0.0/16".into()]);
    }
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_waiting_for_the_gateway_or_the_api_server_exit_on_sigterm() {
    let env = TestEnv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("http://{}", free_addr());
    let unreachable_api = dir.path().join("kubeconfig-nowhere");
    std::fs::write(
        &unreachable_api,
        kube_test_apiserver::kubeconfig(
            &format!("https://{}", free_addr()),
            &env.api.pki().ca_pem,
            "nobody",
            "token",
        ),
    )
    .unwrap();
    for (binary, role) in CONTROLLERS {
        let token = env.token_file(role);
        let phases = [
            ("waiting for the gateway", env.kubeconfig.clone()),
            ("waiting for the API server", unreachable_api.clone()),
        ];
        for (phase, kubeconfig) in phases {
            let args = controller_args(&kubeconfig, &nowhere, &token, binary);
            let p = spawn(dir.path(), binary, binary, &args);
            p.alive().await;
            // Let it get into its retry loops.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let took = p.terminate(phase).await;
            eprintln!("{binary} {phase}: exited {took:?} after SIGTERM");
        }
    }
}

async fn holder(client: &kube::Client, lease: &str) -> Option<String> {
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "kube-system");
    leases
        .get_opt(lease)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_hands_over_at_once_and_standbys_and_leaders_exit_on_sigterm() {
    let env = TestEnv::start().await;
    let client = env.client().await;
    let dir = tempfile::tempdir().unwrap();
    for (binary, role) in CONTROLLERS {
        let lease = format!("ccm-{binary}");
        let args = controller_args(
            &env.kubeconfig,
            &env.gateway_url(),
            &env.token_file(role),
            binary,
        );
        let a = spawn(dir.path(), &format!("{binary}-a"), binary, &args);
        a.alive().await;
        let start = Instant::now();
        let first = loop {
            if let Some(h) = holder(&client, &lease).await {
                break h;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{binary}: nobody leads"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(first.starts_with(&format!("{binary}-a_")), "{first}");
        let b = spawn(dir.path(), &format!("{binary}-b"), binary, &args);
        b.alive().await;
        let c = spawn(dir.path(), &format!("{binary}-c"), binary, &args);
        c.alive().await;
        // A standby goes at once.
        c.terminate("standby").await;
        // The leader releases its lease on the way out; the standby takes
        // it well before the 6 s lease would have run out.
        let released = Instant::now();
        a.terminate("leading").await;
        let next = loop {
            if let Some(h) = holder(&client, &lease).await.filter(|h| *h != first) {
                break h;
            }
            assert!(
                released.elapsed() < Duration::from_secs(5),
                "{binary}: no new leader within 5 s of the old one's SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let handover = released.elapsed();
        eprintln!("{binary}: {next} leads {handover:?} after the leader's SIGTERM");
        assert!(next.starts_with(&format!("{binary}-b_")), "{next}");
        assert!(handover < Duration::from_secs(5), "{handover:?}");
        b.terminate("leading after takeover").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_the_api_server_and_the_sandbox_exit_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // The gateway, serving a client with a call it never finishes sending.
    let gw = GatewayProcess::start(
        &ccm_testkit::bin_dir(),
        &dir.path().join("gateway"),
        &["--provider".into(), "sim".into()],
        &[],
    )
    .await
    .unwrap();
    assert!(gw.wait_ready(Duration::from_secs(20)).await);
    let client = gw.client("admin", "kubernetes");
    client.provider_info().await.unwrap();
    let tls = gw.tls_connect().await.unwrap();
    let (send, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(connection);
    let mut send = send.ready().await.unwrap();
    let request = http::Request::post(format!("{}/grpc.health.v1.Health/Check", gw.address))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (_response, mut body) = send.send_request(request, false).unwrap();
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 10, 1]), false)
        .unwrap();
    let started = Instant::now();
    let (status, log) = gw.terminate(Duration::from_secs(8)).await;
    let took = started.elapsed();
    eprintln!("cloud-gateway with a call in flight: exited {took:?} after SIGTERM");
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(log.contains("cloud-gateway stopped"), "{log}");

    // The test API server.
    let api_addr = free_addr();
    let mut api = Command::new(ccm_testkit::bin_dir().join("kube-test-apiserver"))
        .args(["--listen", &api_addr.to_string()])
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while tokio::net::TcpStream::connect(api_addr).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::process::Command::new("kill")
        .args(["-TERM", &api.id().unwrap().to_string()])
        .status()
        .unwrap();
    let status = tokio::time::timeout(EXIT_WITHIN, api.wait())
        .await
        .expect("kube-test-apiserver exits")
        .unwrap();
    assert!(status.success(), "{status}");

    // The sandbox, with everything it started.
    let mut sandbox = Command::new(ccm_testkit::bin_dir().join("sandbox"))
        .args([
            "--nodes",
            "1",
            "--services",
            "0",
            "--replicas",
            "1",
            "--state-dir",
        ])
        .arg(dir.path().join("sandbox"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let endpoints = dir.path().join("sandbox/endpoints.json");
    let start = Instant::now();
    while !endpoints.is_file() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "sandbox never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &sandbox.id().unwrap().to_string()])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), sandbox.wait())
        .await
        .expect("the sandbox exits")
        .unwrap();
    eprintln!("sandbox: exited {:?} after SIGTERM", started.elapsed());
    assert!(status.success(), "{status}");
}
