//! The simulated cloud's store in trouble: its directory on a small tmpfs
//! filled up, then read-only. Writes answer UNAVAILABLE with the reason,
//! nothing acknowledged is lost and nothing refused is half-made, and the
//! cloud takes writes again once the disk does, with no restart; a gateway
//! started again on the directory has exactly what was acknowledged.
//!
//! Mounting needs root (CAP_SYS_ADMIN), as `.ci/run` runs.

mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;

use ccm_proto::Error as GatewayError;
use ccm_proto::v1::{Host, LoadBalancerSpec};
use ccm_proto::{GatewayClient, RetryPolicy};
use cloud_gateway::identity::Role;
use harness::TestGateway;

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        mount(
            &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"],
            dir.path(),
        );
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Remounts with `mode`; read-only waits (a few seconds at most) until
    /// the stopped gateway's last task has let go of the database file.
    async fn remount(&self, mode: &str) {
        let args = ["-o".to_owned(), format!("remount,{mode}")];
        for _ in 0..50 {
            let out = Command::new("mount")
                .args(&args)
                .arg(self.path())
                .output()
                .unwrap();
            if out.status.success() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        mount(&["-o", &format!("remount,{mode}")], self.path());
    }

    /// Fills the disk with a file until a write fails for lack of space.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 4096];
        loop {
            match f.write_all(&block) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        let _ = f.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn mount(args: &[&str], dir: &Path) {
    let out = Command::new("mount").args(args).arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "mount {args:?} {} failed (this test needs root, as .ci/run has): {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn spec(n: u32) -> LoadBalancerSpec {
    harness::spec(&harness::uid(n))
}

fn host() -> Vec<Host> {
    vec![harness::host("node-a")]
}

/// The load balancers the cloud has, by the number of their Service's
/// UID (see `spec`).
async fn numbers(lbs: &GatewayClient) -> Vec<u32> {
    let mut numbers: Vec<u32> = lbs
        .list_load_balancers()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|lb| u32::from_str_radix(lb.service?.uid.get(..8)?, 16).ok())
        .collect();
    numbers.sort();
    numbers
}

/// Expects the write refused as UNAVAILABLE naming `why`.
fn refused<T: std::fmt::Debug>(result: Result<T, GatewayError>, why: &str) {
    match result {
        Err(GatewayError::Unavailable { message, .. }) => {
            assert!(message.contains(why), "{message}");
            assert!(message.contains("nothing was changed"), "{message}");
        }
        other => panic!("expected UNAVAILABLE ({why}), got {other:?}"),
    }
}

#[tokio::test]
async fn a_full_or_read_only_disk_refuses_writes_loses_nothing_and_recovers() {
    let disk = SmallDisk::mount("2m");
    let state = disk.path().join("state");
    let gw = TestGateway::start_in(state.clone(), |_| {}).await;
    gw.create_instance("node-a").await;
    // One attempt a call, so each refusal reaches the test as it is.
    let lbs = gw.client_with(Role::Service, RetryPolicy::none(), "kubernetes");
    let first = lbs.ensure_load_balancer(spec(1), host()).await.unwrap();

    // Full: nothing is written, nothing is half-made.
    let filler = disk.fill();
    refused(
        lbs.ensure_load_balancer(spec(2), host()).await,
        "the disk is full",
    );
    refused(
        lbs.update_load_balancer_hosts(spec(1), vec![]).await,
        "the disk is full",
    );
    assert_eq!(numbers(&lbs).await, [1]);

    // Space again: the same calls succeed.
    std::fs::remove_file(&filler).unwrap();
    let second = lbs.ensure_load_balancer(spec(2), host()).await.unwrap();
    assert_ne!(second.ingress[0].ip, first.ingress[0].ip);
    assert_eq!(numbers(&lbs).await, [1, 2]);

    // Read-only (the kernel refuses to make a filesystem read-only under
    // a process writing to it, so as a volume that comes back read-only
    // after a node's trouble: the gateway starts again on it). It serves
    // what it has; neither a new load balancer nor a delete goes through.
    let dir = gw.stop().await;
    disk.remount("ro").await;
    let gw = TestGateway::start_in(dir, |_| {}).await;
    let lbs = gw.client_with(Role::Service, RetryPolicy::none(), "kubernetes");
    assert_eq!(numbers(&lbs).await, [1, 2]);
    refused(lbs.ensure_load_balancer(spec(3), host()).await, "read-only");
    refused(
        lbs.delete_load_balancer(spec(1).service.unwrap()).await,
        "read-only",
    );
    assert_eq!(numbers(&lbs).await, [1, 2]);

    // Writable again, without a restart.
    disk.remount("rw").await;
    let third = lbs.ensure_load_balancer(spec(3), host()).await.unwrap();
    lbs.delete_load_balancer(spec(1).service.unwrap())
        .await
        .unwrap();
    assert_eq!(numbers(&lbs).await, [2, 3]);

    // What was acknowledged is what a restarted gateway finds.
    let dir = gw.stop().await;
    let gw = TestGateway::start_in(dir, |_| {}).await;
    let lbs = gw.client(Role::Service);
    assert_eq!(numbers(&lbs).await, [2, 3]);
    let again = lbs.ensure_load_balancer(spec(3), host()).await.unwrap();
    assert_eq!(again.ingress, third.ingress, "its address kept");
    gw.stop().await;
}
