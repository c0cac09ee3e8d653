//! The Container Storage Interface (`csi.v1`, vendored verbatim in
//! `third_party/csi/`): what the volume controller serves upstream's
//! sidecars, what the sandbox's simulated node plugin serves, and what the
//! tests call as the sidecars and kubelet would.

#[allow(clippy::all, missing_docs, reason = "generated code")]
mod generated {
    tonic::include_proto!("csi.v1");
}

pub use generated::*;
