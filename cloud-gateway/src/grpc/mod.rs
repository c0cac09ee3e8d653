//! The gRPC face of the gateway: one service per capability, each checking
//! its request in full ([`validate`]) before anything reaches the cloud,
//! and the metrics layer in front of them all. Auth is a layer too
//! (`crate::auth`). Errors become statuses in one place ([`status`]).

mod convert;
mod instances;
mod load_balancers;
mod provider_info;
mod routes;
mod sim_admin;
pub mod status;
pub mod validate;

pub use instances::InstancesService;
pub use load_balancers::LoadBalancersService;
pub use provider_info::ProviderService;
pub use routes::RoutesService;
pub use sim_admin::SimAdminService;

use crate::identity::Caller;

/// The caller's identity for the audit log; the auth layer put it there.
fn caller_name<T>(request: &tonic::Request<T>) -> String {
    request
        .extensions()
        .get::<Caller>()
        .map_or_else(|| "anonymous".to_owned(), |c| c.name.clone())
}
