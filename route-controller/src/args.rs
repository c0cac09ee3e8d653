//! The route controller's flags, upstream's names where they exist.

use std::time::Duration;

use ccm_runtime::common_args::{Common, CommonArgs};
use ccm_runtime::config_checks::{Problems, duration_within, number_within};
use ccm_runtime::names;
use clap::Parser;
use ipnet::IpNet;

use crate::plan::parse_cluster_cidrs;

/// Programs a cloud route for each node's pod CIDRs and reports it in the
/// node's NetworkUnavailable condition.
#[derive(Parser, Debug)]
#[command(name = "route-controller", version = ccm_runtime::version::LONG, args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The pod network: one CIDR, or an IPv4 and an IPv6 CIDR separated by a comma. Only routes inside it are ever deleted.
    #[arg(long, env = "CCM_CLUSTER_CIDR", default_value = "")]
    pub cluster_cidr: String,
    /// Whether to program routes at all: true or false.
    #[arg(long, default_value = "true", num_args = 0..=1, default_missing_value = "true")]
    pub configure_cloud_routes: String,
    /// Slow full resync, besides the reconciles node changes trigger.
    #[arg(long, default_value = "5m")]
    pub route_reconciliation_period: String,
    /// Least time between two reconciles; node changes within it are handled together.
    #[arg(long, default_value = "1s")]
    pub min_route_reconcile_interval: String,
    /// Route creates and deletes in flight at once.
    #[arg(long, default_value = "50")]
    pub concurrent_route_operations: String,
}

/// The checked settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub common: Common,
    pub cluster_cidrs: Vec<IpNet>,
    pub enabled: bool,
    pub resync_period: Duration,
    pub min_interval: Duration,
    pub concurrency: usize,
}

impl Settings {
    /// Checks every flag; all problems are reported together.
    pub fn from_args(args: &Args) -> Result<Self, Problems> {
        let mut p = Problems::new();
        let common = args
            .common
            .resolve(&mut p, "0.0.0.0:7431", names::LEASE_ROUTE_CONTROLLER);
        let enabled = p.parse(
            "configure-cloud-routes",
            &args.configure_cloud_routes,
            |s| s.parse::<bool>().map_err(|_| "use true or false"),
        );
        // Without routes to program, the cluster CIDR does not matter.
        let cluster_cidrs = if enabled == Some(false) {
            Some(Vec::new())
        } else {
            p.parse("cluster-cidr", &args.cluster_cidr, parse_cluster_cidrs)
        };
        let resync_period = p.parse(
            "route-reconciliation-period",
            &args.route_reconciliation_period,
            duration_within(Duration::from_millis(100), Duration::from_secs(24 * 3600)),
        );
        let min_interval = p.parse(
            "min-route-reconcile-interval",
            &args.min_route_reconcile_interval,
            duration_within(Duration::ZERO, Duration::from_secs(3600)),
        );
        let concurrency = p.parse(
            "concurrent-route-operations",
            &args.concurrent_route_operations,
            number_within(1usize, 1000),
        );
        p.finish(|| Settings {
            common: common.expect("checked"),
            cluster_cidrs: cluster_cidrs.expect("checked"),
            enabled: enabled.expect("checked"),
            resync_period: resync_period.expect("checked"),
            min_interval: min_interval.expect("checked"),
            concurrency: concurrency.expect("checked"),
        })
    }
}
