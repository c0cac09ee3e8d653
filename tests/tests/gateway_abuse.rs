//! The gateway binary under hostile clients, over raw HTTP/2 on loopback:
//! what one client can make it hold stays bounded, and legitimate callers
//! keep being served while it happens. Each scenario is bounded in count
//! and time; the figures it prints go into BENCHMARKS.md (abuse rows).

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ccm_proto::v1::{LookupPurpose, NodeRef};
use ccm_sandbox::gateway::GatewayProcess;
use gateway_conformance::grpc_frame;
use http::Request;
use kube_test_apiserver::ApiServer;
use prost::Message;

/// Resident memory the gateway must stay under, during and after.
const BOUND: u64 = 128 * 1024 * 1024;
const MIB: f64 = 1024.0 * 1024.0;

/// A gateway on the sim with `args`.
async fn gateway(dir: &Path, args: &[String]) -> GatewayProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    GatewayProcess::on_the_sim(&ccm_testkit::bin_dir(), dir, &args)
        .await
        .unwrap()
}

/// One raw HTTP/2 connection; its driver runs in the background.
async fn connect(gw: &GatewayProcess) -> h2::client::SendRequest<Bytes> {
    let tls = gw.tls_connect().await.unwrap();
    let (send, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

fn request(address: &str, path: &str, token: Option<&str>) -> Request<()> {
    let mut builder = Request::post(format!("{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder.body(()).unwrap()
}

type Opened = (h2::client::ResponseFuture, h2::SendStream<Bytes>);

/// Opens one more stream on the connection of `send` for `request`, once
/// the server's stream limit lets it (`None` when it does not within
/// `wait`, or the connection is gone).
async fn open(
    send: &h2::client::SendRequest<Bytes>,
    request: Request<()>,
    wait: Duration,
) -> Option<Opened> {
    let mut ready = tokio::time::timeout(wait, send.clone().ready())
        .await
        .ok()?
        .ok()?;
    ready.send_request(request, false).ok()
}

/// Samples the gateway's resident memory until `until`; returns the peak.
async fn peak_rss(gw: &GatewayProcess, until: Instant) -> u64 {
    let mut peak = 0;
    while Instant::now() < until {
        peak = peak.max(gw.rss().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    peak
}

/// Legitimate calls with a real client while the abuse goes on; returns
/// how many failed.
async fn legitimate(gw: &GatewayProcess, role: &str, until: Instant) -> (u32, u32) {
    let client = gw.client(role, "kubernetes");
    let (mut ok, mut failed) = (0, 0);
    while Instant::now() < until {
        match client.provider_info().await {
            Ok(_) => ok += 1,
            Err(e) => {
                eprintln!("legitimate call failed: {e}");
                failed += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (ok, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_streams_with_huge_or_unfinished_bodies_hold_little_memory() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &[]).await;
    let before = gw.rss().unwrap();
    let mut streams = Vec::new();
    let mut senders = Vec::new();
    // 600 health checks over three connections that say 4 MB are coming
    // and send most of it, and 200 that announce a small message and
    // never finish it.
    for _ in 0..3 {
        let send = connect(&gw).await;
        for _ in 0..200 {
            let check = request(&gw.address, "/grpc.health.v1.Health/Check", None);
            let Some((response, mut body)) = open(&send, check, Duration::from_secs(2)).await
            else {
                break;
            };
            let mut prefix = vec![0u8];
            prefix.extend_from_slice(&4_000_000u32.to_be_bytes());
            let _ = body.send_data(prefix.into(), false);
            let _ = body.send_data(Bytes::from(vec![b'x'; 3_900_000]), false);
            streams.push(response);
            senders.push(body);
        }
    }
    let send = connect(&gw).await;
    for _ in 0..200 {
        let check = request(&gw.address, "/grpc.health.v1.Health/Check", None);
        let Some((response, mut body)) = open(&send, check, Duration::from_secs(2)).await else {
            break;
        };
        let mut partial = vec![0u8];
        partial.extend_from_slice(&500u32.to_be_bytes());
        partial.extend_from_slice(&[0; 100]);
        let _ = body.send_data(partial.into(), false);
        streams.push(response);
        senders.push(body);
    }
    // An oversized message is refused as gRPC prescribes, unread.
    let first = tokio::time::timeout(Duration::from_secs(10), streams.remove(0))
        .await
        .expect("the oversized call is answered")
        .unwrap();
    assert_eq!(
        first
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()),
        Some("8"),
        "RESOURCE_EXHAUSTED: {:?}",
        first.headers()
    );
    let until = Instant::now() + Duration::from_secs(4);
    let (peak, (ok, failed)) = tokio::join!(peak_rss(&gw, until), legitimate(&gw, "admin", until));
    drop(senders);
    drop(streams);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = gw.rss().unwrap();
    let refused = gw.metric("cloud_gateway_requests_refused_total").await;
    eprintln!(
        "abuse (no token, 800 streams of big or unfinished bodies): RSS before {:.1} MiB, peak {:.1} MiB, after {:.1} MiB; {refused} refused; legitimate calls {ok} ok, {failed} failed",
        before as f64 / MIB,
        peak as f64 / MIB,
        after as f64 / MIB
    );
    assert!(peak < BOUND, "peak {} MiB", peak as f64 / MIB);
    assert!(after < BOUND, "after {} MiB", after as f64 / MIB);
    assert!(refused > 0.0, "the oversized or excess calls were refused");
    assert_eq!(failed, 0, "legitimate calls kept being served");
    assert!(ok > 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_lookups_whose_answers_are_never_read_hold_little_memory() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &[]).await;
    let token = std::fs::read_to_string(dir.path().join("state/tokens/node.token")).unwrap();
    let token = token.trim();
    // A lookup of 1000 nodes, each answered "not found" with its 200-byte
    // name echoed: about 250 KB per answer, from the cache after the first.
    let nodes: Vec<NodeRef> = (0..1000)
        .map(|i| NodeRef {
            name: format!("{i:0>63}.{}.{}", "a".repeat(63), "b".repeat(63)),
            provider_id: String::new(),
        })
        .collect();
    gw.client("node", "kubernetes")
        .get_instances(nodes.clone(), LookupPurpose::Refresh, false)
        .await
        .unwrap();
    let message = ccm_proto::v1::GetInstancesRequest {
        cluster_name: "kubernetes".into(),
        nodes,
        fresh: false,
        purpose: LookupPurpose::Refresh as i32,
        ..Default::default()
    }
    .encode_to_vec();
    let body = grpc_frame(&message);
    let before = gw.rss().unwrap();
    let mut held = Vec::new();
    let started = Instant::now();
    // 6000 calls over 30 connections; no answer is ever read.
    for _ in 0..30 {
        let send = connect(&gw).await;
        for _ in 0..200 {
            let lookup = request(
                &gw.address,
                "/cloudgateway.v1.Instances/GetInstances",
                Some(token),
            );
            let Some((response, mut stream)) =
                open(&send, lookup, Duration::from_millis(500)).await
            else {
                break;
            };
            let _ = stream.send_data(body.clone(), true);
            held.push((response, stream));
        }
    }
    let sent = held.len();
    let until = Instant::now() + Duration::from_secs(4);
    let (peak, (ok, failed)) = tokio::join!(peak_rss(&gw, until), legitimate(&gw, "route", until));
    drop(held);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = gw.rss().unwrap();
    eprintln!(
        "abuse (node token, {sent} unread 1000-node lookups in {:.1} s): RSS before {:.1} MiB, peak {:.1} MiB, after {:.1} MiB; legitimate calls {ok} ok, {failed} failed",
        started.elapsed().as_secs_f64(),
        before as f64 / MIB,
        peak as f64 / MIB,
        after as f64 / MIB
    );
    assert!(peak < BOUND, "peak {} MiB", peak as f64 / MIB);
    assert!(after < BOUND, "after {} MiB", after as f64 / MIB);
    assert_eq!(failed, 0, "another caller kept being served");
    // Some forty at most, one every 100 ms; a loaded 2-core machine has
    // served ten.
    assert!(ok >= 5, "another caller was served {ok} times in 4 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_tokens_makes_few_reviews_and_known_callers_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::start().await.unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        "tokens:\n  - {token: route-token-0123456789, role: route, name: route}\n",
    )
    .unwrap();
    let args: Vec<String> = [
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--service-account-roles",
        "kube-system/ccm-node-controller=node",
        "--tokens-file",
        tokens.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let gw = gateway(dir.path(), &args).await;
    let route = {
        let mut config = gw.client_config(
            "kubernetes",
            ccm_proto::TokenSource::Static("route-token-0123456789".into()),
        );
        config.retry = ccm_proto::RetryPolicy::none();
        ccm_proto::GatewayClient::new(config).unwrap()
    };
    let started = Instant::now();
    // The same bad token 2000 times, then 2000 different ones, over ten
    // connections.
    let mut calls = Vec::new();
    for round in 0..2 {
        for c in 0..10 {
            let send = connect(&gw).await;
            for i in 0..200 {
                let token = if round == 0 {
                    "the-same-bad-token".to_owned()
                } else {
                    format!("bad-token-{c}-{i}")
                };
                let info = request(
                    &gw.address,
                    "/cloudgateway.v1.Provider/GetProviderInfo",
                    Some(&token),
                );
                let Some((response, mut stream)) =
                    open(&send, info, Duration::from_millis(500)).await
                else {
                    break;
                };
                let _ = stream.send_data(grpc_frame(&[]), true);
                calls.push(tokio::spawn(async move {
                    let response = response.await.ok()?;
                    let status = response
                        .headers()
                        .get("grpc-status")?
                        .to_str()
                        .ok()?
                        .to_owned();
                    Some(status)
                }));
            }
        }
        if round == 0 {
            for call in calls.drain(..) {
                let _ = call.await;
            }
            eprintln!("one bad token 2000 times: {} reviews", api.token_reviews());
            assert!(api.token_reviews() <= 2, "{} reviews", api.token_reviews());
        }
        route.provider_info().await.unwrap();
    }
    let mut statuses = std::collections::BTreeMap::new();
    for call in calls {
        if let Ok(Some(status)) = call.await {
            *statuses.entry(status).or_insert(0) += 1;
        }
    }
    route.provider_info().await.unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let reviews = api.token_reviews();
    let refusal_lines = gw
        .log_text()
        .matches("ServiceAccount token refused")
        .count();
    eprintln!(
        "2000 distinct bad tokens: {reviews} reviews in {elapsed:.1} s, statuses {statuses:?}, {refusal_lines} log lines"
    );
    // A burst of 40 and 20 a second, plus the first round's one.
    assert!(
        (reviews as f64) <= 41.0 + 20.0 * elapsed,
        "{reviews} reviews in {elapsed:.1} s"
    );
    assert!(
        (refusal_lines as f64) <= 2.0 + elapsed,
        "{refusal_lines} refusal lines in {elapsed:.1} s"
    );
}
