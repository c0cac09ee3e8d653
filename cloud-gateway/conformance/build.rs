//! Generates Cluster Autoscaler's own clients of its external gRPC cloud
//! provider, one per wire format, from upstream's files vendored verbatim
//! in `proto/third_party/externalgrpc/`: the suite asks a gateway as each
//! release asks, never through the gateway's own definition of the
//! protocol. The pre-1.35 file embeds Kubernetes messages, which are
//! mapped to `k8s-pb`'s types (the same messages), so nothing of the
//! Kubernetes API is generated here.

use std::path::PathBuf;

/// `(module, file)`: 1.35 on, and every release before.
const CLIENTS: &[(&str, &str)] = &[
    ("v1_35", "externalgrpc/externalgrpc.proto"),
    ("v1_30", "externalgrpc/v1.30/externalgrpc.proto"),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto/third_party");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for (module, file) in CLIENTS {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
        let descriptors = protox::compile([file], [&root])?;
        let dir = out.join(module);
        std::fs::create_dir_all(&dir)?;
        tonic_prost_build::configure()
            .build_server(false)
            .out_dir(&dir)
            .extern_path(".k8s.io.api", "::k8s_pb::api")
            .extern_path(".k8s.io.apimachinery", "::k8s_pb::apimachinery")
            .compile_fds(descriptors)?;
    }
    Ok(())
}
