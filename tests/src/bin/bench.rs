//! `bench`: runs every benchmark scenario with our defaults and with the
//! upstream profile, prints the table and writes it as Markdown.
//!
//!     cargo build --release --bins && target/release/bench --out BENCHMARKS.md
//!
//! (`make bench` does both.) The binaries it starts are the ones beside it.

use std::path::PathBuf;
use std::time::Duration;

use ccm_runtime::settings::number_within;
use ccm_testkit::bench::{Cloud, Harness, Sizes, machine, markdown};
use clap::Parser;

/// Where the hand-written part of the report begins.
const FINDINGS: &str = "<!-- findings: kept across runs -->";

/// Benchmarks: our defaults against the upstream profile, in one run.
#[derive(Parser)]
#[command(name = "bench", version)]
struct Args {
    /// A few of everything: proves the harness works, measures nothing.
    #[arg(long)]
    smoke: bool,
    /// Write the Markdown report here (e.g. BENCHMARKS.md).
    #[arg(long)]
    out: Option<PathBuf>,
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
    let sizes = if args.smoke {
        Sizes::smoke()
    } else {
        Sizes::full()
    };
    if args.work_dir.exists() {
        std::fs::remove_dir_all(&args.work_dir)?;
    }
    std::fs::create_dir_all(&args.work_dir)?;
    let mut harness = Harness::new(bin_dir, args.work_dir.canonicalize()?, sizes, cloud.clone());
    let rows = harness
        .run_all(&args.only, |line| eprintln!("{line}"))
        .await?;
    let command = std::env::args()
        .map(|a| {
            a.rsplit_once("/target/")
                .map(|(_, rest)| format!("target/{rest}"))
                .unwrap_or(a)
        })
        .collect::<Vec<_>>()
        .join(" ");
    let when = String::from_utf8_lossy(
        &std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()?
            .stdout,
    )
    .trim()
    .to_owned();
    // Charts go beside the report, in `benchmarks/`.
    const PLOTS: &str = "benchmarks";
    let report = markdown(
        &rows,
        &harness.plots,
        PLOTS,
        &cloud,
        &command,
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
        // What people wrote below the marker (findings, what limits the
        // rest) survives a new run; the table above it is replaced.
        let kept = std::fs::read_to_string(out)
            .ok()
            .and_then(|old| old.find(FINDINGS).map(|i| old[i..].to_owned()))
            .unwrap_or_else(|| format!("{FINDINGS}\n"));
        std::fs::write(out, format!("{report}\n{kept}"))?;
        eprintln!("written to {}", out.display());
    }
    Ok(())
}
