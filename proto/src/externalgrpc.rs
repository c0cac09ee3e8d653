//! Cluster Autoscaler's external gRPC cloud provider protocol
//! (`clusterautoscaler.cloudprovider.v1.externalgrpc`), generated from the
//! upstream file vendored verbatim in `third_party/externalgrpc/`.

#[allow(clippy::all, missing_docs, reason = "generated code")]
mod generated {
    tonic::include_proto!("clusterautoscaler.cloudprovider.v1.externalgrpc");
}

pub use generated::*;
