//! `aws-preflight`: before a cluster moves from cloud-provider-aws, what
//! the gateway will do with each LoadBalancer Service's load balancer:
//! make one, keep it, adopt it in place, adopt it with the changes listed,
//! or refuse it (why). It reads the Services through a kubeconfig and the
//! cloud with the gateway's own settings (the same flags, environment and
//! config file, so the same credentials and defaults), and writes nothing
//! anywhere. The verdicts are the gateway's own decisions, made by the
//! code its ensure runs.
//!
//! Exit status: 0 when every Service can move, 1 when one is refused or
//! its load balancer could not be read (a person should look first), 2
//! when the check itself could not run.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use ccm_provider::CloudError;
use ccm_provider_aws::{Action, AwsCloud, Verdict};
use clap::{Parser, ValueEnum};
use cloud_gateway::grpc::validate::Violations;
use cloud_gateway::settings::{ProviderKind, Settings};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use service_controller::plan;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Table,
    Json,
}

/// Tells, before moving a cluster from cloud-provider-aws, what the
/// gateway will do with each LoadBalancer Service's load balancer. Takes
/// the gateway's own flags (or its config file) for the cloud.
#[derive(Debug, Parser)]
#[command(name = "aws-preflight", version)]
struct Cli {
    /// The kubeconfig context to use (default: its current one).
    #[arg(long)]
    context: Option<String>,
    /// Only the Services of this namespace.
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// table, or json (one object a Service).
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
    /// The gateway's settings; its --kubeconfig is the cluster's
    /// (default: $KUBECONFIG, ~/.kube/config, or in-cluster), and its
    /// --cluster-name the one the controllers will run with (the name in
    /// the cluster tag, upstream's ClusterID).
    #[command(flatten)]
    gateway: cloud_gateway::Args,
}

/// One Service's line of the answer.
struct Row {
    namespace: String,
    name: String,
    verdict: Verdict,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(rows) => {
            match cli.output {
                Output::Table => print_table(&rows),
                Output::Json => print_json(&rows),
            }
            let needs_a_person = rows
                .iter()
                .any(|r| matches!(r.verdict.action, Action::Refuse | Action::Unknown));
            if needs_a_person {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("aws-preflight: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: &Cli) -> anyhow::Result<Vec<Row>> {
    let settings =
        Settings::from_args(&cli.gateway.serving_nothing()).map_err(|p| anyhow::anyhow!("{p}"))?;
    if settings.provider != ProviderKind::Aws {
        anyhow::bail!(
            "the preflight is for the AWS provider: pass --provider aws and its settings"
        );
    }
    let cloud = AwsCloud::connect(settings.aws.clone())
        .await
        .context("connect to AWS")?;
    let client = kube_client(cli).await?;
    let services: Api<Service> = match &cli.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let mut list = services
        .list(&ListParams::default())
        .await
        .context("list Services")?
        .items;
    list.sort_by_key(|s| (s.metadata.namespace.clone(), s.metadata.name.clone()));
    let serving = plan::ClassPolicy {
        default: true,
        named: Vec::new(),
    };
    let mut rows = Vec::new();
    for svc in list.iter().filter(|s| is_load_balancer(s)) {
        let verdict = if plan::wants_load_balancer(svc, &serving) {
            judge(&cloud, &cli.gateway.cluster_name, svc).await
        } else {
            let class = svc
                .spec
                .as_ref()
                .and_then(|s| s.load_balancer_class.clone());
            Verdict {
                action: Action::ImplementedElsewhere,
                kind: None,
                load_balancer: None,
                dns_name: None,
                details: vec![format!(
                    "loadBalancerClass {}: another controller serves it",
                    class.unwrap_or_default()
                )],
            }
        };
        rows.push(Row {
            namespace: svc.metadata.namespace.clone().unwrap_or_default(),
            name: svc.metadata.name.clone().unwrap_or_default(),
            verdict,
        });
    }
    Ok(rows)
}

/// The verdict on `svc`: refused as the gateway would refuse its
/// request, else what the provider's ensure would do.
async fn judge(cloud: &AwsCloud, cluster: &str, svc: &Service) -> Verdict {
    let wire = plan::lb_spec(svc);
    let mut v = Violations::default();
    v.cluster_name(cluster);
    v.spec(Some(&wire));
    match v.finish() {
        Err(CloudError::InvalidArgument(problems)) => Verdict {
            action: Action::Refuse,
            kind: None,
            load_balancer: None,
            dns_name: None,
            details: problems
                .into_iter()
                .map(|(field, why)| format!("{field}: {why}"))
                .collect(),
        },
        _ => {
            let spec = cloud_gateway::grpc::convert::spec(Some(wire));
            cloud.preflight(cluster, &spec).await
        }
    }
}

fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

async fn kube_client(cli: &Cli) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..Default::default()
    };
    let config = match cli.gateway.kubeconfig.as_deref().map(Path::new) {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options).await?
        }
        None if cli.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

fn print_table(rows: &[Row]) {
    if rows.is_empty() {
        println!("No LoadBalancer Services.");
        return;
    }
    let width = rows
        .iter()
        .map(|r| r.namespace.len() + r.name.len() + 1)
        .max()
        .unwrap_or(0)
        .max("SERVICE".len());
    println!("{:width$}  {:22}  LOAD BALANCER", "SERVICE", "ACTION");
    for r in rows {
        let v = &r.verdict;
        let lb = match (&v.kind, &v.load_balancer, &v.dns_name) {
            (Some(kind), Some(name), Some(dns)) => format!("{kind} {name} ({dns})"),
            (Some(kind), Some(name), None) => format!("{kind} {name}"),
            (Some(kind), None, _) => format!("a new {kind}"),
            _ => "-".to_owned(),
        };
        let service = format!("{}/{}", r.namespace, r.name);
        println!("{service:width$}  {:22}  {lb}", v.action.as_str());
        for d in &v.details {
            println!("{:width$}    - {d}", "");
        }
    }
}

fn print_json(rows: &[Row]) {
    let out: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let v = &r.verdict;
            json!({
                "namespace": r.namespace,
                "name": r.name,
                "action": v.action.as_str(),
                "kind": v.kind,
                "loadBalancer": v.load_balancer,
                "dnsName": v.dns_name,
                "details": v.details,
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&out).unwrap_or_else(|_| "[]".to_owned())
    );
}
