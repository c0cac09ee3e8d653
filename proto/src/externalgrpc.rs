//! Cluster Autoscaler's external gRPC cloud provider protocol
//! (`clusterautoscaler.cloudprovider.v1.externalgrpc`), as the gateway
//! serves it: generated from `autoscaler/externalgrpc.proto`, which
//! declares the wire formats of releases before 1.35 and of 1.35 on side
//! by side (upstream's own files are vendored verbatim in
//! `third_party/externalgrpc/`).

#[allow(clippy::all, missing_docs, reason = "generated code")]
mod generated {
    tonic::include_proto!("clusterautoscaler.cloudprovider.v1.externalgrpc");
}

pub use generated::*;
