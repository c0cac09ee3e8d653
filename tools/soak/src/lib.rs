//! The chaos soak (`make soak`): the sandbox's real processes under
//! continuous churn (nodes joining, stopping, coming back, terminated;
//! LoadBalancer Services created, changed, deleted; node labels changing;
//! kubelets asking for certificates they must not get; another tool asking
//! for load balancers for made-up Services whose UIDs collide with real
//! ones in the load balancer name) and cloud faults
//! (error, throttling and slow-provisioning windows), while a chaos loop
//! at random intervals kills any process with SIGKILL, or freezes it with
//! SIGSTOP for tens of seconds, the API server and the gateway included,
//! and starts it again as a Deployment would.
//!
//! An observer checks the invariants all along, not only at the end, from
//! what the cloud holds (the sim's database, read directly, not through
//! the gateway) and what the API server holds (see [`observer`]). When the
//! chaos stops, every fault is cleared and the run waits for the system to
//! converge, within a stated bound, with nothing leaked. Each process's
//! resident memory is sampled throughout. The report ([`report`]) goes
//! into BENCHMARKS.md.
//!
//! With [`Options::upgrade`] the same machinery runs the version skew
//! test instead of the chaos ([`upgrade`]): the sandbox starts on another
//! release's components and this build replaces them one at a time.

pub mod chaos;
pub mod churn;
pub mod observer;
pub mod report;
pub mod upgrade;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ccm_sandbox::{Options as SandboxOptions, Sandbox};
use tokio_util::sync::CancellationToken;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long the chaos, churn and cloud faults go on.
    pub duration: Duration,
    /// From the start, when memory is first compared (processes have
    /// warmed up).
    pub warm_up: Duration,
    /// The length of each memory window compared: the one after warm-up
    /// and the last one before the chaos stops.
    pub window: Duration,
    /// Nodes and LoadBalancer Services at the start.
    pub nodes: usize,
    pub services: usize,
    /// Between two process faults: a random time in this range.
    pub chaos_every: (Duration, Duration),
    /// How long a frozen process stays frozen: a random time in this range.
    pub freeze_for: (Duration, Duration),
    /// How long a killed process stays dead before it is started again.
    pub dead_for: (Duration, Duration),
    /// Between two churn actions.
    pub churn_every: Duration,
    /// Between the starts of two cloud fault windows, and how long each
    /// lasts.
    pub cloud_fault_every: Duration,
    pub cloud_fault_for: Duration,
    /// How long after the last fault everything must have converged.
    pub converge_within: Duration,
    /// How often memory is sampled.
    pub sample_every: Duration,
    /// Where the sandbox keeps its state and logs.
    pub state_dir: PathBuf,
    /// Where the binaries are.
    pub bin_dir: PathBuf,
    /// The seed of every random choice, so a run can be repeated.
    pub seed: u64,
    /// Instead of the chaos: start on another release's components and
    /// upgrade them to this build's, one process at a time
    /// ([`upgrade`]).
    pub upgrade: Option<upgrade::Upgrade>,
}

/// The kinds of fault and churn, with how many of each happened.
pub type Counts = BTreeMap<String, u64>;

/// Adds one to `kind` in `counts`.
pub fn count(counts: &Mutex<Counts>, kind: impl Into<String>) {
    *counts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(kind.into())
        .or_default() += 1;
}

/// A broken invariant, when it was seen (since the start) and what.
#[derive(Clone, Debug)]
pub struct Violation {
    pub at: Duration,
    pub what: String,
}

/// One process's resident memory over the run: (minutes since the start,
/// MiB), and when it was started again.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    pub samples: Vec<(f64, f64)>,
    pub restarts: Vec<f64>,
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    pub options: Options,
    /// How long the chaos went on.
    pub chaos: Duration,
    pub faults: Counts,
    pub churn: Counts,
    pub violations: Vec<Violation>,
    /// Rounds in which the observer saw both the cloud and the API server.
    pub observed_rounds: u64,
    /// Rounds it could not (the API server or its reads down or frozen).
    pub blind_rounds: u64,
    /// From the last fault cleared to everything converged, if it did
    /// within the bound; else what was still off.
    pub converged: Result<Duration, String>,
    pub memory: BTreeMap<String, Memory>,
}

