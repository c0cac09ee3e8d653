//! Compiles `cloudgateway/v1/*.proto`, and the third-party protocols the
//! gateway also serves (Cluster Autoscaler's, in `autoscaler/`), with
//! protox, a protobuf compiler in Rust, so that a fresh machine builds
//! without a system `protoc`.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &[
    "cloudgateway/v1/common.proto",
    "cloudgateway/v1/provider.proto",
    "cloudgateway/v1/instances.proto",
    "cloudgateway/v1/load_balancers.proto",
    "cloudgateway/v1/routes.proto",
    "cloudgateway/v1/volumes.proto",
    "cloudgateway/v1/sim_admin.proto",
];

/// Third-party protocols, as the gateway serves them (each file says how
/// it relates to its owners' copies in `third_party/`): compiled with
/// tonic's own codec, which skips unknown fields as their owners' clients
/// expect.
const THIRD_PARTY: &[&str] = &["autoscaler/externalgrpc.proto"];

/// The Container Storage Interface, verbatim from its owners
/// (`third_party/csi/README.md`): served by the volume controller and the
/// sandbox's simulated node plugin, called by the tests.
const CSI: &str = "third_party/csi/csi.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS.iter().chain(THIRD_PARTY).chain([&CSI]) {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Server reflection serves this set; `compile_fds` does not write it.
    std::fs::write(
        out_dir.join("cloudgateway_v1_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::StrictCodec")
        .compile_fds(descriptors)?;
    let third_party = protox::compile(THIRD_PARTY, ["."])?;
    std::fs::write(
        out_dir.join("third_party_descriptor.bin"),
        third_party.encode_to_vec(),
    )?;
    tonic_prost_build::configure().compile_fds(third_party)?;
    let csi = protox::compile([CSI], ["."])?;
    tonic_prost_build::configure().compile_fds(csi)?;
    Ok(())
}
