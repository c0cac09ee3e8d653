//! The gRPC face of the gateway: one service per capability, each checking
//! its request in full ([`validate`]) before anything reaches the cloud,
//! and the metrics layer in front of them all. Auth is a layer too
//! (`crate::layers::auth`). Errors become statuses in one place ([`status`]).

mod autoscaler;
pub mod convert;
mod instances;
mod load_balancers;
mod node_template;
mod provider_info;
mod routes;
mod sim_admin;
pub mod status;
pub mod validate;
mod volumes;

pub use autoscaler::AutoscalerService;
pub use instances::InstancesService;
pub use load_balancers::LoadBalancersService;
pub use provider_info::ProviderService;
pub use routes::RoutesService;
pub use sim_admin::SimAdminService;
pub use volumes::VolumesService;
