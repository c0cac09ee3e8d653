//! The gateway binary over TLS: nothing in clear, nobody who does not
//! trust its CA, a certificate rotated on disk served with no restart and
//! no failed call, and mutual TLS for callers known by their certificate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccm_proto::{ClientConfig, Error, GatewayClient, RetryPolicy, TokenSource};
use ccm_sandbox::gateway::GatewayProcess;
use ccm_sandbox::pki::Pki;

const AUTOSCALER: &str = "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler";

async fn gateway(dir: &std::path::Path, args: &[&str]) -> GatewayProcess {
    let args: Vec<String> = ["--provider", "sim"]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect();
    let gw = GatewayProcess::start(&ccm_testkit::bin_dir(), &dir.join("gateway"), &args, &[])
        .await
        .unwrap();
    assert!(
        gw.wait_ready(Duration::from_secs(30)).await,
        "{}",
        gw.log_text()
    );
    gw
}

fn client(config: ClientConfig) -> GatewayClient {
    let mut config = config;
    config.retry = RetryPolicy::none();
    config.timeout = Duration::from_secs(5);
    GatewayClient::new(config).unwrap()
}

/// Whether `err` is a call the gateway never answered because the TLS
/// handshake failed.
fn handshake_failed(err: &Error) -> bool {
    match err {
        Error::Unavailable { message } | Error::Other { message, .. } => {
            message.contains("transport error")
        }
        _ => false,
    }
}

/// The DER of the leaf certificate the gateway serves now.
async fn served(gw: &GatewayProcess) -> Vec<u8> {
    let tls = gw.tls_connect().await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn leaf_in(file: &std::path::Path) -> Vec<u8> {
    ccm_runtime::tls::certificates(&std::fs::read(file).unwrap(), "test")
        .unwrap()
        .remove(0)
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_client_or_one_that_does_not_trust_the_ca_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &[]).await;
    let token = TokenSource::File(gw.token_file("admin"));
    let trusted = client(gw.client_config("kubernetes", token.clone()));
    assert_eq!(trusted.provider_info().await.unwrap().name, "sim");

    // In clear, to the same port: no answer.
    let port = gw.address.rsplit(':').next().unwrap();
    let plain = client(ClientConfig::new(
        format!("http://127.0.0.1:{port}"),
        "kubernetes",
        token.clone(),
    ));
    let err = plain.provider_info().await.unwrap_err();
    assert!(handshake_failed(&err), "{err:?}");

    // Over TLS, trusting another CA: refused at the handshake.
    let other = Pki::create(&dir.path().join("other"), "another CA").unwrap();
    let mut config = gw.client_config("kubernetes", token);
    config.tls_ca = Some(other.ca_file());
    let err = client(config).provider_info().await.unwrap_err();
    assert!(handshake_failed(&err), "{err:?}");
    assert!(
        err.to_string().contains("UnknownIssuer"),
        "the cause is named: {err}"
    );
    let log = gw.log_text();
    assert!(
        !log.contains("gateway call"),
        "no call reached a service:\n{log}"
    );
    assert!(
        gw.metric("cloud_gateway_tls_handshake_failures_total")
            .await
            >= 1.0,
        "the plaintext attempt counts as a failed handshake"
    );
}

