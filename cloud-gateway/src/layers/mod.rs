//! The gRPC listener and the tower layers every call passes. Connections:
//! [`request_limits`] caps them, [`tls`] handshakes each (the certificate
//! reloaded from its files) and notes a verified client certificate. Calls,
//! outermost first: [`rpc`] counts each call and answers
//! `DEADLINE_EXCEEDED` at the caller's deadline; [`auth`] names the caller
//! from its client certificate ([`client_certs`]) or its bearer token
//! (static, or a ServiceAccount token checked with TokenReview in
//! [`service_accounts`]) and checks its role; [`request_limits`] admits
//! the request within what one client may make the gateway hold.

pub mod auth;
pub mod client_certs;
pub mod request_limits;
pub mod rpc;
pub mod service_accounts;
pub mod tls;
