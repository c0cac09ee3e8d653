//! The node controller's flags, upstream's names where they exist.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_runtime::common_args::{Common, CommonArgs};
use ccm_runtime::config_checks::{Problems, duration_within, number_within};
use ccm_runtime::names;
use clap::Parser;

/// Initialises nodes from the cloud, keeps their addresses current, and
/// removes or taints nodes whose instance is gone or shut down.
#[derive(Parser, Debug)]
#[command(name = "node-controller", version = ccm_runtime::version::LONG, args_override_self = true)]
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
    /// Address updates written, and lifecycle lookups sent, at once by the periodic passes; 0 means the value of --concurrent-node-syncs.
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
    /// Tags for the instance behind every Node, as key=value pairs separated by commas (a key alone or key= gives an empty value): cloud-provider-aws's tagging controller (its --tags). Empty (the default): off.
    #[arg(long, default_value = "")]
    pub instance_tags: String,
    /// Approve or deny kubelet serving certificate requests (signer kubernetes.io/kubelet-serving) by the cloud's word on each node's instance: true or false.
    #[arg(long, default_value = "false")]
    pub approve_kubelet_serving_csrs: String,
}

/// Reads `key=value` pairs separated by commas, as upstream's `--tags`:
/// 1 to 50, keys of 1 to 128 characters not starting with `aws:` (AWS's
/// own) nor naming the cluster, values of up to 256.
pub fn instance_tags(value: &str) -> Result<BTreeMap<String, String>, String> {
    let mut tags = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = item.split_once('=').unwrap_or((item, ""));
        let key = key.trim();
        if !(1..=128).contains(&key.chars().count()) {
            return Err(format!("key {key:?} is not 1 to 128 characters"));
        }
        if key.to_ascii_lowercase().starts_with("aws:") {
            return Err(format!(
                "key {key:?} starts with aws:, which AWS keeps for itself"
            ));
        }
        if key.starts_with("kubernetes.io/cluster/") || key == "KubernetesCluster" {
            return Err(format!("key {key:?} says which cluster an instance is in"));
        }
        if value.chars().count() > 256 {
            return Err(format!(
                "the value of {key:?} is longer than 256 characters"
            ));
        }
        if tags
            .insert(key.to_owned(), value.trim().to_owned())
            .is_some()
        {
            return Err(format!("key {key:?} is named twice"));
        }
    }
    if tags.len() > 50 {
        return Err(format!(
            "names {} tags; an instance takes at most 50",
            tags.len()
        ));
    }
    Ok(tags)
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
    /// The tagging controller's tags; empty: off.
    pub instance_tags: BTreeMap<String, String>,
    /// Whether kubelet serving CSRs are judged.
    pub approve_serving_csrs: bool,
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
        let tags = p.parse("instance-tags", &args.instance_tags, instance_tags);
        let csrs = p.parse(
            "approve-kubelet-serving-csrs",
            &args.approve_kubelet_serving_csrs,
            |s| s.trim().parse::<bool>().map_err(|_| "use true or false"),
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
                instance_tags: tags.expect("checked"),
                approve_serving_csrs: csrs.expect("checked"),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_tags_read_as_upstreams_tags_and_refuse_what_aws_would() {
        let tags = instance_tags("team=ml, cost-center=42,KeyNoVal1=,KeyNoVal2").unwrap();
        let want: BTreeMap<String, String> = [
            ("team", "ml"),
            ("cost-center", "42"),
            ("KeyNoVal1", ""),
            ("KeyNoVal2", ""),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(tags, want);
        assert!(instance_tags("").unwrap().is_empty(), "off by default");
        for (bad, why) in [
            ("aws:x=1", "aws:"),
            ("kubernetes.io/cluster/c=owned", "which cluster"),
            ("a=1,a=2", "twice"),
            (&format!("{}=1", "k".repeat(129)), "1 to 128"),
        ] {
            let err = instance_tags(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let many: Vec<String> = (0..51).map(|i| format!("k{i}=v")).collect();
        assert!(
            instance_tags(&many.join(","))
                .unwrap_err()
                .contains("at most 50")
        );
    }
}
