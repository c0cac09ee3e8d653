//! `simctl`: act on the simulated cloud of a running sandbox (or any
//! gateway on the sim provider) as a cloud console would.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ccm_proto::v1::{
    CreateInstanceRequest, CreateNodeGroupRequest, Faults, GetStatsRequest, InstanceId,
    ListInstancesRequest, ListSimNodeGroupsRequest, SimNodeGroup, SimTaint,
};
use ccm_proto::{ClientConfig, GatewayClient, TokenSource};
use ccm_runtime::config_checks::number_within;
use clap::{Parser, Subcommand};

/// Acts on the simulated cloud: instances, node groups and faults.
#[derive(Parser)]
#[command(name = "simctl", version = ccm_runtime::version::LONG)]
struct Args {
    /// The sandbox's endpoints.json (gateway address and admin token).
    #[arg(long, default_value = ".sandbox/endpoints.json")]
    endpoints: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List instances.
    List,
    /// Create a running instance.
    Create { name: String },
    /// Stop an instance (it still exists).
    Stop { name: String },
    /// Start a stopped instance.
    Start { name: String },
    /// Terminate an instance (gone for good).
    Terminate { name: String },
    /// Set faults; no options switch them off.
    Faults {
        /// Share of calls failing as unavailable (0 to 1).
        #[arg(long, default_value_t = 0.0, value_parser = number_within(0.0, 1.0))]
        error_rate: f64,
        /// Share of calls throttled (0 to 1).
        #[arg(long, default_value_t = 0.0, value_parser = number_within(0.0, 1.0))]
        throttle_rate: f64,
        /// Latency added to every call, e.g. 20ms.
        #[arg(long)]
        latency: Option<String>,
        /// How long new load balancers take to provision, e.g. 2s.
        #[arg(long)]
        provisioning: Option<String>,
        /// How long a new volume attachment stays attaching, e.g. 5s (long
        /// enough, a volume stuck attaching).
        #[arg(long)]
        attach_delay: Option<String>,
        /// How long a new volume stays creating, e.g. 3s.
        #[arg(long)]
        create_delay: Option<String>,
        /// A zone out of capacity: node groups' launches there fail
        /// (repeat for more zones).
        #[arg(long = "capacity-exhausted-zone")]
        capacity_exhausted_zones: Vec<String>,
    },
    /// List node groups, with their instances and failed launches.
    Groups,
    /// Create a node group (an Auto Scaling group for Cluster Autoscaler).
    CreateGroup {
        /// Its ID (a DNS label); instances are named `<id>-<number>`.
        id: String,
        #[arg(long, default_value_t = 0)]
        min: u32,
        #[arg(long, default_value_t = 10)]
        max: u32,
        /// Instances to start with.
        #[arg(long, default_value_t = 0)]
        target: u32,
        /// e.g. sim.standard-4 (4 CPUs, 16 GiB) or sim.gpu-8.
        #[arg(long, default_value = "")]
        instance_type: String,
        /// A zone its instances go to (repeat; every zone by default).
        #[arg(long = "zone")]
        zones: Vec<String>,
        /// A label of its nodes, key=value (repeat).
        #[arg(long = "label", value_parser = key_value)]
        labels: Vec<(String, String)>,
        /// A taint of its template, key=value:Effect (repeat).
        #[arg(long = "taint", value_parser = taint)]
        taints: Vec<SimTaint>,
        /// One of Cluster Autoscaler's options for this group, name=value
        /// as its AWS provider's `autoscaling-options` tags name them, e.g.
        /// scaledownunneededtime=5m (repeat).
        #[arg(long = "option", value_parser = key_value)]
        options: Vec<(String, String)>,
        /// The cluster whose group it is.
        #[arg(long, default_value = "kubernetes")]
        cluster: String,
    },
    /// Provider calls so far, by operation.
    Stats,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

fn taint(s: &str) -> Result<SimTaint, String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not key=value:Effect"))?;
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    Ok(SimTaint {
        key: key.to_owned(),
        value: value.to_owned(),
        effect: effect.to_owned(),
    })
}

fn show_group(g: &SimNodeGroup) {
    println!(
        "{}\t{}\tmin {} max {} target {}\t{}\t{}\t{}",
        g.cluster_name,
        g.id,
        g.min_size,
        g.max_size,
        g.target_size,
        g.instance_type,
        g.instances.join(","),
        if g.failed_launches.is_empty() {
            String::new()
        } else {
            format!("failed: {}", g.failed_launches.join(","))
        }
    );
}

