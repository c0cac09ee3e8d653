//! Compiles the Kubernetes API's own protos (vendored in
//! `proto/third_party/k8s.io`) into a descriptor set, with protox (no
//! system `protoc`): the server decodes protobuf request bodies of every
//! built-in kind it serves with it (see `protobuf`).

use std::path::PathBuf;

use prost::Message;

/// The API groups whose kinds the server decodes from protobuf.
const PROTOS: &[&str] = &[
    "k8s.io/api/core/v1/generated.proto",
    "k8s.io/api/apps/v1/generated.proto",
    "k8s.io/api/batch/v1/generated.proto",
    "k8s.io/api/policy/v1/generated.proto",
    "k8s.io/api/storage/v1/generated.proto",
    "k8s.io/api/rbac/v1/generated.proto",
    "k8s.io/api/coordination/v1/generated.proto",
    "k8s.io/api/events/v1/generated.proto",
    "k8s.io/api/discovery/v1/generated.proto",
    "k8s.io/api/certificates/v1/generated.proto",
    "k8s.io/api/authentication/v1/generated.proto",
    "k8s.io/api/authorization/v1/generated.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto/third_party");
    println!("cargo:rerun-if-changed={}", root.join("k8s.io").display());
    let descriptors = protox::compile(PROTOS, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("k8s_descriptor.bin");
    std::fs::write(out, descriptors.encode_to_vec())?;
    Ok(())
}
