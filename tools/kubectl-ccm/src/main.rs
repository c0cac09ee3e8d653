//! `kubectl ccm`: asks the cloud controller manager why a Service is
//! pending or a Node uninitialised, and how the whole is doing. It reaches
//! everything through the Kubernetes API server with the caller's own
//! credentials and RBAC: Leases name the leaders, and the release's
//! diagnostics API (`diagnostics.cloudgateway.io/v1`, an aggregated API the
//! controllers serve) tells what each leader and the gateway say.
//!
//! Exit codes: 0 all is well (or the object is fine), 1 something needs a
//! person, 2 the question could not be answered (bad arguments, the API
//! server unreachable, forbidden).

mod facts;
mod status;
mod verdict;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use serde_json::Value;

use crate::facts::Install;
use crate::verdict::{EventLine, Leader, Verdict, human};

/// Asks the cloud controller manager why something is pending.
#[derive(Parser, Debug)]
#[command(name = "kubectl ccm", version = ccm_runtime::version::LONG)]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The Service's namespace (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Act as this user, as kubectl's --as.
    #[arg(long = "as", global = true)]
    as_user: Option<String>,
    /// Act as a member of this group, as kubectl's --as-group (repeatable).
    #[arg(long = "as-group", global = true)]
    as_group: Vec<String>,
    /// The namespace the cloud controller manager runs in.
    #[arg(
        long,
        global = true,
        env = "KUBECTL_CCM_NAMESPACE",
        default_value = "kube-system"
    )]
    ccm_namespace: String,
    /// The base of the chart's object names: its `fullnameOverride`, else
    /// the release name (objects are named `<base>-<component>`).
    #[arg(
        long,
        global = true,
        env = "KUBECTL_CCM_RELEASE",
        default_value = "ccm"
    )]
    release: String,
    /// The namespace Cluster Autoscaler writes its status ConfigMap
    /// (`cluster-autoscaler-status`) in: its `--namespace`.
    #[arg(
        long,
        global = true,
        env = "KUBECTL_CCM_AUTOSCALER_NAMESPACE",
        default_value = "kube-system"
    )]
    autoscaler_namespace: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Why a Service has no load balancer address, or a Node is not
    /// initialised: `why service/NAME`, `why node/NAME`.
    Why {
        /// `service/NAME` (or `svc/NAME`) or `node/NAME` (or `no/NAME`),
        /// or the kind and the name as two words.
        object: String,
        name: Option<String>,
    },
    /// Each controller's leader, queue and failing objects, and the
    /// gateway's health and budget; exits 1 when something needs a person.
    Status,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
    Yaml,
}

/// What `why` prints as JSON or YAML.
#[derive(Serialize)]
struct WhyReport<F: Serialize> {
    object: String,
    verdict: Verdict,
    facts: F,
}

enum Target {
    Service(String),
    Node(String),
}

fn target(object: &str, name: Option<&str>) -> Result<Target, String> {
    let (kind, name) = match (object.split_once('/'), name) {
        (Some((kind, name)), None) => (kind, name),
        (None, Some(name)) => (object, name),
        _ => {
            return Err(format!(
                "name one object: service/NAME or node/NAME, not {object:?}"
            ));
        }
    };
    if name.is_empty() {
        return Err("the object's name is empty".into());
    }
    match kind.to_lowercase().as_str() {
        "service" | "services" | "svc" => Ok(Target::Service(name.into())),
        "node" | "nodes" | "no" => Ok(Target::Node(name.into())),
        other => Err(format!(
            "kubectl ccm answers for services and nodes, not {other:?}"
        )),
    }
}

async fn client(args: &Args) -> anyhow::Result<(kube::Client, String)> {
    let options = kube::config::KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None => kube::Config::from_kubeconfig(&options).await?,
    };
    // An admin server that does not answer is an answer, not a reason to
    // retry for minutes.
    config.default_retry = false;
    // A diagnostics API that takes the connection and never answers must
    // not hang the question.
    config.read_timeout = Some(std::time::Duration::from_secs(10));
    config.connect_timeout = Some(std::time::Duration::from_secs(10));
    if let Some(user) = &args.as_user {
        config.auth_info.impersonate = Some(user.clone());
    }
    if !args.as_group.is_empty() {
        config.auth_info.impersonate_groups = Some(args.as_group.clone());
    }
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((kube::Client::try_from(config)?, namespace))
}

fn print<T: Serialize>(output: Output, value: &T) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Yaml => print!("{}", serde_norway::to_string(value)?),
        Output::Text => unreachable!("text is printed by each command"),
    }
    Ok(())
}

fn leader_line(l: &Leader) -> String {
    match (&l.pod, l.valid) {
        (Some(pod), true) => format!(
            "{pod} (lease {}, held {}, renewed {} ago)",
            l.lease,
            l.held_for_s.map(human).unwrap_or_else(|| "?".into()),
            l.renewed_ago_s.map(human).unwrap_or_else(|| "?".into())
        ),
        _ if !l.found => format!("none: no Lease {}", l.lease),
        _ => format!(
            "none: Lease {} ran out at {} (last renewed {} ago){}",
            l.lease,
            l.expired.as_deref().unwrap_or("?"),
            l.renewed_ago_s.map(human).unwrap_or_else(|| "?".into()),
            l.holder
                .as_deref()
                .map(|h| format!(" by {h}"))
                .unwrap_or_default()
        ),
    }
}

fn answer_line(answer: &Result<Value, String>) -> String {
    match answer {
        Ok(v) => v.to_string(),
        Err(why) => format!("not read: {why}"),
    }
}

