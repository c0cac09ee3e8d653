//! `gateway-conformance`: checks a `cloudgateway.v1` gateway, ours or a
//! vendor's, against the contract. One line per check (PASS, FAIL with
//! what it saw, SKIP with why), then a summary; exit 0 only when no check
//! failed.
//!
//!     gateway-conformance --address http://127.0.0.1:7443 \
//!         --tokens-dir /var/lib/ccm/tokens --node ip-10-0-1-5.ec2.internal

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ccm_proto::TokenSource;
use ccm_runtime::config_checks::number_within;
use clap::Parser;
use gateway_conformance::{Target, run, summary};

/// Checks a cloudgateway.v1 gateway against the contract.
#[derive(Parser)]
#[command(name = "gateway-conformance", version = ccm_runtime::version::LONG)]
struct Args {
    /// The gateway, `https://host:port` (with --tls-ca), or `http://` on this machine only.
    #[arg(long)]
    address: String,
    /// A PEM CA bundle to verify an https gateway.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// A directory with one token file per role: node.token,
    /// service.token, route.token, volume.token (where the provider offers
    /// volumes), and admin.token where the gateway offers the admin hook.
    #[arg(long)]
    tokens_dir: Option<PathBuf>,
    /// A role's token file, `ROLE=PATH` (repeatable; overrides --tokens-dir).
    #[arg(long = "token", value_parser = role_file)]
    tokens: Vec<(String, PathBuf)>,
    /// The cluster name the checks act for; the cloud must be set up for it
    /// (on AWS: subnets and route tables carrying its cluster tag).
    #[arg(long, default_value = "conformance")]
    cluster: String,
    /// A second cluster name, which must never see the first's resources.
    #[arg(long, default_value = "conformance-other")]
    other_cluster: String,
    /// The name of a node whose instance exists in the cloud; without it,
    /// one is made through the admin hook, or the checks that need one are
    /// skipped.
    #[arg(long)]
    node: Option<String>,
    /// An annotation the provider refuses, `KEY=VALUE`, for the check that
    /// a refused annotation makes nothing.
    #[arg(long, value_parser = annotation)]
    invalid_annotation: Option<(String, String)>,
    /// The longest a check waits for provisioning, in seconds.
    #[arg(long, default_value_t = 120, value_parser = number_within(1u64, 3600))]
    patience: u64,
}

fn role_file(value: &str) -> Result<(String, PathBuf), String> {
    let (role, path) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not ROLE=PATH"))?;
    match role {
        "node" | "service" | "route" | "admin" => Ok((role.to_owned(), PathBuf::from(path))),
        _ => Err(format!(
            "{role:?} is not a role; use node, service, route or admin"
        )),
    }
}

fn annotation(value: &str) -> Result<(String, String), String> {
    value
        .split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{value:?} is not KEY=VALUE"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ccm_runtime::process::install_crypto_provider();
    let mut tokens = BTreeMap::new();
    if let Some(dir) = &args.tokens_dir {
        for role in ["node", "service", "route", "volume", "admin"] {
            let file = dir.join(format!("{role}.token"));
            // The admin hook and volumes are optional: their checks skip
            // without a token.
            if !matches!(role, "admin" | "volume") || file.is_file() {
                tokens.insert(role.to_owned(), TokenSource::File(file));
            }
        }
    }
    for (role, path) in &args.tokens {
        tokens.insert(role.clone(), TokenSource::File(path.clone()));
    }
    let target = Target {
        address: args.address,
        tls_ca: args.tls_ca,
        tokens,
        cluster: args.cluster,
        other_cluster: args.other_cluster,
        node: args.node,
        invalid_annotation: args.invalid_annotation,
        patience: Duration::from_secs(args.patience),
    };
    let results = run(&target, |checked| println!("{checked}")).await;
    let (line, ok) = summary(&results);
    println!("{line}");
    std::process::exit(if ok { 0 } else { 1 });
}
