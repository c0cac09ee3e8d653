//! Compiles `cloudgateway/v1/*.proto` with protox, a protobuf compiler in
//! Rust, so that a fresh machine builds without a system `protoc`.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &[
    "cloudgateway/v1/common.proto",
    "cloudgateway/v1/provider.proto",
    "cloudgateway/v1/instances.proto",
    "cloudgateway/v1/load_balancers.proto",
    "cloudgateway/v1/routes.proto",
    "cloudgateway/v1/sim_admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
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
    Ok(())
}
