//! `gateway-conformance` against real gateways: our gateway on the sim and
//! the toy gateway in Python (a second implementation sharing no code with
//! ours) pass every check; one whose tokens file gives the route
//! controller's token the admin role breaks the role rule, and the suite
//! says so in one line and exits non-zero. (The AWS run is in
//! `aws_provider.rs`, beside the emulator.)

use std::path::Path;
use std::process::Output;

use ccm_sandbox::gateway::GatewayProcess;

async fn conformance(address: &str, tokens: &Path, args: &[&str]) -> Output {
    gateway_conformance::run_binary(
        &ccm_testkit::bin_dir(),
        address,
        tokens,
        "conformance",
        args,
    )
    .await
    .unwrap()
}

/// The node group checks, skipped on a gateway that does not serve
/// Cluster Autoscaler (the Python one).
const NODE_GROUP_CHECKS: usize = 5;
/// The volume checks, skipped on a gateway whose provider has no volumes
/// (the Python one's).
const VOLUME_CHECKS: usize = 3;

/// Asserts the run passed with every check run, in order, and only the
/// one with nothing to try on a provider offering everything skipped
/// (and the node group and volume checks where the Python gateway offers
/// neither).
fn assert_passes_everything(out: &Output, node_groups: bool) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|name| name.contains('.'))
        .collect();
    assert_eq!(names, gateway_conformance::CHECKS, "{stdout}");
    let skipped = if node_groups {
        1
    } else {
        1 + NODE_GROUP_CHECKS + VOLUME_CHECKS
    };
    assert!(
        stdout.contains(&format!(" 0 failed, {skipped} skipped")),
        "{stdout}"
    );
    assert!(stdout.contains("SKIP provider.unimplemented"), "{stdout}");
    assert_eq!(
        stdout.matches("SKIP node-groups.").count(),
        if node_groups { 0 } else { NODE_GROUP_CHECKS },
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("SKIP volumes.").count(),
        if node_groups { 0 } else { VOLUME_CHECKS },
        "{stdout}"
    );
}

async fn sim_gateway(dir: &Path, args: &[&str]) -> GatewayProcess {
    GatewayProcess::on_the_sim(&ccm_testkit::bin_dir(), dir, args)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_sim_gateway_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    // The cluster the suite runs as: the one whose node groups the gateway
    // serves the autoscaler.
    let gateway = sim_gateway(dir.path(), &["--cluster-name", "conformance"]).await;
    // No --node: the suite makes its instances (and node groups) through
    // the admin hook.
    let ca = gateway.pki.ca_file();
    let out = conformance(
        &gateway.address,
        &dir.path().join("state/tokens"),
        &[
            "--tls-ca",
            ca.to_str().unwrap(),
            "--invalid-annotation",
            "sim.cloudgateway.io/algorithm=fastest",
        ],
    )
    .await;
    assert_passes_everything(&out, true);
}

async fn toy_conformance(offer: &str) -> (Output, String) {
    let dir = tempfile::tempdir().unwrap();
    let toy = ccm_sandbox::toy::ToyGateway::start(dir.path(), &["--offer", offer])
        .await
        .unwrap();
    let out = conformance(
        &toy.address,
        &toy.tokens,
        &[
            "--tls-ca",
            toy.ca_file.to_str().unwrap(),
            "--invalid-annotation",
            "toy.cloudgateway.io/idle-timeout=forever",
        ],
    )
    .await;
    (out, toy.log_text())
}

#[tokio::test]
async fn the_python_gateway_passes_every_check() {
    let (out, log) = toy_conformance("instances,load_balancers,routes").await;
    assert!(out.status.success(), "{log}");
    assert_passes_everything(&out, false);
}

#[tokio::test]
async fn a_gateway_without_routes_passes_and_answers_unimplemented_for_them() {
    let (out, log) = toy_conformance("instances,load_balancers").await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{log}");
    assert!(stdout.contains("PASS provider.unimplemented"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            " 0 failed, {} skipped",
            3 + NODE_GROUP_CHECKS + VOLUME_CHECKS
        )),
        "{stdout}"
    );
    for check in [
        "routes.delete-missing",
        "routes.create-idempotent",
        "routes.blackhole",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("SKIP {check} "))
                    && l.ends_with("the provider has no routes capability")),
            "{stdout}"
        );
    }
}

#[tokio::test]
async fn a_gateway_that_breaks_a_rule_fails_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    // The route controller's token carries the admin role: it may call
    // LoadBalancers, which the contract forbids the route role.
    for (role, token) in [
        ("node", "conformance-node-token"),
        ("service", "conformance-service-token"),
        ("route", "conformance-route-token"),
    ] {
        std::fs::write(tokens.join(format!("{role}.token")), token).unwrap();
    }
    let file = dir.path().join("tokens.yaml");
    std::fs::write(
        &file,
        "tokens:\n  - {token: conformance-node-token, role: node}\n  - {token: conformance-service-token, role: service}\n  - {token: conformance-route-token, role: admin}\n",
    )
    .unwrap();
    let gateway = sim_gateway(
        &dir.path().join("gateway"),
        &["--tokens-file", file.to_str().unwrap()],
    )
    .await;
    let ca = gateway.pki.ca_file();
    let out = conformance(
        &gateway.address,
        &tokens,
        &["--tls-ca", ca.to_str().unwrap()],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failed.len(), 1, "{stdout}");
    assert!(failed[0].starts_with("FAIL auth.wrong-role"), "{stdout}");
    assert!(failed[0].contains("PERMISSION_DENIED"), "{stdout}");
    assert!(stdout.contains("SKIP routes.create-idempotent"), "{stdout}");
    // No token for the volume role was given: its checks skip.
    assert!(stdout.contains("SKIP volumes.one-device-owner"), "{stdout}");
}

#[test]
fn the_contract_names_every_check_beside_its_rule() {
    let contract = include_str!("../../proto/CONTRACT.md");
    for check in gateway_conformance::CHECKS {
        assert!(
            contract.contains(&format!("[{check}]")),
            "{check} has no rule in proto/CONTRACT.md"
        );
    }
}
