//! The node controller's flags, upstream's names where they exist.

use std::time::Duration;

use ccm_runtime::common_args::{Common, CommonArgs};
use ccm_runtime::config_checks::{Problems, duration_within, number_within};
use ccm_runtime::names;
use clap::Parser;

/// Initialises nodes from the cloud, keeps their addresses current, and
/// removes or taints nodes whose instance is gone or shut down.
#[derive(Parser, Debug)]
#[command(name = "node-controller", version, args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Node syncs run at once. Upstream uses 1; a sync that initialises
    /// also takes its share of the other nodes waiting for it and looks
    /// them up in one call, and the gateway merges the lookups of
    /// concurrent syncs, so more workers cost the cloud fewer calls per
    /// node, not more.
    #[arg(long, default_value = "32")]
    pub concurrent_node_syncs: String,
    /// Address updates written at once by the periodic sync; 0 means the value of --concurrent-node-syncs.
    #[arg(long, default_value = "0")]
    pub concurrent_node_status_updates: String,
    /// How often every node's addresses are compared with the cloud's.
    #[arg(long, default_value = "5m")]
    pub node_status_update_frequency: String,
    /// How often not-ready nodes are checked for a gone or shut-down instance.
    #[arg(long, default_value = "5s")]
    pub node_monitor_period: String,
    /// Most nodes per gateway lookup, in the periodic passes and in one initialising sync (1 to 1000).
    #[arg(long, default_value = "500")]
    pub lookup_batch_size: String,
    /// Largest share of the cluster's nodes deleted in one pass; past it, none are and a Warning is raised.
    #[arg(long, default_value = "0.5")]
    pub node_deletion_max_share: String,
    /// The deletion safeguard applies from this many nodes on.
    #[arg(long, default_value = "3")]
    pub node_deletion_min_nodes: String,
}

/// The checked settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub common: Common,
    pub workers: usize,
    pub status_workers: usize,
    pub status_period: Duration,
    pub monitor_period: Duration,
    pub batch_size: usize,
    pub deletion_max_share: f64,
    pub deletion_min_nodes: usize,
}

impl Settings {
    /// Checks every flag; all problems are reported together.
    pub fn from_args(args: &Args) -> Result<Self, Problems> {
        let mut p = Problems::new();
        let common = args
            .common
            .resolve(&mut p, "0.0.0.0:7411", names::LEASE_NODE_CONTROLLER);
        let workers = p.parse(
            "concurrent-node-syncs",
            &args.concurrent_node_syncs,
            number_within(1usize, 1000),
        );
        let status_workers = p.parse(
            "concurrent-node-status-updates",
            &args.concurrent_node_status_updates,
            number_within(0usize, 1000),
        );
        let status_period = p.parse(
            "node-status-update-frequency",
            &args.node_status_update_frequency,
            duration_within(Duration::from_millis(100), Duration::from_secs(24 * 3600)),
        );
        let monitor_period = p.parse(
            "node-monitor-period",
            &args.node_monitor_period,
            duration_within(Duration::from_millis(100), Duration::from_secs(24 * 3600)),
        );
        let batch_size = p.parse(
            "lookup-batch-size",
            &args.lookup_batch_size,
            number_within(1usize, 1000),
        );
        let share = p.parse(
            "node-deletion-max-share",
            &args.node_deletion_max_share,
            |s| match s.parse::<f64>() {
                Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
                _ => Err("must be a share from 0.0 to 1.0"),
            },
        );
        let min_nodes = p.parse(
            "node-deletion-min-nodes",
            &args.node_deletion_min_nodes,
            number_within(0usize, 1_000_000),
        );
        p.finish(|| {
            let workers = workers.expect("checked");
            Settings {
                common: common.expect("checked"),
                workers,
                status_workers: match status_workers.expect("checked") {
                    0 => workers,
                    n => n,
                },
                status_period: status_period.expect("checked"),
                monitor_period: monitor_period.expect("checked"),
                batch_size: batch_size.expect("checked"),
                deletion_max_share: share.expect("checked"),
                deletion_min_nodes: min_nodes.expect("checked"),
            }
        })
    }
}
