//! What every process of the cloud controller manager needs, once: logging
//! ([`telemetry`]), the admin HTTP server with `/livez`, `/readyz` and
//! `/metrics` ([`admin`]), graceful shutdown on signals ([`shutdown`]), and
//! layering of config file, environment and flags ([`settings`]). It stays
//! small and boring: nothing here knows about clouds or controllers.

pub mod admin;
pub mod settings;
pub mod shutdown;
pub mod telemetry;
