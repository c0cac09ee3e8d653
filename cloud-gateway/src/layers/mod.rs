//! The tower layers every gRPC call passes, outermost first: [`rpc`]
//! counts each call and answers `DEADLINE_EXCEEDED` at the caller's
//! deadline; [`auth`] names the caller from its bearer token (static, or a
//! ServiceAccount token checked with TokenReview in [`service_accounts`])
//! and checks its role; [`request_limits`] admits the request within what
//! one client may make the gateway hold, and owns the connection listener
//! with its cap.

pub mod auth;
pub mod request_limits;
pub mod rpc;
pub mod service_accounts;
