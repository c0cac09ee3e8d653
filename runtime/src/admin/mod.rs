//! The admin server every process runs, over HTTPS only, as upstream's
//! controller managers serve their secure port: `/livez` (and `/healthz`)
//! answers 200 while the process runs, `/readyz` 200 only once the process
//! is ready (caches synced, or for the gateway: the provider answers) and
//! not draining; those answer anyone. `/metrics` (the process's Prometheus
//! registry in text format) and `/debug/status` and `/debug/object?key=...`
//! (what the process tells of its work, [`crate::inspect`]) answer only a
//! caller that [`access`] lets in.
//!
//! The certificate comes from files read again while serving, or is made
//! up at start and signed by itself when none is given, as upstream's is.

pub mod access;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use self::access::{Access, Decision};
use crate::config_checks::{Problems, check_file, number_within};
use crate::https::{Peer, TlsListener};
use crate::inspect::Inspection;
use crate::tls::{PemFiles, ServerTls};

/// How often the admin certificate's files are read again.
const TLS_RELOAD: Duration = Duration::from_secs(30);

/// The admin port's flags, shared by every binary.
#[derive(clap::Args, Clone, Debug)]
pub struct AdminArgs {
    /// The admin port's serving certificate (PEM, read again while serving);
    /// without it the port serves a self-signed one, as upstream's do.
    #[arg(long)]
    pub admin_tls_cert: Option<String>,
    /// The admin port's private key (PEM).
    #[arg(long)]
    pub admin_tls_key: Option<String>,
    /// Admin paths that answer anyone, comma-separated (a trailing * makes
    /// a prefix); every other path needs a bearer token the API server
    /// reviews and a grant to get the path.
    #[arg(long, default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: String,
    /// TokenReviews of bearer tokens the admin port has not seen accepted, per second (twice as many in a burst); past it such requests get 429. Callers the API server accepted before are not held to it.
    #[arg(long, default_value = "5")]
    pub admin_token_reviews_per_second: String,
    /// TokenReviews of such tokens in flight at once; past it such requests get 429.
    #[arg(long, default_value = "4")]
    pub admin_token_reviews_in_flight: String,
}

impl Default for AdminArgs {
    fn default() -> Self {
        let limits = access::ReviewLimits::default();
        Self {
            admin_tls_cert: None,
            admin_tls_key: None,
            authorization_always_allow_paths: access::DEFAULT_ALWAYS_ALLOW.join(","),
            admin_token_reviews_per_second: limits.per_second.to_string(),
            admin_token_reviews_in_flight: limits.in_flight.to_string(),
        }
    }
}

/// How the admin port serves, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct AdminSettings {
    /// The certificate and key; `None`: self-signed.
    pub tls: Option<PemFiles>,
    pub always_allow: Vec<String>,
    /// How many reviews of unknown tokens the port may ask for.
    pub reviews: access::ReviewLimits,
}

impl AdminArgs {
    /// Checks every admin flag.
    pub fn resolve(&self, p: &mut Problems) -> Option<AdminSettings> {
        let mut file = |key: &str, value: &Option<String>| {
            let path = value.as_deref()?;
            match check_file(path) {
                Ok(()) => Some(PathBuf::from(path)),
                Err(problem) => {
                    p.push(key, problem);
                    None
                }
            }
        };
        let cert = file("admin-tls-cert", &self.admin_tls_cert);
        let key = file("admin-tls-key", &self.admin_tls_key);
        let per_second = p.parse(
            "admin-token-reviews-per-second",
            &self.admin_token_reviews_per_second,
            number_within(0.1, 10_000.0),
        );
        let in_flight = p.parse(
            "admin-token-reviews-in-flight",
            &self.admin_token_reviews_in_flight,
            number_within(1usize, 1_000),
        );
        let tls = match (&self.admin_tls_cert, &self.admin_tls_key) {
            (None, None) => None,
            (Some(_), Some(_)) => Some(PemFiles {
                cert: cert?,
                key: key?,
                client_ca: None,
            }),
            (Some(_), None) => {
                p.push("admin-tls-key", "is required with --admin-tls-cert");
                return None;
            }
            (None, Some(_)) => {
                p.push("admin-tls-cert", "is required with --admin-tls-key");
                return None;
            }
        };
        let always_allow: Vec<String> = self
            .authorization_always_allow_paths
            .split(',')
            .map(str::trim)
            .filter(|path| !path.is_empty())
            .map(str::to_owned)
            .collect();
        if let Some(bad) = always_allow.iter().find(|path| !path.starts_with('/')) {
            p.push(
                "authorization-always-allow-paths",
                format!("{bad:?} is not a path (they start with /)"),
            );
            return None;
        }
        Some(AdminSettings {
            tls,
            always_allow,
            reviews: access::ReviewLimits {
                per_second: per_second?,
                in_flight: in_flight?,
            },
        })
    }
}

