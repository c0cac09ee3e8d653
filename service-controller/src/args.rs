//! The service controller's flags, upstream's names where they exist.

use std::time::Duration;

use ccm_runtime::common_args::{Common, CommonArgs};
use ccm_runtime::config_checks::{Problems, duration_within, number_within};
use ccm_runtime::names;
use clap::Parser;

use crate::plan::ClassPolicy;

/// Cloud load balancers for Services of type LoadBalancer.
#[derive(Parser, Debug)]
#[command(name = "service-controller", version = ccm_runtime::version::LONG, args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Services synced at once (upstream: 1).
    #[arg(long, default_value = "16")]
    pub concurrent_service_syncs: String,
    /// Named loadBalancerClass values to serve as well, comma-separated.
    #[arg(long, default_value = "")]
    pub load_balancer_class: String,
    /// Serve only the named classes, not Services without a class: true or false.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    pub ignore_default_class: String,
    /// How long node changes are gathered before load balancer hosts are updated, one update per load balancer.
    #[arg(long, default_value = "1s")]
    pub node_sync_debounce: String,
    /// How often this cluster's load balancers are compared with its Services.
    #[arg(long, default_value = "5m")]
    pub orphan_check_period: String,
    /// Delete load balancers whose Service is gone: true or false. Off, they are only reported.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    pub delete_orphaned_load_balancers: String,
    /// How long a load balancer must stay orphaned before it is deleted.
    #[arg(long, default_value = "10m")]
    pub orphan_grace_period: String,
    /// How many nodes per zone back each load balancer (a stable subset of its own per Service); 0 for every eligible node, as upstream. Always within the cloud's quotas.
    #[arg(long, default_value = "25")]
    pub load_balancer_subset_size: String,
    /// How long a node whose last endpoint of a Service with externalTrafficPolicy: Local stopped serving still backs its load balancer, so that a rolling update of the pods does not move targets back and forth.
    #[arg(long, default_value = "60s")]
    pub local_endpoints_grace_period: String,
}

/// The checked settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub common: Common,
    pub workers: usize,
    pub classes: ClassPolicy,
    pub debounce: Duration,
    pub orphan_period: Duration,
    pub delete_orphans: bool,
    pub orphan_grace: Duration,
    /// Nodes per zone in each Service's subset; 0 for all.
    pub subset_size: u32,
    /// How long a node that stopped serving a Local Service still backs it.
    pub local_grace: Duration,
}

fn boolean(s: &str) -> Result<bool, &'static str> {
    s.parse::<bool>().map_err(|_| "use true or false")
}

impl Settings {
    /// Checks every flag; all problems are reported together.
    pub fn from_args(args: &Args) -> Result<Self, Problems> {
        let mut p = Problems::new();
        let common = args
            .common
            .resolve(&mut p, "0.0.0.0:7421", names::LEASE_SERVICE_CONTROLLER);
        let workers = p.parse(
            "concurrent-service-syncs",
            &args.concurrent_service_syncs,
            number_within(1usize, 1000),
        );
        let named: Vec<String> = args
            .load_balancer_class
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        let ignore_default = p.parse("ignore-default-class", &args.ignore_default_class, boolean);
        if ignore_default == Some(true) && named.is_empty() {
            p.push(
                "ignore-default-class",
                "needs --load-balancer-class, or no Service would be served",
            );
        }
        let debounce = p.parse(
            "node-sync-debounce",
            &args.node_sync_debounce,
            duration_within(Duration::ZERO, Duration::from_secs(600)),
        );
        let orphan_period = p.parse(
            "orphan-check-period",
            &args.orphan_check_period,
            duration_within(
                Duration::from_millis(100),
                Duration::from_secs(7 * 24 * 3600),
            ),
        );
        let delete_orphans = p.parse(
            "delete-orphaned-load-balancers",
            &args.delete_orphaned_load_balancers,
            boolean,
        );
        let orphan_grace = p.parse(
            "orphan-grace-period",
            &args.orphan_grace_period,
            duration_within(Duration::ZERO, Duration::from_secs(30 * 24 * 3600)),
        );
        let subset_size = p.parse(
            "load-balancer-subset-size",
            &args.load_balancer_subset_size,
            number_within(0u32, crate::subsets::MAX_SUBSET_SIZE),
        );
        let local_grace = p.parse(
            "local-endpoints-grace-period",
            &args.local_endpoints_grace_period,
            duration_within(Duration::ZERO, Duration::from_secs(3600)),
        );
        p.finish(|| Settings {
            common: common.expect("checked"),
            workers: workers.expect("checked"),
            classes: ClassPolicy {
                default: !ignore_default.expect("checked"),
                named,
            },
            debounce: debounce.expect("checked"),
            orphan_period: orphan_period.expect("checked"),
            delete_orphans: delete_orphans.expect("checked"),
            orphan_grace: orphan_grace.expect("checked"),
            subset_size: subset_size.expect("checked"),
            local_grace: local_grace.expect("checked"),
        })
    }
}