fn duration(s: &Option<String>) -> anyhow::Result<Option<prost_types::Duration>> {
    s.as_deref()
        .map(|v| {
            let d: Duration =
                ccm_runtime::config_checks::parse_duration(v).map_err(anyhow::Error::msg)?;
            Ok(prost_types::Duration {
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            })
        })
        .transpose()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let endpoints: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&args.endpoints)
            .with_context(|| format!("read {}", args.endpoints.display()))?,
    )?;
    let gateway = endpoints["gateway"]
        .as_str()
        .context("no gateway in endpoints.json")?;
    let token = endpoints["admin_token_file"]
        .as_str()
        .context("no admin_token_file in endpoints.json")?;
    let mut config = ClientConfig::new(gateway, "kubernetes", TokenSource::File(token.into()));
    config.tls_ca = endpoints["gateway_ca_file"].as_str().map(Into::into);
    let client = GatewayClient::new(config)?;
    let mut admin = client.sim_admin()?;
    let show = |i: ccm_proto::v1::SimInstance| {
        let state = ccm_proto::v1::InstanceState::try_from(i.state)
            .map(|s| s.as_str_name())
            .unwrap_or("?");
        println!(
            "{}\t{}\t{}\t{}\t{}",
            i.id,
            i.name,
            i.zone,
            state.trim_start_matches("INSTANCE_STATE_"),
            i.addresses
                .iter()
                .map(|a| a.address.clone())
                .collect::<Vec<_>>()
                .join(",")
        );
    };
    match args.command {
        Cmd::List => {
            for i in admin
                .list_instances(ListInstancesRequest {})
                .await?
                .into_inner()
                .instances
            {
                show(i);
            }
        }
        Cmd::Create { name } => show(
            admin
                .create_instance(CreateInstanceRequest {
                    name,
                    ..Default::default()
                })
                .await?
                .into_inner(),
        ),
        Cmd::Stop { name } => show(
            admin
                .stop_instance(InstanceId { id: name })
                .await?
                .into_inner(),
        ),
        Cmd::Start { name } => show(
            admin
                .start_instance(InstanceId { id: name })
                .await?
                .into_inner(),
        ),
        Cmd::Terminate { name } => {
            admin
                .terminate_instance(InstanceId { id: name.clone() })
                .await?;
            println!("{name} terminated");
        }
        Cmd::Faults {
            error_rate,
            throttle_rate,
            latency,
            provisioning,
            attach_delay,
            create_delay,
            capacity_exhausted_zones,
        } => {
            let mut faults = Faults {
                error_rate,
                throttle_rate,
                lb_provisioning_delay: duration(&provisioning)?,
                volume_attach_delay: duration(&attach_delay)?,
                volume_create_delay: duration(&create_delay)?,
                capacity_exhausted_zones,
                ..Default::default()
            };
            if let Some(d) = duration(&latency)? {
                faults.latency.insert("*".into(), d);
            }
            println!("{:?}", admin.set_faults(faults).await?.into_inner());
        }
        Cmd::Groups => {
            for g in admin
                .list_node_groups(ListSimNodeGroupsRequest {})
                .await?
                .into_inner()
                .node_groups
            {
                show_group(&g);
            }
        }
        Cmd::CreateGroup {
            id,
            min,
            max,
            target,
            instance_type,
            zones,
            labels,
            taints,
            options,
            cluster,
        } => show_group(
            &admin
                .create_node_group(CreateNodeGroupRequest {
                    cluster_name: cluster,
                    id,
                    min_size: min,
                    max_size: max,
                    target_size: target,
                    instance_type,
                    zones,
                    labels: labels.into_iter().collect(),
                    taints,
                    autoscaling_options: options.into_iter().collect(),
                })
                .await?
                .into_inner(),
        ),
        Cmd::Stats => {
            let stats = admin
                .get_stats(GetStatsRequest { reset: false })
                .await?
                .into_inner();
            let mut calls: Vec<_> = stats.calls.into_iter().collect();
            calls.sort();
            for (op, n) in calls {
                println!("{op}\t{n}");
            }
        }
    }
    Ok(())
}
