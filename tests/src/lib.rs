//! Test infrastructure of the cloud controller manager: the Kubernetes API
//! test server ([`apiserver`]), and later the end-to-end scenarios, the
//! local sandbox and the benchmarks.

pub mod apiserver;
pub mod aws;
pub mod bench;
pub mod chart;
pub mod env;
pub mod fixtures;
pub mod gateway;
pub mod kubelet;
pub mod sandbox;
