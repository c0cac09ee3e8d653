//! What every process of the cloud controller manager needs, once: logging
//! ([`telemetry`]), the admin HTTP server with `/livez`, `/readyz` and
//! `/metrics` ([`admin`]), graceful shutdown on signals ([`shutdown`]),
//! config layering ([`settings`], [`cli`]), the flags every controller
//! shares ([`args`]), Kubernetes well-known names ([`names`]), the
//! Kubernetes and gateway clients ([`kube`], [`gateway`]), and leader
//! election ([`leader`]). It stays small and boring: nothing here knows what
//! a controller does.

pub mod admin;
pub mod args;
pub mod cli;
pub mod controller;
pub mod gateway;
pub mod kube;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod process;
pub mod queue;
pub mod settings;
pub mod shutdown;
pub mod telemetry;
pub mod watch;
