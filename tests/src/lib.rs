//! Test infrastructure of the cloud controller manager: the Kubernetes API
//! test server ([`apiserver`]), and later the end-to-end scenarios, the
//! local sandbox and the benchmarks.

pub mod apiserver;
pub mod aws;
pub mod bench;
pub mod chart;
pub mod conformance;
pub mod env;
pub mod fixtures;
pub mod gateway;
pub mod kubelet;
pub mod otlp;
pub mod plot;
pub mod sandbox;
pub mod toy;

/// The directory of the workspace's binaries, in this package's integration
/// tests (where Cargo sets `CARGO_BIN_EXE_<name>`): the binaries of every
/// crate of the workspace are built beside the sandbox.
#[macro_export]
macro_rules! bin_dir {
    () => {
        std::path::Path::new(env!("CARGO_BIN_EXE_sandbox"))
            .parent()
            .expect("binaries live in a directory")
            .to_path_buf()
    };
}