fn queue_line(queue: &Result<Value, String>) -> String {
    let Ok(q) = queue else {
        return answer_line(queue);
    };
    let q = &q["queue"];
    let mut line = match (q["in_flight"].as_bool(), q["queued"].as_bool()) {
        (Some(true), _) => "in flight".to_owned(),
        (_, Some(true)) => "queued".to_owned(),
        _ => "not queued".to_owned(),
    };
    let t = &q["trouble"];
    if t.is_object() {
        line.push_str(&format!(
            "; {} failures, {} {}; since {} ago; next try in {}",
            t["failures"],
            t["kind"].as_str().unwrap_or_default(),
            t["message"].as_str().unwrap_or_default(),
            t["since_ago_s"].as_f64().map(human).unwrap_or_default(),
            t["next_try_in_s"].as_f64().map(human).unwrap_or_default(),
        ));
    }
    line
}

fn calls_lines(calls: &Result<Value, String>) -> Vec<String> {
    let Ok(c) = calls else {
        return vec![answer_line(calls)];
    };
    let list = c["calls"].as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        return vec!["none remembered".into()];
    }
    list.iter()
        .rev()
        .take(5)
        .map(|c| {
            let retry = c["retry_after_s"]
                .as_f64()
                .map(|s| format!(", retry after {}", human(s)))
                .unwrap_or_default();
            let message = c["message"].as_str().filter(|m| !m.is_empty());
            format!(
                "{} ago {} ({} priority): {}{}{}",
                c["ago_s"].as_f64().map(human).unwrap_or_default(),
                c["method"].as_str().unwrap_or_default(),
                c["priority"].as_str().unwrap_or_default(),
                c["outcome"].as_str().unwrap_or_default(),
                message.map(|m| format!(" {m}")).unwrap_or_default(),
                retry
            )
        })
        .collect()
}

fn events_lines(events: &Result<Vec<EventLine>, String>) -> Vec<String> {
    let events = match events {
        Ok(events) => events,
        Err(why) => return vec![format!("not read: {why}")],
    };
    if events.is_empty() {
        return vec!["none".into()];
    }
    events
        .iter()
        .map(|e| {
            format!(
                "{} ago {} {}: {}",
                e.age_s.map(human).unwrap_or_else(|| "?".into()),
                e.type_,
                e.reason,
                e.message
            )
        })
        .collect()
}

fn print_why(
    verdict: &Verdict,
    leader: &Leader,
    queue: &Result<Value, String>,
    calls: &Result<Value, String>,
    events: &Result<Vec<EventLine>, String>,
    extra: &[(&str, String)],
) {
    println!("{}", verdict.summary);
    println!();
    for (label, value) in extra {
        println!("{label:<14}{value}");
    }
    println!("{:<14}{}", "leader:", leader_line(leader));
    println!("{:<14}{}", "in its queue:", queue_line(queue));
    println!("gateway calls:");
    for line in calls_lines(calls) {
        println!("  {line}");
    }
    println!("events:");
    for line in events_lines(events) {
        println!("  {line}");
    }
}

async fn why(args: &Args, object: &str, name: Option<&str>) -> anyhow::Result<ExitCode> {
    let target = match target(object, name) {
        Ok(t) => t,
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(ExitCode::from(2));
        }
    };
    let (client, namespace) = client(args).await?;
    let install = Install {
        namespace: args.ccm_namespace.clone(),
        release: args.release.clone(),
    };
    let needs_person = match target {
        Target::Service(name) => {
            let f = match facts::service(&client, &install, &namespace, &name).await {
                Ok(f) => f,
                Err(why) => return fail(&why),
            };
            let v = verdict::why_service(&f);
            if args.output == Output::Text {
                let condition = f
                    .condition
                    .as_ref()
                    .map(|c| format!("{} {}: {}", c.status, c.reason, c.message))
                    .unwrap_or_else(|| "none".into());
                let extra = [
                    ("service:", format!("{} (type {})", f.service, f.type_)),
                    ("condition:", condition),
                ];
                print_why(&v, &f.leader, &f.queue, &f.gateway_calls, &f.events, &extra);
            } else {
                print(
                    args.output,
                    &WhyReport {
                        object: format!("service/{}", f.service),
                        verdict: v.clone(),
                        facts: &f,
                    },
                )?;
            }
            v.needs_person
        }
        Target::Node(name) => {
            let f = match facts::node(&client, &install, &name).await {
                Ok(f) => f,
                Err(why) => return fail(&why),
            };
            let v = verdict::why_node(&f);
            if args.output == Output::Text {
                let extra = [(
                    "node:",
                    format!(
                        "{} (provider ID {})",
                        f.node,
                        f.provider_id.as_deref().unwrap_or("none")
                    ),
                )];
                print_why(&v, &f.leader, &f.queue, &f.gateway_calls, &f.events, &extra);
            } else {
                print(
                    args.output,
                    &WhyReport {
                        object: format!("node/{}", f.node),
                        verdict: v.clone(),
                        facts: &f,
                    },
                )?;
            }
            v.needs_person
        }
    };
    Ok(ExitCode::from(u8::from(needs_person)))
}

fn fail(why: &str) -> anyhow::Result<ExitCode> {
    eprintln!("error: {why}");
    Ok(ExitCode::from(2))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.command {
        Command::Why { object, name } => why(&args, object, name.as_deref()).await,
        Command::Status => status::run(&args).await,
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(2)
    })
}