impl AdminSettings {
    /// The TLS configuration: the files, read again every 30 s until
    /// `shutdown`, or a self-signed certificate for this host.
    pub fn server_tls(&self, shutdown: &CancellationToken) -> anyhow::Result<ServerTls> {
        let alpn: &[&[u8]] = &[b"http/1.1"];
        match &self.tls {
            Some(files) => {
                let tls = ServerTls::from_files(files.clone(), alpn)?;
                tls.reload_every(TLS_RELOAD, shutdown.clone());
                Ok(tls)
            }
            None => {
                let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
                if let Ok(host) = std::env::var("POD_NAME").or_else(|_| std::env::var("HOSTNAME")) {
                    names.push(host);
                }
                ServerTls::self_signed(&names, alpn)
            }
        }
    }
}

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

/// How the admin port is secured: its TLS and who may read what.
#[derive(Clone, Debug)]
pub struct Security {
    pub tls: ServerTls,
    pub access: Access,
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
        security: Security,
    ) -> std::io::Result<()> {
        let app = Router::new()
            .route("/livez", get(|| async { "ok\n" }))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .route("/debug/status", get(debug_status))
            .route("/debug/object", get(debug_object))
            .with_state(AdminState {
                registry,
                readiness,
                inspection,
            })
            .layer(axum::middleware::from_fn_with_state(security.access, guard));
        let listener = TlsListener::new(self.listener, security.tls)?;
        axum::serve(listener, app.into_make_service_with_connect_info::<Peer>()).await
    }
}

/// Lets a request through only as its [`Access`] decides.
async fn guard(State(access): State<Access>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match access.decide(request.uri().path(), token).await {
        Decision::Allow => next.run(request).await,
        Decision::Unauthenticated(why) => {
            (StatusCode::UNAUTHORIZED, format!("Unauthorized: {why}\n")).into_response()
        }
        Decision::Forbidden(why) => {
            (StatusCode::FORBIDDEN, format!("forbidden: {why}\n")).into_response()
        }
        Decision::Unavailable(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the caller's credentials could not be checked now: {why}\n"),
        )
            .into_response(),
        Decision::TooManyRequests(why) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            format!("{why}\n"),
        )
            .into_response(),
    }
}

/// Binds the admin address and serves it in the background; returns the
/// address bound.
pub async fn spawn(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    inspection: Inspection,
    security: Security,
) -> std::io::Result<SocketAddr> {
    let server = AdminServer::bind(addr).await?;
    let bound = server.local_addr()?;
    let registry = Arc::new(registry);
    tokio::spawn(async move {
        if let Err(e) = server
            .serve(registry, readiness, inspection, security)
            .await
        {
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

fn not_yet() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the process is still starting\n",
    )
        .into_response()
}

fn json(value: &serde_json::Value) -> Response {
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

async fn debug_status(State(state): State<AdminState>) -> Response {
    match state.inspection.get() {
        Some(inspect) => json(&inspect.status()),
        None => not_yet(),
    }
}

async fn debug_object(State(state): State<AdminState>, RawQuery(query): RawQuery) -> Response {
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