#[tokio::test]
async fn the_binary_serves_in_clear_only_on_loopback_and_when_told_to() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(ccm_testkit::bin_dir().join("cloud-gateway"))
            .args(["--provider", "sim", "--admin-listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&["--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("tls-cert") && stderr.contains("required"),
        "{stderr}"
    );
    let (code, stderr) = run(&["--listen", "0.0.0.0:0", "--insecure-plaintext", "true"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("only on a loopback --listen address"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_rotated_on_disk_is_served_with_no_restart_and_no_failed_call() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &["--tls-reload-interval", "1s"]).await;
    let pid = gw.pid();
    let first = served(&gw).await;
    assert_eq!(first, leaf_in(&gw.serving.cert));

    // Load: callers on long-lived connections, and a new connection every
    // 50 ms, none retrying; every failure counts.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for fresh in [false, false, false, true] {
        let config = gw.client_config("kubernetes", TokenSource::File(gw.token_file("node")));
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        load.push(tokio::spawn(async move {
            let mut long_lived = client(config.clone());
            while !stop.load(Ordering::Relaxed) {
                if fresh {
                    long_lived = client(config.clone());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                match long_lived.provider_info().await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("failed call: {e}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A new key and certificate from the same CA, into the same files (as
    // the kubelet updates a Secret's).
    let rotated_at = Instant::now();
    let second = gw
        .pki
        .serving("gateway", &["localhost", "127.0.0.1"])
        .unwrap();
    let second = leaf_in(&second.cert);
    assert_ne!(first, second);
    while served(&gw).await != second {
        assert!(
            rotated_at.elapsed() < Duration::from_secs(30),
            "the new certificate is not served 30 s after it was written:\n{}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = rotated_at.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("rotated certificate served after {took:?}; {ok} calls, {failed} failed");
    assert_eq!(failed, 0, "{ok} calls succeeded");
    assert!(ok > 50, "{ok} calls under load");
    assert_eq!(gw.pid(), pid, "no restart");
    assert!(gw.log_text().contains("TLS certificate reloaded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_client_certificate_needs_no_token_and_others_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Client certificates come from a CA of their own, as the chart and
    // the sandbox make one: the gateway's serving CA is not trusted for
    // clients.
    let clients = Pki::create(&dir.path().join("clients"), "client CA").unwrap();
    let roles = format!("{AUTOSCALER}=node,CN=ops-console=admin");
    let gw = gateway(
        dir.path(),
        &[
            "--tls-client-ca",
            clients.ca_file().to_str().unwrap(),
            "--client-cert-roles",
            &roles,
        ],
    )
    .await;
    let with = |issued: ccm_sandbox::pki::Issued| {
        let mut config = gw.client_config("kubernetes", TokenSource::None);
        config.client_cert = Some((issued.cert, issued.key));
        client(config)
    };
    let with_cert = |file: &str, uri: Option<&str>, cn: &str, expired: bool| {
        with(clients.client(file, uri, cn, expired).unwrap())
    };

    // Known by its SPIFFE ID: the node role, no token.
    let autoscaler = with_cert("autoscaler", Some(AUTOSCALER), "cluster-autoscaler", false);
    assert_eq!(autoscaler.provider_info().await.unwrap().name, "sim");
    autoscaler
        .get_instances(
            vec![ccm_proto::v1::NodeRef {
                name: "nobody".into(),
                provider_id: String::new(),
            }],
            ccm_proto::v1::LookupPurpose::Refresh,
            false,
        )
        .await
        .unwrap();
    let err = autoscaler.list_routes().await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    // Known by its common name, having no URI: admin.
    let ops = with_cert("ops", None, "ops-console", false);
    assert!(ops.list_routes().await.is_ok());

    // A certificate the CA signed, mapped to nothing: refused, and told why.
    let stranger = with_cert(
        "stranger",
        Some("spiffe://cluster.local/ns/default/sa/web"),
        "web",
        false,
    );
    let err = stranger.provider_info().await.unwrap_err();
    assert!(
        matches!(&err, Error::Unauthenticated { message } if message.contains("mapped to no role")),
        "{err:?}"
    );
    // A URI of its own makes a mapped common name mean nothing (SPIRE
    // chooses its CNs), and a certificate of two URIs is no one, even
    // with the mapped one first.
    let spire = with_cert(
        "spire",
        Some("spiffe://cluster.local/ns/default/sa/web"),
        "ops-console",
        false,
    );
    let err = spire.list_routes().await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
    let two = with(
        clients
            .client_naming(
                "two",
                &[AUTOSCALER, "spiffe://cluster.local/ns/default/sa/web"],
                None,
                false,
            )
            .unwrap(),
    );
    let err = two.provider_info().await.unwrap_err();
    assert!(
        matches!(&err, Error::PermissionDenied { message, .. } if message.contains("2 URI SANs")),
        "{err:?}"
    );
    // Expired: refused at the handshake.
    let expired = with_cert("expired", Some(AUTOSCALER), "cluster-autoscaler", true);
    let err = expired.provider_info().await.unwrap_err();
    assert!(handshake_failed(&err), "{err:?}");
    // The identity from the CA that issues the gateway's own serving
    // certificate (whoever may ask it for a certificate), or from any
    // other: no handshake.
    let other = Pki::create(&dir.path().join("other"), "another CA").unwrap();
    for ca in [&gw.pki, &other] {
        let forged = with(
            ca.client("forged", Some(AUTOSCALER), "cluster-autoscaler", false)
                .unwrap(),
        );
        let err = forged.provider_info().await.unwrap_err();
        assert!(handshake_failed(&err), "{err:?}");
        let by_name = with(ca.client("forged-cn", None, "ops-console", false).unwrap());
        let err = by_name.provider_info().await.unwrap_err();
        assert!(handshake_failed(&err), "{err:?}");
    }

    // Tokens work as before, beside certificates.
    let node = gw.client("node", "kubernetes");
    assert!(node.provider_info().await.is_ok());
}

/// The README's way to call the sandbox's gateway with no code of ours:
/// Python's gRPC over TLS, trusting the CA file, learning the API by
/// reflection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_none_of_our_code_calls_over_tls_trusting_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &[]).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/reflect_client.py");
    let authority = gw.address.trim_start_matches("https://").to_owned();
    let (ca, token) = (gw.pki.ca_file(), gw.token_file("admin"));
    let python = move |args: &[&str]| {
        let out = std::process::Command::new("python3")
            .arg(&script)
            .arg(&authority)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ca, token) = (
        ca.to_str().unwrap().to_owned(),
        token.to_str().unwrap().to_owned(),
    );
    let (listed, called, clear) = tokio::task::spawn_blocking(move || {
        (
            python(&["list", "--ca-file", &ca]),
            python(&[
                "call",
                "cloudgateway.v1.Provider/GetProviderInfo",
                "{}",
                "--token-file",
                &token,
                "--ca-file",
                &ca,
            ]),
            python(&["health"]),
        )
    })
    .await
    .unwrap();
    assert_eq!(listed.0, Some(0), "{listed:?}");
    assert!(listed.1.contains("cloudgateway.v1.Instances"), "{listed:?}");
    assert_eq!(called.0, Some(0), "{called:?}");
    assert!(called.1.contains("\"sim\""), "{called:?}");
    // Without the CA file it speaks in clear, and gets nothing.
    assert_ne!(clear.0, Some(0), "{clear:?}");
}
