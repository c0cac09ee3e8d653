//! Cluster Autoscaler's own clients of its external gRPC cloud provider,
//! generated from upstream's files (see `build.rs`): [`v1_35`] speaks the
//! wire format of release 1.35 on, [`v1_30`] that of every release before
//! (the template an embedded `v1.Node`, durations `metav1.Duration`). A
//! gateway answers both.

/// The 1.35+ wire format.
#[allow(clippy::all, missing_docs, reason = "generated code")]
pub mod v1_35 {
    include!(concat!(
        env!("OUT_DIR"),
        "/v1_35/clusterautoscaler.cloudprovider.v1.externalgrpc.rs"
    ));
}

/// The wire format of releases before 1.35.
#[allow(clippy::all, missing_docs, reason = "generated code")]
pub mod v1_30 {
    include!(concat!(
        env!("OUT_DIR"),
        "/v1_30/clusterautoscaler.cloudprovider.v1.externalgrpc.rs"
    ));
}
