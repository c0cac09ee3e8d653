//! Generated types and service stubs of `cloudgateway.v1`, and the
//! Kubernetes names of its address types.

#[allow(clippy::all, missing_docs, reason = "generated code")]
mod generated {
    tonic::include_proto!("cloudgateway.v1");
}

pub use generated::*;

impl NodeAddressType {
    /// The Kubernetes name of the address type (`InternalIP`, ...); empty
    /// for an unspecified type.
    pub fn kubernetes_name(self) -> &'static str {
        match self {
            Self::Hostname => "Hostname",
            Self::InternalIp => "InternalIP",
            Self::ExternalIp => "ExternalIP",
            Self::InternalDns => "InternalDNS",
            Self::ExternalDns => "ExternalDNS",
            Self::Unspecified => "",
        }
    }

    /// The address type Kubernetes calls `name`.
    pub fn from_kubernetes_name(name: &str) -> Self {
        [
            Self::Hostname,
            Self::InternalIp,
            Self::ExternalIp,
            Self::InternalDns,
            Self::ExternalDns,
        ]
        .into_iter()
        .find(|t| t.kubernetes_name() == name)
        .unwrap_or(Self::Unspecified)
    }

    /// The Kubernetes name of the wire value `value`.
    pub fn kubernetes_name_of(value: i32) -> &'static str {
        Self::try_from(value)
            .unwrap_or(Self::Unspecified)
            .kubernetes_name()
    }
}
