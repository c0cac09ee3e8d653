//! `bench`: runs every benchmark scenario with our defaults and with the
//! upstream profile, prints the table and writes it as Markdown.
//!
//!     cargo build --release --bins && target/release/bench --out BENCHMARKS.md
//!
//! (`make bench` does both; `make bench-large` adds ten times the nodes
//! and Services of scenarios 1, 2 and 5.) Every size is a flag. The
//! binaries it starts are the ones beside it.

use std::path::PathBuf;
use std::time::Duration;

use ccm_bench::{Cloud, Harness, Sizes, machine, markdown};
use ccm_runtime::config_checks::number_within;
use clap::Parser;

/// Where the hand-written part of the report begins.
const FINDINGS: &str = "<!-- findings: kept across runs -->";

/// Benchmarks: our defaults against the upstream profile, in one run.
#[derive(Parser)]
#[command(name = "bench", version = ccm_runtime::version::LONG)]
struct Args {
    /// A few of everything: proves the harness works, measures nothing.
    #[arg(long)]
    smoke: bool,
    /// Write the Markdown report here (e.g. BENCHMARKS.md).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the report as this section of `--out` (between its own
    /// markers, which the main run keeps), its charts' names starting
    /// with it, instead of as the main run above the findings (`xl` for
    /// `make bench-xl`).
    #[arg(long, value_parser = section_name)]
    section: Option<String>,
    /// Latency of every simulated cloud call, in milliseconds.
    #[arg(long, default_value_t = 20, value_parser = number_within(0u64, 60_000))]
    latency_ms: u64,
    /// Cloud calls per second for the account.
    #[arg(long, default_value_t = 20.0, value_parser = number_within(0.1, 100_000.0))]
    budget: f64,
    /// Run only these scenarios, e.g. 1,6 (all by default).
    #[arg(long, value_delimiter = ',', value_parser = number_within(1u32, 99))]
    only: Vec<u32>,
    /// Where the sandboxes keep their state and logs.
    #[arg(long, default_value = "target/bench")]
    work_dir: PathBuf,
    /// Scenario 1: nodes joining at once, one run per size (default 1000).
    #[arg(long, value_delimiter = ',', value_parser = number_within(1usize, 100_000))]
    join_nodes: Vec<usize>,
    /// Scenario 2: nodes in the steady state, one run per size (default 1000).
    #[arg(long, value_delimiter = ',', value_parser = number_within(1usize, 100_000))]
    steady_nodes: Vec<usize>,
    /// Scenario 10: node group instances (a group per 100), one run per
    /// size (default 1000).
    #[arg(long, value_delimiter = ',', value_parser = number_within(2usize, 100_000))]
    autoscaler_nodes: Vec<usize>,
    /// Scenario 11: nodes, one run per size (default 1000,10000,100000).
    #[arg(long, value_delimiter = ',', value_parser = number_within(3usize, 1_000_000))]
    target_nodes: Vec<usize>,
    /// Scenario 12: nodes, one run per size (default 1000,10000,100000).
    #[arg(long, value_delimiter = ',', value_parser = number_within(3usize, 1_000_000))]
    live_target_nodes: Vec<usize>,
    /// Scenario 13: claims provisioned and attached at once (default 1000).
    #[arg(long, value_parser = number_within(1usize, 100_000))]
    volumes: Option<usize>,
    /// Scenarios 11 and 12: LoadBalancer Services, half Local (default 1000).
    #[arg(long, value_parser = number_within(2usize, 100_000))]
    target_services: Option<usize>,
    /// Scenario 2: measured window in seconds (default 90).
    #[arg(long, value_parser = number_within(1u64, 3600))]
    steady_window_s: Option<u64>,
    /// Scenario 2: how much faster than real time (default 10).
    #[arg(long, value_parser = number_within(1u32, 100))]
    compression: Option<u32>,
    /// Scenario 3: Services created at once (default 200).
    #[arg(long, value_parser = number_within(1usize, 100_000))]
    burst_services: Option<usize>,
    /// Scenario 4: Services that exist while nodes join (default 200).
    #[arg(long, value_parser = number_within(1usize, 100_000))]
    churn_services: Option<usize>,
    /// Scenario 4: nodes joining (default 100).
    #[arg(long, value_parser = number_within(1usize, 100_000))]
    churn_nodes: Option<usize>,
    /// Scenario 5: NODESxSERVICES held, one run per pair (default 5000x2000).
    #[arg(long, value_delimiter = ',', value_parser = nodes_by_services)]
    memory: Vec<(usize, usize)>,
    /// Scenario 9: NODESxSERVICES there when every leader is killed, one
    /// run per pair (default 1000x200).
    #[arg(long, value_delimiter = ',', value_parser = nodes_by_services)]
    takeover: Vec<(usize, usize)>,
    /// Scenario 6: calls per series and rate (default 10000).
    #[arg(long, value_parser = number_within(10usize, 10_000_000))]
    latency_samples: Option<usize>,
    /// Scenario 6: the high rate, calls per second (default 500).
    #[arg(long, value_parser = number_within(1u32, 100_000))]
    latency_high_rate: Option<u32>,
    /// Scenarios 7 and 8: Services on AWS (moto) (default 50).
    #[arg(long, value_parser = number_within(1usize, 10_000))]
    aws_services: Option<usize>,
    /// Scenario 8: nodes joining on AWS (default 10).
    #[arg(long, value_parser = number_within(1usize, 1000))]
    aws_joining: Option<usize>,
    /// Scenario 2: also run ours with the gateway serving in clear, for
    /// what TLS costs in the steady state (on in the default run).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    steady_in_clear: Option<bool>,
    /// Scenario 10: a real cluster-autoscaler binary (built with its
    /// externalgrpc provider), whose own loop is counted too.
    #[arg(long, env = "CLUSTER_AUTOSCALER")]
    cluster_autoscaler: Option<PathBuf>,
    /// Scenarios 1, 2 and 9: run our profile only, not the upstream
    /// profile's run too (quicker; its column stays empty), for measuring
    /// a change.
    #[arg(long)]
    ours_only: bool,
}

