//! Who a caller is and what its role lets it call: the identity the
//! authentication layer puts into every request, read by the request
//! limits (a share per caller) and the audit log.

use std::str::FromStr;

/// What a caller may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The node controller: instance lookups.
    Node,
    /// The service controller: load balancers.
    Service,
    /// The route controller: routes.
    Route,
    /// Cluster Autoscaler: its external gRPC cloud provider (node groups).
    Autoscaler,
    /// The volume controller: volumes and snapshots.
    Volume,
    /// People and tests: everything, including SimAdmin.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 6] = [
        Role::Admin,
        Role::Node,
        Role::Service,
        Role::Route,
        Role::Autoscaler,
        Role::Volume,
    ];

    /// The role's name in the tokens file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Service => "service",
            Self::Route => "route",
            Self::Autoscaler => "autoscaler",
            Self::Volume => "volume",
            Self::Admin => "admin",
        }
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!("unknown role {s:?}; use admin, node, service, route, autoscaler or volume")
            })
    }
}

/// The authenticated caller, put into each request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The identity, for logs and the audit trail.
    pub name: String,
    /// Its role.
    pub role: Role,
}

impl Caller {
    /// The name of a request's caller for the audit log (the auth layer put
    /// the caller there), or `anonymous`.
    pub fn name_of<T>(request: &tonic::Request<T>) -> String {
        request
            .extensions()
            .get::<Caller>()
            .map_or_else(|| "anonymous".to_owned(), |c| c.name.clone())
    }
}

/// Which roles may call a gRPC path; `None` means no token is needed.
pub fn allowed_roles(path: &str) -> Option<&'static [Role]> {
    const ANY: &[Role] = &Role::ALL;
    let service = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    Some(match service {
        "grpc.health.v1.Health"
        | "grpc.reflection.v1.ServerReflection"
        | "grpc.reflection.v1alpha.ServerReflection" => return None,
        "cloudgateway.v1.Provider" => ANY,
        "cloudgateway.v1.Instances" => &[Role::Node, Role::Admin],
        "cloudgateway.v1.LoadBalancers" => &[Role::Service, Role::Admin],
        "cloudgateway.v1.Routes" => &[Role::Route, Role::Admin],
        "cloudgateway.v1.Volumes" => &[Role::Volume, Role::Admin],
        "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider" => {
            &[Role::Autoscaler, Role::Admin]
        }
        // SimAdmin and anything unknown: admins only, who then get
        // UNIMPLEMENTED for a path that does not exist.
        _ => &[Role::Admin],
    })
}
