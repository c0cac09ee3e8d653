//! The volume controller's flags: the shared ones, and the socket the
//! sidecars reach it on, by the sidecars' own flag name.

use std::path::PathBuf;

use ccm_runtime::common_args::{Common, CommonArgs};
use ccm_runtime::config_checks::Problems;
use clap::Parser;

/// The lease name the shared flags require; the volume controller holds
/// none (see [`Settings::from_args`]).
const LEASE: &str = "ccm-volume-controller";

/// Serves CSI's Identity and Controller services to upstream's sidecars
/// on a unix socket, and forwards every call to the cloud gateway: the pod
/// holds no cloud credentials.
#[derive(Parser, Debug)]
#[command(name = "volume-controller", version = ccm_runtime::version::LONG, args_override_self = true)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The unix socket to serve CSI on, shared with the sidecars (their --csi-address): unix:///path or /path.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///run/csi/socket")]
    pub csi_address: String,
}

/// The checked settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub common: Common,
    /// The socket's path.
    pub csi_socket: PathBuf,
}

impl Settings {
    /// Checks every flag; all problems are reported together.
    ///
    /// Every replica serves the sidecars of its own pod, which elect their
    /// own leaders, so the controller holds no lease: the shared
    /// leader-election flags are accepted and have no effect.
    pub fn from_args(args: &Args) -> Result<Self, Problems> {
        let mut p = Problems::new();
        let common = args.common.resolve(&mut p, "0.0.0.0:7441", LEASE);
        let csi_socket = p.parse("csi-address", &args.csi_address, parse_csi_address);
        p.finish(|| {
            let mut common = common.expect("checked");
            common.lease.enabled = false;
            Settings {
                common,
                csi_socket: csi_socket.expect("checked"),
            }
        })
    }
}

/// `unix:///path` or `/path`: the sidecars reach a driver over a unix
/// socket only.
fn parse_csi_address(address: &str) -> Result<PathBuf, String> {
    let path = address.strip_prefix("unix://").unwrap_or(address);
    if !path.starts_with('/') {
        return Err(format!(
            "{address:?}: use unix:///absolute/path (the sidecars reach a driver over a unix socket only)"
        ));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_a_unix_path_and_nothing_else() {
        assert_eq!(
            parse_csi_address("unix:///run/csi/socket").unwrap(),
            PathBuf::from("/run/csi/socket")
        );
        assert_eq!(
            parse_csi_address("/tmp/csi.sock").unwrap(),
            PathBuf::from("/tmp/csi.sock")
        );
        for bad in [
            "tcp://127.0.0.1:10000",
            "dns:///localhost:1",
            "relative/socket",
        ] {
            let why = parse_csi_address(bad).unwrap_err();
            assert!(why.contains("unix socket only"), "{bad}: {why}");
        }
    }
}
