//! The soak's report: a section of BENCHMARKS.md (kept between its own
//! markers, which the benchmark harness leaves alone) and the memory plot.

use std::fmt::Write as _;
use std::time::Duration;

use ccm_bench::plot::Plot;

use crate::{Memory, Outcome};

/// The markers around the soak's section of BENCHMARKS.md.
pub const BEGIN: &str = "<!-- soak: written by `make soak`, kept by the benchmarks -->";
pub const END: &str = "<!-- /soak -->";

/// How far the last window's memory may be from the first's.
pub const FLAT: f64 = 0.10;

/// One process's memory in the two windows compared.
#[derive(Clone, Debug, PartialEq)]
pub struct Flatness {
    pub first: Option<f64>,
    pub last: Option<f64>,
    pub peak: f64,
    pub restarts: usize,
}

impl Flatness {
    /// Last ÷ first, when both windows have samples.
    pub fn ratio(&self) -> Option<f64> {
        Some(self.last? / self.first?)
    }

    /// Whether the last window is within [`FLAT`] of the first.
    pub fn flat(&self) -> Option<bool> {
        self.ratio().map(|r| (r - 1.0).abs() <= FLAT)
    }
}

/// The mean resident memory in `[from, to)` minutes, leaving out the
/// `settle` minutes after each (re)start, when a process builds its caches
/// again.
fn mean(memory: &Memory, (from, to): (f64, f64), settle: f64) -> Option<f64> {
    let kept: Vec<f64> = memory
        .samples
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .filter(|(t, _)| !memory.restarts.iter().any(|r| *t >= *r && *t < r + settle))
        .map(|(_, mib)| *mib)
        .collect();
    (!kept.is_empty()).then(|| kept.iter().sum::<f64>() / kept.len() as f64)
}

/// Each process's memory in the window after warm-up and in the last one
/// before the chaos stopped.
pub fn flatness(outcome: &Outcome) -> Vec<(String, Flatness)> {
    let o = &outcome.options;
    let minutes = |d: Duration| d.as_secs_f64() / 60.0;
    let first = (minutes(o.warm_up), minutes(o.warm_up + o.window));
    let end = minutes(outcome.chaos);
    let last = ((end - minutes(o.window)).max(first.1), end);
    let settle = minutes(o.window) / 5.0;
    outcome
        .memory
        .iter()
        .map(|(name, m)| {
            let peak = m.samples.iter().map(|(_, mib)| *mib).fold(0.0, f64::max);
            let f = Flatness {
                first: mean(m, first, settle),
                last: mean(m, last, settle),
                peak,
                restarts: m.restarts.len(),
            };
            (name.clone(), f)
        })
        .collect()
}

/// The memory plot: every process's resident memory over the run.
pub fn plot(outcome: &Outcome) -> Plot {
    Plot {
        file: "soak-memory.svg".into(),
        title: format!(
            "Resident memory during {:.0} minutes of chaos",
            outcome.chaos.as_secs_f64() / 60.0
        ),
        x_label: "minutes".into(),
        y_label: "MiB".into(),
        log_x: false,
        series: outcome
            .memory
            .iter()
            .map(|(name, m)| (name.clone(), m.samples.clone()))
            .collect(),
    }
}

/// Whether `process` is part of the product (the gateway or a
/// controller), whose memory the flatness target is about.
fn ours(process: &str) -> bool {
    process != "kube-test-apiserver"
}

/// A duration as the report says it: minutes, or seconds below one.
fn span(d: Duration) -> String {
    if d >= Duration::from_secs(60) {
        format!("{} min", (d.as_secs_f64() / 60.0 * 10.0).round() / 10.0)
    } else {
        format!("{} s", d.as_secs())
    }
}

fn yes(met: bool) -> &'static str {
    if met { "yes" } else { "no" }
}

