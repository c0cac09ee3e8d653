//! The `cloudgateway.v1` contract between the controllers and the
//! cloud-gateway: generated message and service types ([`v1`]), the
//! machine-readable error reasons both sides share ([`reason`]), and the
//! typed client every controller uses ([`GatewayClient`]); and the
//! third-party protocols the gateway also serves: Cluster Autoscaler's
//! external gRPC cloud provider ([`externalgrpc`]); and the Container
//! Storage Interface ([`csi`]) the volume controller serves.

pub mod client;
pub mod codec;
pub mod csi;
pub mod error;
pub mod externalgrpc;
pub mod reason;
mod spans;
pub mod tls;
pub mod v1;

pub use client::{
    AuthorizedChannel, ClientConfig, GatewayClient, Reach, RetryPolicy, TokenSource,
    check_transport,
};
pub use error::{Error, FieldViolation, Result};
pub use spans::CALL_SPANS;

/// The encoded `FileDescriptorSet` of `cloudgateway.v1`, for server
/// reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("cloudgateway_v1_descriptor");

/// The encoded `FileDescriptorSet` of the third-party protocols, for
/// server reflection.
pub const THIRD_PARTY_FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("third_party_descriptor");
