//! The faults: processes killed or frozen at random ([`processes`]), and
//! windows in which the cloud fails, throttles or provisions slowly
//! ([`cloud_faults`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_proto::v1::Faults;
use ccm_sandbox::{Handle, Sandbox};
use tokio_util::sync::CancellationToken;

use crate::{Counts, Memory, Options, between, count, rng};

/// The component a process is a replica of (`node-controller-1` →
/// `node-controller`), as the fault counts name it.
fn component(process: &str) -> &str {
    process
        .rsplit_once('-')
        .filter(|(_, n)| n.parse::<u32>().is_ok())
        .map_or(process, |(c, _)| c)
}

/// Until `until` resolves, at random intervals: one process is killed
/// (SIGKILL) and started again after a while, or frozen (SIGSTOP) and
/// thawed after tens of seconds. The processes take their turns in rounds,
/// each round in a random order, so every one of them (the API server and
/// the gateway too) is hit once every few faults. A restart is noted in
/// the process's memory record.
pub async fn processes(
    sandbox: Arc<tokio::sync::Mutex<Sandbox>>,
    options: Options,
    started: Instant,
    faults: Arc<Mutex<Counts>>,
    memory: Arc<Mutex<BTreeMap<String, Memory>>>,
    until: impl std::future::Future<Output = ()>,
) {
    let mut rng = rng(options.seed, 1);
    let mut until = std::pin::pin!(until);
    let mut turns: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(between(&mut rng, options.chaos_every)) => {}
            _ = &mut until => return,
        }
        if turns.is_empty() {
            turns = sandbox.lock().await.processes();
            rng.shuffle(&mut turns);
        }
        let Some(name) = turns.pop() else {
            continue;
        };
        if rng.u8(0..10) < 6 {
            tracing::info!(process = %name, "chaos: kill -9");
            if let Err(e) = sandbox.lock().await.kill(&name).await {
                tracing::warn!(process = %name, error = %e, "could not kill");
                continue;
            }
            count(&faults, format!("kill -9 {}", component(&name)));
            tokio::time::sleep(between(&mut rng, options.dead_for)).await;
            if let Err(e) = sandbox.lock().await.restart(&name) {
                tracing::error!(process = %name, error = %e, "could not start it again");
            }
            memory
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(name)
                .or_default()
                .restarts
                .push(started.elapsed().as_secs_f64() / 60.0);
        } else {
            tracing::info!(process = %name, "chaos: SIGSTOP");
            if sandbox.lock().await.signal(&name, "STOP").is_err() {
                continue;
            }
            count(&faults, format!("freeze {}", component(&name)));
            tokio::time::sleep(between(&mut rng, options.freeze_for)).await;
            let _ = sandbox.lock().await.signal(&name, "CONT");
        }
    }
}

/// The cloud's fault windows, one after another until `over`: all calls
/// failing at a share, throttled at a share, or new load balancers
/// provisioned slowly. A gateway started again meanwhile forgets the
/// window (its faults live in its memory), as a cloud's trouble ends.
pub async fn cloud_faults(
    handle: Handle,
    options: Options,
    faults: Arc<Mutex<Counts>>,
    over: CancellationToken,
) {
    let mut rng = rng(options.seed, 2);
    let windows: [(&str, Faults); 3] = [
        (
            "cloud errors (10% of calls)",
            Faults {
                error_rate: 0.1,
                ..Default::default()
            },
        ),
        (
            "cloud throttling (30% of calls)",
            Faults {
                throttle_rate: 0.3,
                ..Default::default()
            },
        ),
        (
            "slow provisioning (10 s)",
            Faults {
                lb_provisioning_delay: Some(prost_duration(Duration::from_secs(10))),
                ..Default::default()
            },
        ),
    ];
    loop {
        tokio::select! {
            _ = tokio::time::sleep(options.cloud_fault_every) => {}
            _ = over.cancelled() => return,
        }
        let (kind, window) = &windows[rng.usize(0..windows.len())];
        if set(&handle, window.clone()).await {
            count(&faults, *kind);
        }
        tokio::select! {
            _ = tokio::time::sleep(options.cloud_fault_for) => {}
            _ = over.cancelled() => return,
        }
        clear_cloud_faults(&handle).await;
    }
}

fn prost_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

async fn set(handle: &Handle, faults: Faults) -> bool {
    let Ok(client) = handle.gateway_client("admin") else {
        return false;
    };
    let Ok(mut admin) = client.sim_admin() else {
        return false;
    };
    let set = admin.set_faults(faults);
    matches!(
        tokio::time::timeout(Duration::from_secs(5), set).await,
        Ok(Ok(_))
    )
}

/// Clears the cloud's faults, trying for a while (the gateway may be
/// frozen or starting).
pub async fn clear_cloud_faults(handle: &Handle) {
    for _ in 0..60 {
        if set(handle, Faults::default()).await {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tracing::warn!("could not clear the cloud's faults");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_counted_by_component() {
        assert_eq!(component("node-controller-1"), "node-controller");
        assert_eq!(component("cloud-gateway"), "cloud-gateway");
        assert_eq!(component("kube-test-apiserver"), "kube-test-apiserver");
    }
}