/// A section's name: lower-case letters, digits and dashes.
fn section_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 20
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    ok.then(|| s.to_owned())
        .ok_or_else(|| format!("{s:?}: expected up to 20 lower-case letters, digits and dashes"))
}

/// `5000x2000`: Nodes and Services.
fn nodes_by_services(s: &str) -> Result<(usize, usize), String> {
    let (n, m) = s
        .split_once('x')
        .ok_or_else(|| format!("{s:?}: expected NODESxSERVICES, e.g. 10000x5000"))?;
    let parse = |v: &str| {
        v.parse::<usize>()
            .ok()
            .filter(|v| (1..=100_000).contains(v))
            .ok_or_else(|| format!("{v:?} in {s:?}: expected a number from 1 to 100000"))
    };
    Ok((parse(n)?, parse(m)?))
}

impl Args {
    /// The sizes: `--smoke`'s or the default run's, each flag given
    /// replacing its part.
    fn sizes(&self) -> Sizes {
        let mut sizes = if self.smoke {
            Sizes::smoke()
        } else {
            Sizes::full()
        };
        let list = |given: &Vec<usize>, default: &mut Vec<usize>| {
            if !given.is_empty() {
                *default = given.clone();
            }
        };
        list(&self.join_nodes, &mut sizes.join_nodes);
        list(&self.steady_nodes, &mut sizes.steady_nodes);
        list(&self.autoscaler_nodes, &mut sizes.autoscaler_nodes);
        list(&self.target_nodes, &mut sizes.target_nodes);
        list(&self.live_target_nodes, &mut sizes.live_target_nodes);
        if !self.memory.is_empty() {
            sizes.memory = self.memory.clone();
        }
        if !self.takeover.is_empty() {
            sizes.takeover = self.takeover.clone();
        }
        let one = |given: Option<usize>, default: &mut usize| {
            if let Some(v) = given {
                *default = v;
            }
        };
        one(self.burst_services, &mut sizes.burst_services);
        one(self.target_services, &mut sizes.target_services);
        one(self.churn_services, &mut sizes.churn_services);
        one(self.churn_nodes, &mut sizes.churn_nodes);
        one(self.latency_samples, &mut sizes.latency_samples);
        one(self.aws_services, &mut sizes.aws_services);
        one(self.aws_joining, &mut sizes.aws_joining);
        one(self.volumes, &mut sizes.volumes);
        if let Some(s) = self.steady_window_s {
            sizes.steady_window = Duration::from_secs(s);
        }
        if let Some(k) = self.compression {
            sizes.compression = k;
        }
        if let Some(r) = self.latency_high_rate {
            sizes.latency_high_rate = r;
        }
        if let Some(in_clear) = self.steady_in_clear {
            sizes.steady_in_clear = in_clear;
        }
        sizes.cluster_autoscaler = self.cluster_autoscaler.clone();
        sizes.ours_only = self.ours_only;
        sizes
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ccm_runtime::telemetry::init(&ccm_runtime::telemetry::Options {
        directives: "warn".into(),
        ..Default::default()
    });
    let bin_dir = std::env::current_exe()?
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let cloud = Cloud {
        latency: Duration::from_millis(args.latency_ms),
        budget: args.budget,
    };
    let sizes = args.sizes();
    // What the run measures is the tree as it starts.
    let commit = ccm_bench::commit();
    if args.work_dir.exists() {
        std::fs::remove_dir_all(&args.work_dir)?;
    }
    std::fs::create_dir_all(&args.work_dir)?;
    let mut harness = Harness::new(bin_dir, args.work_dir.canonicalize()?, sizes, cloud.clone());
    let rows = harness
        .run_all(&args.only, |line| eprintln!("{line}"))
        .await?;
    let command = ccm_bench::command_line().join(" ");
    let when = ccm_bench::now_utc()?;
    if let Some(section) = &args.section {
        for plot in &mut harness.plots {
            plot.file = format!("{section}-{}", plot.file);
        }
    }
    let heading = match &args.section {
        Some(section) => format!("## Benchmarks: the `{section}` run"),
        None => "# Benchmarks".to_owned(),
    };
    // Charts go beside the report, in `benchmarks/`.
    const PLOTS: &str = "benchmarks";
    let report = markdown(
        &heading,
        &rows,
        &harness.tables,
        &harness.plots,
        PLOTS,
        &cloud,
        &command,
        &commit,
        &machine(),
        &when,
    );
    println!("{report}");
    if let Some(out) = &args.out {
        let dir = out
            .parent()
            .map(|p| p.join(PLOTS))
            .unwrap_or_else(|| PathBuf::from(PLOTS));
        std::fs::create_dir_all(&dir)?;
        for plot in &harness.plots {
            std::fs::write(dir.join(&plot.file), plot.svg())?;
        }
        let old = std::fs::read_to_string(out).unwrap_or_default();
        let new = match &args.section {
            // Its own markers, below the findings, which the main run keeps.
            Some(section) => ccm_bench::splice(
                &old,
                &format!(
                    "<!-- bench {section}: written by `bench --section {section}`, kept by the main run -->"
                ),
                &format!("<!-- /bench {section} -->"),
                &report,
            ),
            // What people wrote below the marker (findings, what limits
            // the rest, sections of other runs) survives a new run; the
            // table above it is replaced.
            None => {
                let kept = old
                    .find(FINDINGS)
                    .map(|i| old[i..].to_owned())
                    .unwrap_or_else(|| format!("{FINDINGS}\n"));
                format!("{report}\n{kept}")
            }
        };
        std::fs::write(out, new)?;
        eprintln!("written to {}", out.display());
    }
    Ok(())
}
