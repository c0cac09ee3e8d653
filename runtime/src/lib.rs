//! What every process of the cloud controller manager needs, once: logging
//! ([`telemetry`]), the admin HTTP server with `/livez`, `/readyz` and
//! `/metrics` ([`admin`]), graceful shutdown on signals ([`shutdown`]),
//! config layering ([`layered_config`]) and checking ([`config_checks`]),
//! secrets written for their owner only ([`files`]),
//! the flags every controller shares ([`common_args`]), the start-up,
//! leading and failure handling every controller shares ([`controller`]),
//! Kubernetes well-known names ([`names`]), the Kubernetes and gateway
//! clients ([`kube`], [`gateway`]), leader election ([`leader`]), and the
//! caches of watched objects, whole ([`watch`]) or as each controller's
//! compact views ([`view`]), and TLS for servers with certificates reloaded
//! from their files ([`tls`]), and which release a process is
//! ([`version`]). It stays small and boring: nothing here knows
//! what a controller does.

pub mod admin;
pub mod common_args;
pub mod config_checks;
pub mod controller;
pub mod diagnostics;
pub mod files;
pub mod gateway;
pub mod https;
pub mod inspect;
pub mod kube;
pub mod layered_config;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod process;
pub mod queue;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
pub mod version;
pub mod view;
pub mod watch;
/// The cloud's limits on a load balancer's hosts, as the gateway states them.
pub use ccm_values::host_limits;