impl Outcome {
    /// Whether the run met its targets: no violation, and convergence
    /// within the bound.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.converged.is_ok()
    }
}

/// The random choices of a run, from its seed.
pub fn rng(seed: u64, stream: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ stream)
}

/// A random duration in `range`.
pub fn between(rng: &mut fastrand::Rng, (low, high): (Duration, Duration)) -> Duration {
    if high <= low {
        return low;
    }
    low + Duration::from_millis(rng.u64(0..=(high - low).as_millis() as u64))
}

/// Runs the soak.
pub async fn run(options: Options) -> anyhow::Result<Outcome> {
    let sandbox = Sandbox::start(SandboxOptions {
        nodes: options.nodes,
        services: options.services,
        replicas: 2,
        components_dir: options.upgrade.as_ref().map(|u| u.from.clone()),
        ..SandboxOptions::new(options.state_dir.clone(), options.bin_dir.clone())
    })
    .await
    .context("start the sandbox")?;
    sandbox.populate().await.context("populate the sandbox")?;
    let handle = sandbox.handle();
    let cloud_dir = options.state_dir.join("gateway");
    let started = Instant::now();

    // Kubelets heartbeat throughout; they ask for serving certificates.
    let kubelets = tokio::spawn({
        let handle = handle.clone();
        async move {
            loop {
                let _ = handle.heartbeat().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
    let first = observer::wait_converged(&handle, &cloud_dir, Duration::from_secs(180)).await;
    if let Err(off) = first {
        anyhow::bail!("the sandbox never converged before the chaos: {off}");
    }
    tracing::info!("converged; the chaos begins");
    // An upgrade run leaves the objects settled now alone.
    let log = options.state_dir.join("cloud-gateway.log");
    let (spare, settled) = match &options.upgrade {
        Some(_) => {
            // Settled: converged, and the cloud quiet (a host pass may
            // follow the first ensures).
            if !upgrade::quiet(&log, Duration::from_secs(5), Duration::from_secs(60)).await {
                anyhow::bail!("the cloud never went quiet before the upgrade");
            }
            let names = settled_names(&handle).await?;
            let settled = upgrade::Settled::read(&handle, &cloud_dir, names.clone()).await?;
            let audit_from = upgrade::audit_mark(&log);
            let spare = churn::Spare {
                names: Arc::new(names),
                ..Default::default()
            };
            (spare, Some((Arc::new(settled), audit_from)))
        }
        None => (churn::Spare::default(), None),
    };

    let sandbox = Arc::new(tokio::sync::Mutex::new(sandbox));
    let done = CancellationToken::new();
    let chaos_over = CancellationToken::new();
    let violations = Arc::new(Mutex::new(Vec::new()));
    let faults = Arc::new(Mutex::new(Counts::new()));
    let churned = Arc::new(Mutex::new(Counts::new()));
    let memory = Arc::new(Mutex::new(BTreeMap::<String, Memory>::new()));
    let collisions = churn::Collisions::default();

    let observing = tokio::spawn(observer::watch(
        handle.clone(),
        cloud_dir.clone(),
        started,
        collisions.clone(),
        violations.clone(),
        done.clone(),
    ));
    let sampling = tokio::spawn(sample_memory(
        sandbox.clone(),
        started,
        options.sample_every,
        memory.clone(),
        done.clone(),
    ));
    let churning = tokio::spawn(churn::run(
        handle.clone(),
        cloud_dir.clone(),
        options.clone(),
        churned.clone(),
        collisions,
        spare.clone(),
        chaos_over.clone(),
    ));
    let upgrading = match (&options.upgrade, settled) {
        (Some(upgrade), Some((settled, audit_from))) => Some(upgrade::Run {
            sandbox: sandbox.clone(),
            handle: handle.clone(),
            cloud_dir: cloud_dir.clone(),
            new: options.bin_dir.clone(),
            upgrade: upgrade.clone(),
            spare,
            settled,
            started,
            violations: violations.clone(),
            steps: faults.clone(),
            first_records: Default::default(),
            log: log.clone(),
            audit_from,
        }),
        _ => None,
    };
    match &upgrading {
        Some(run) => {
            run.go().await;
            chaos_over.cancel();
            let _ = churning.await;
        }
        None => {
            let clouding = tokio::spawn(chaos::cloud_faults(
                handle.clone(),
                options.clone(),
                faults.clone(),
                chaos_over.clone(),
            ));
            chaos::processes(
                sandbox.clone(),
                options.clone(),
                started,
                faults.clone(),
                memory.clone(),
                tokio::time::sleep(options.duration),
            )
            .await;
            chaos_over.cancel();
            let _ = churning.await;
            let _ = clouding.await;
        }
    }
    let chaos = started.elapsed();
    // Everything back as it should be: faults cleared, frozen processes
    // thawed, dead ones started (the chaos loop leaves none, but a
    // process may have died of its own accord: that shows here).
    chaos::clear_cloud_faults(&handle).await;
    let mut crashed = Vec::new();
    {
        let mut sandbox = sandbox.lock().await;
        for name in sandbox.processes() {
            let _ = sandbox.signal(&name, "CONT");
            if let Ok(Some(status)) = sandbox.exited(&name) {
                // Its log's last lines say why, before a restart adds more.
                let tail = sandbox.log_tail(&name, 15);
                crashed.push(format!(
                    "{name} ({status}) exited by itself; its log ends:\n{tail}"
                ));
                sandbox.restart(&name)?;
            }
        }
    }
    for what in crashed {
        violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Violation {
                at: started.elapsed(),
                what,
            });
    }
    let cleared = Instant::now();
    let converged = observer::wait_converged(&handle, &cloud_dir, options.converge_within).await;
    let converged = match converged {
        Ok(()) => Ok(cleared.elapsed()),
        Err(off) => Err(with_log_lines(off, &*sandbox.lock().await)),
    };
    if let Some(run) = &upgrading {
        run.check_settled()
            .await
            .context("read what the upgrade left")?;
    }
    drop(upgrading);
    done.cancel();
    let observed = observing.await.context("observer")?;
    let _ = sampling.await;
    kubelets.abort();
    if let Ok(sandbox) = Arc::try_unwrap(sandbox) {
        sandbox.into_inner().stop().await;
    }
    let take = |m: &Arc<Mutex<Counts>>| m.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let violations = violations.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let memory = memory.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Outcome {
        options,
        chaos,
        faults: take(&faults),
        churn: take(&churned),
        violations,
        observed_rounds: observed.0,
        blind_rounds: observed.1,
        converged,
        memory,
    })
}

/// What did not converge, with the last lines each process logged of the
/// Nodes named in it: a report read after the run has nothing else.
fn with_log_lines(off: String, sandbox: &Sandbox) -> String {
    let named: Vec<&str> = off
        .split("Node ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    let mut out = off.clone();
    for process in sandbox.processes() {
        let log = sandbox.log_tail(&process, usize::MAX);
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| named.iter().any(|n| l.contains(n)))
            .collect();
        for line in &lines[lines.len().saturating_sub(6)..] {
            let line: String = line.chars().take(300).collect();
            out.push_str(&format!("\n{process}: {line}"));
        }
    }
    out
}

/// The Nodes and LoadBalancer Services there are now.
async fn settled_names(
    handle: &ccm_sandbox::Handle,
) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let client = ccm_runtime::kube::client(Some(&handle.kubeconfig)).await?;
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&Default::default())
        .await?
        .items;
    let services = kube::Api::<k8s_openapi::api::core::v1::Service>::all(client)
        .list(&Default::default())
        .await?
        .items;
    Ok(nodes
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .chain(services.into_iter().filter_map(|s| s.metadata.name))
        .collect())
}

/// Samples each process's resident memory until `done`.
async fn sample_memory(
    sandbox: Arc<tokio::sync::Mutex<Sandbox>>,
    started: Instant,
    every: Duration,
    memory: Arc<Mutex<BTreeMap<String, Memory>>>,
    done: CancellationToken,
) {
    loop {
        let pids: Vec<(String, Option<u32>)> = {
            let sandbox = sandbox.lock().await;
            sandbox
                .processes()
                .into_iter()
                .map(|name| {
                    let pid = sandbox.pid(&name);
                    (name, pid)
                })
                .collect()
        };
        let minutes = started.elapsed().as_secs_f64() / 60.0;
        for (name, pid) in pids {
            if let Some((mib, _)) = pid.and_then(ccm_sandbox::resident_mib) {
                memory
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(name)
                    .or_default()
                    .samples
                    .push((minutes, mib));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = done.cancelled() => return,
        }
    }
}
