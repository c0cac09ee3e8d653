//! What serving CSI on a unix socket takes, for the volume controller and
//! for the sandbox's simulated node plugin alike: the socket itself, and
//! one call at a time per volume, the rest `ABORTED` as the CSI spec asks.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context as _;
use tokio::net::UnixListener;
use tonic::Status;

/// Binds the socket at `path`, replacing one a previous run left (never
/// another kind of file) and making its directory; only its user and
/// group may connect (the pod's containers share its group).
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        anyhow::ensure!(
            meta.file_type().is_socket(),
            "{} exists and is not a socket; not replacing it",
            path.display()
        );
        std::fs::remove_file(path).with_context(|| format!("remove {}", path.display()))?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("restrict {}", path.display()))?;
    Ok(listener)
}

/// The keys (volume names or IDs) with a call in flight.
#[derive(Debug, Default)]
pub struct OneCallEach(Mutex<BTreeSet<String>>);

impl OneCallEach {
    /// Holds `key` until the guard is dropped; `ABORTED` while another
    /// call holds it, so the caller retries once that one is done.
    pub fn hold(&self, key: &str) -> Result<Held<'_>, Status> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !held.insert(key.to_owned()) {
            return Err(Status::aborted(format!(
                "an operation on {key} is already in progress"
            )));
        }
        Ok(Held {
            calls: self,
            key: key.to_owned(),
        })
    }
}

/// A call in flight for one key.
#[derive(Debug)]
pub struct Held<'a> {
    calls: &'a OneCallEach,
    key: String,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.calls
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_call_for_a_key_is_aborted_until_the_first_is_done() {
        let calls = OneCallEach::default();
        let first = calls.hold("vol-1").unwrap();
        assert_eq!(
            calls.hold("vol-1").unwrap_err().code(),
            tonic::Code::Aborted
        );
        let other = calls.hold("vol-2").unwrap();
        drop(first);
        drop(calls.hold("vol-1").unwrap());
        drop(other);
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_another_file_is_not() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi/csi.sock");
        drop(bind(&socket).unwrap());
        let listener = bind(&socket).unwrap();
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660);
        drop(listener);
        let file = dir.path().join("not-a-socket");
        std::fs::write(&file, "data").unwrap();
        let why = bind(&file).unwrap_err().to_string();
        assert!(why.contains("not a socket"), "{why}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");
    }
}
