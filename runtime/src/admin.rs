//! The admin HTTP server every process runs: `/livez` answers 200 while the
//! process runs, `/readyz` 200 only once the process is ready (caches
//! synced, or for the gateway: the provider answers) and not draining,
//! `/metrics` the process's Prometheus registry in text format, and
//! `/debug/status` and `/debug/object?key=...` what the process tells of
//! its work ([`crate::inspect`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::inspect::Inspection;

/// A shared readiness flag; clones see the same value.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// A flag that starts not ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the process ready or not ready.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AdminState {
    registry: Arc<Registry>,
    readiness: Readiness,
    inspection: Inspection,
}

/// A bound admin server, not yet serving.
pub struct AdminServer {
    listener: TcpListener,
}

impl AdminServer {
    /// Binds the admin address (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        Ok(Self {
            listener: TcpListener::bind(addr).await?,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the task is dropped. It keeps answering while the
    /// process drains, so probes see `/readyz` fail rather than a refused
    /// connection.
    pub async fn serve(
        self,
        registry: Arc<Registry>,
        readiness: Readiness,
        inspection: Inspection,
    ) -> std::io::Result<()> {
        let app = Router::new()
            .route("/livez", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .route("/debug/status", get(debug_status))
            .route("/debug/object", get(debug_object))
            .with_state(AdminState {
                registry,
                readiness,
                inspection,
            });
        axum::serve(self.listener, app).await
    }
}

/// Binds the admin address and serves it in the background; returns the
/// address bound.
pub async fn spawn(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    inspection: Inspection,
) -> std::io::Result<SocketAddr> {
    let server = AdminServer::bind(addr).await?;
    let bound = server.local_addr()?;
    let registry = Arc::new(registry);
    tokio::spawn(async move {
        if let Err(e) = server.serve(registry, readiness, inspection).await {
            tracing::error!(error = %e, "admin server failed");
        }
    });
    Ok(bound)
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn not_yet() -> axum::response::Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the process is still starting\n",
    )
        .into_response()
}

fn json(value: &serde_json::Value) -> axum::response::Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// The `key` parameter of a query string, decoded.
fn key_param(query: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "key")
        .map(|(_, value)| value.into_owned())
}

async fn debug_status(State(state): State<AdminState>) -> axum::response::Response {
    match state.inspection.get() {
        Some(inspect) => json(&inspect.status()),
        None => not_yet(),
    }
}

async fn debug_object(
    State(state): State<AdminState>,
    RawQuery(query): RawQuery,
) -> axum::response::Response {
    let Some(inspect) = state.inspection.get() else {
        return not_yet();
    };
    let Some(key) = query.as_deref().and_then(key_param) else {
        return (StatusCode::BAD_REQUEST, "name the object: ?key=...\n").into_response();
    };
    match inspect.object(&key) {
        Ok(object) => json(&object),
        Err(why) => (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_parameter_is_found_and_decoded() {
        assert_eq!(
            key_param("key=default%2Fweb").as_deref(),
            Some("default/web")
        );
        assert_eq!(key_param("x=1&key=a/b").as_deref(), Some("a/b"));
        assert_eq!(key_param("key=a+b").as_deref(), Some("a b"));
        assert_eq!(key_param("other=1"), None);
    }
}
