//! `soak`: the chaos soak behind BENCHMARKS.md's reliability section. See
//! the crate's documentation, and `soak --help`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ccm_soak::{Options, report};
use clap::Parser;

fn duration(s: &str) -> Result<Duration, String> {
    ccm_values::parse_duration(s)
}

/// The sandbox under churn, cloud faults and processes killed or frozen at
/// random, with every invariant checked all along; then convergence, and
/// memory over the run. Exits 1 if an invariant broke or the system did
/// not converge in time.
#[derive(Parser, Debug)]
#[command(name = "soak")]
struct Args {
    /// How long the chaos goes on.
    #[arg(long, default_value = "60m", value_parser = duration)]
    duration: Duration,
    /// When the first memory window starts.
    #[arg(long, default_value = "10m", value_parser = duration)]
    warm_up: Duration,
    /// The length of the memory windows compared (after warm-up, and the
    /// last before the chaos stops).
    #[arg(long, default_value = "10m", value_parser = duration)]
    window: Duration,
    /// Nodes at the start.
    #[arg(long, default_value_t = 12)]
    nodes: usize,
    /// LoadBalancer Services at the start.
    #[arg(long, default_value_t = 8)]
    services: usize,
    /// The shortest and longest time between two process faults.
    #[arg(long, default_value = "20s", value_parser = duration)]
    chaos_every_min: Duration,
    #[arg(long, default_value = "60s", value_parser = duration)]
    chaos_every_max: Duration,
    /// How long a frozen (SIGSTOP) process stays frozen, at least and at
    /// most.
    #[arg(long, default_value = "10s", value_parser = duration)]
    freeze_min: Duration,
    #[arg(long, default_value = "40s", value_parser = duration)]
    freeze_max: Duration,
    /// How long a killed process stays dead before it is started again, at
    /// least and at most.
    #[arg(long, default_value = "1s", value_parser = duration)]
    dead_min: Duration,
    #[arg(long, default_value = "10s", value_parser = duration)]
    dead_max: Duration,
    /// Between two churn actions.
    #[arg(long, default_value = "5s", value_parser = duration)]
    churn_every: Duration,
    /// Between two cloud fault windows, and how long each lasts.
    #[arg(long, default_value = "120s", value_parser = duration)]
    cloud_fault_every: Duration,
    #[arg(long, default_value = "30s", value_parser = duration)]
    cloud_fault_for: Duration,
    /// The bound on convergence once every fault is cleared.
    #[arg(long, default_value = "120s", value_parser = duration)]
    converge_within: Duration,
    /// How often each process's memory is sampled.
    #[arg(long, default_value = "10s", value_parser = duration)]
    sample_every: Duration,
    /// Where the sandbox keeps its state and logs (cleared at start).
    #[arg(long, default_value = ".soak")]
    state_dir: PathBuf,
    /// Where the binaries are; the directory of this one by default.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The seed of every random choice; a new one each run by default.
    #[arg(long)]
    seed: Option<u64>,
    /// Instead of the chaos, a version skew run: start the gateway and
    /// the controllers from this directory (another release's binaries,
    /// tools/previous-release/build.sh) and replace them with this
    /// build's one process at a time, checking that nothing settled is
    /// lost, moved or written to.
    #[arg(long)]
    upgrade_from: Option<PathBuf>,
    /// Which goes first in the upgrade: gateway-first or
    /// controllers-first.
    #[arg(long, default_value = "gateway-first")]
    upgrade_order: ccm_soak::upgrade::Order,
    /// How long the old and the new run side by side after each step.
    #[arg(long, default_value = "10s", value_parser = duration)]
    side_by_side: Duration,
    /// How long after a handover its cloud writes are held against it.
    #[arg(long, default_value = "10s", value_parser = duration)]
    handover: Duration,
    /// Write the report into this file's soak section (BENCHMARKS.md),
    /// the plot beside it under `benchmarks/`; else print it.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ccm_runtime::telemetry::init(&ccm_runtime::telemetry::Options {
        directives: "warn,ccm_soak=info".into(),
        ..Default::default()
    });
    let bin_dir = match args.bin_dir.clone() {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("the binary's directory")?
            .to_path_buf(),
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let options = Options {
        duration: args.duration,
        warm_up: args.warm_up,
        window: args.window,
        nodes: args.nodes,
        services: args.services,
        chaos_every: (args.chaos_every_min, args.chaos_every_max),
        freeze_for: (args.freeze_min, args.freeze_max),
        dead_for: (args.dead_min, args.dead_max),
        churn_every: args.churn_every,
        cloud_fault_every: args.cloud_fault_every,
        cloud_fault_for: args.cloud_fault_for,
        converge_within: args.converge_within,
        sample_every: args.sample_every,
        state_dir: args.state_dir.clone(),
        upgrade: args
            .upgrade_from
            .clone()
            .map(|from| ccm_soak::upgrade::Upgrade {
                from,
                order: args.upgrade_order,
                side_by_side: args.side_by_side,
                handover: args.handover,
            }),
        bin_dir,
        seed,
    };
    eprintln!(
        "soak: {:?} of chaos, seed {seed}, state in {}",
        options.duration,
        options.state_dir.display()
    );
    let outcome = ccm_soak::run(options).await?;
    let when = ccm_bench::now_utc()?;
    // The command as run, with the seed it drew, so the run can be repeated.
    let mut command = ccm_bench::command_line();
    if args.seed.is_none() {
        command.extend(["--seed".into(), seed.to_string()]);
    }
    let command = command.join(" ");
    let machine = ccm_bench::machine();
    match &args.out {
        Some(out) => {
            let section = report::markdown(&outcome, command.trim(), &machine, &when, "benchmarks");
            let old = std::fs::read_to_string(out).unwrap_or_default();
            std::fs::write(out, report::splice(&old, &section))
                .with_context(|| format!("write {}", out.display()))?;
            let plots = out
                .parent()
                .map(|p| p.join("benchmarks"))
                .unwrap_or_else(|| PathBuf::from("benchmarks"));
            std::fs::create_dir_all(&plots)?;
            let plot = report::plot(&outcome);
            std::fs::write(plots.join(&plot.file), plot.svg())?;
        }
        None => println!(
            "{}",
            report::markdown(&outcome, command.trim(), &machine, &when, "benchmarks")
        ),
    }
    let summary = serde_json::json!({
        "passed": outcome.passed(),
        "minutes": outcome.chaos.as_secs_f64() / 60.0,
        "violations": outcome.violations.iter().map(|v| &v.what).collect::<Vec<_>>(),
        "converged_s": outcome.converged.as_ref().ok().map(Duration::as_secs_f64),
        "not_converged": outcome.converged.as_ref().err(),
        "faults": outcome.faults,
        "churn": outcome.churn,
        "observed_rounds": outcome.observed_rounds,
        "blind_rounds": outcome.blind_rounds,
    });
    eprintln!("{summary}");
    if !outcome.passed() {
        std::process::exit(1);
    }
    Ok(())
}