/// The section of BENCHMARKS.md, its plot under `plots_dir`.
pub fn markdown(
    outcome: &Outcome,
    command: &str,
    machine: &str,
    when: &str,
    plots_dir: &str,
) -> String {
    let o = &outcome.options;
    let mut out = String::new();
    let minutes = outcome.chaos.as_secs_f64() / 60.0;
    let _ = writeln!(out, "## Reliability: the chaos soak\n");
    let _ = writeln!(
        out,
        "Produced by `{command}` on {when}, on {machine}: the sandbox's real processes (the API \
test server, the gateway on the sim, two replicas of each controller) with {} nodes and {} \
LoadBalancer Services at the start, under churn (an action every {} s), cloud fault windows \
({} s every {} s) and, every {}–{} s, one process chosen at random killed with SIGKILL (and \
started again {}–{} s later, as a Deployment would) or frozen with SIGSTOP for {}–{} s. \
An observer read the cloud (the sim's database, directly) and the API server every second \
and checked the invariants throughout. Then every fault was cleared and the run waited for \
convergence with nothing leaked. Seed {}.\n",
        o.nodes,
        o.services,
        o.churn_every.as_secs(),
        o.cloud_fault_for.as_secs(),
        o.cloud_fault_every.as_secs(),
        o.chaos_every.0.as_secs(),
        o.chaos_every.1.as_secs(),
        o.dead_for.0.as_secs(),
        o.dead_for.1.as_secs(),
        o.freeze_for.0.as_secs(),
        o.freeze_for.1.as_secs(),
        o.seed,
    );
    let bound = o.converge_within.as_secs_f64();
    let converged = match &outcome.converged {
        Ok(d) => format!("{:.1} s", d.as_secs_f64()),
        Err(off) => format!("not within {bound:.0} s: {off}"),
    };
    let process_faults: u64 = outcome
        .faults
        .iter()
        .filter(|(k, _)| k.starts_with("kill") || k.starts_with("freeze"))
        .map(|(_, n)| n)
        .sum();
    let _ = writeln!(
        out,
        "| measure | value | target | met |\n|---|---:|---|---|"
    );
    let _ = writeln!(out, "| minutes of chaos | {minutes:.1} | — | — |");
    let _ = writeln!(
        out,
        "| processes killed or frozen | {process_faults} | — | — |"
    );
    let _ = writeln!(
        out,
        "| invariant violations | {} | 0 | {} |",
        outcome.violations.len(),
        yes(outcome.violations.is_empty())
    );
    let _ = writeln!(
        out,
        "| time to converge after the last fault | {converged} | ≤ {bound:.0} s | {} |",
        yes(outcome.converged.is_ok())
    );
    let _ = writeln!(
        out,
        "| observer rounds that saw both sides / that could not | {} / {} | — | — |",
        outcome.observed_rounds, outcome.blind_rounds
    );
    let flat = flatness(outcome);
    let all_flat = flat
        .iter()
        .filter(|(name, _)| ours(name))
        .all(|(_, f)| f.flat() != Some(false));
    let _ = writeln!(
        out,
        "| memory flat: the last {} within {:.0}% of the {} after warm-up, for the gateway and every controller | {} | yes | {} |",
        span(o.window),
        FLAT * 100.0,
        span(o.window),
        yes(all_flat),
        yes(all_flat)
    );
    if !outcome.violations.is_empty() {
        let _ = writeln!(out, "\nViolations:\n");
        for v in outcome.violations.iter().take(50) {
            let _ = writeln!(out, "- at {:.0} s: {}", v.at.as_secs_f64(), v.what);
        }
    }
    let _ = writeln!(out, "\nFaults injected:\n\n| fault | times |\n|---|---:|");
    for (kind, n) in &outcome.faults {
        let _ = writeln!(out, "| {kind} | {n} |");
    }
    let _ = writeln!(out, "\nChurn:\n\n| action | times |\n|---|---:|");
    for (kind, n) in &outcome.churn {
        let _ = writeln!(out, "| {kind} | {n} |");
    }
    let _ = writeln!(
        out,
        "\nResident memory (mean MiB; the first {} after each start left out). The API test server \
is the cluster's store, not part of the product: it keeps every object the run made (events, \
certificate requests), as a cluster's etcd does until its TTLs and cleaners run, so it grows \
by design and is shown for reference only.\n\n| process | after warm-up ({}–{}) | last {} | last ÷ first | peak | restarts | within {:.0}% |\n|---|---:|---:|---:|---:|---:|---|",
        span(o.window / 5),
        span(o.warm_up),
        span(o.warm_up + o.window),
        span(o.window),
        FLAT * 100.0,
    );
    let mib = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.1}"));
    for (name, f) in &flat {
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {:.1} | {} | {} |",
            mib(f.first),
            mib(f.last),
            f.ratio().map_or("—".to_owned(), |r| format!("{r:.2}×")),
            f.peak,
            f.restarts,
            if ours(name) {
                f.flat().map_or("—", yes)
            } else {
                "reference"
            },
        );
    }
    let _ = writeln!(
        out,
        "\n![{}]({plots_dir}/{})",
        plot(outcome).title,
        plot(outcome).file
    );
    out
}

/// `document` with its soak section replaced by `section` (appended when
/// it has none).
pub fn splice(document: &str, section: &str) -> String {
    ccm_bench::splice(document, BEGIN, END, section)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_replaces_the_last_one_and_keeps_the_rest() {
        let doc = "# Benchmarks\n\ntable\n";
        let once = splice(doc, "first\n");
        assert!(once.starts_with("# Benchmarks\n\ntable\n\n"));
        assert!(once.contains("first\n"));
        let twice = splice(&(once + "after\n"), "second\n");
        assert!(!twice.contains("first"));
        assert!(twice.contains("second\n"));
        assert!(twice.ends_with("after\n"));
    }

    #[test]
    fn memory_is_compared_without_the_minutes_after_a_restart() {
        let m = Memory {
            samples: (0..40)
                .map(|i| {
                    (
                        i as f64 / 2.0,
                        if (10..12).contains(&i) { 5.0 } else { 20.0 },
                    )
                })
                .collect(),
            restarts: vec![5.0],
        };
        // Minutes 5 and 5.5 follow the restart and are left out.
        assert_eq!(mean(&m, (4.0, 8.0), 1.0), Some(20.0));
        assert_eq!(mean(&m, (5.0, 6.0), 1.0), None);
        let f = Flatness {
            first: Some(20.0),
            last: Some(21.5),
            peak: 22.0,
            restarts: 1,
        };
        assert_eq!(f.flat(), Some(true));
        assert_eq!(
            Flatness {
                last: Some(23.0),
                ..f
            }
            .flat(),
            Some(false)
        );
    }
}
