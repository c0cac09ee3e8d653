//! The diagnostics API, `diagnostics.cloudgateway.io/v1`, served as an
//! aggregated API: kube-apiserver authenticates and authorises the
//! operator with RBAC, then forwards the request here over TLS with its
//! front-proxy client certificate and the user in headers
//! ([`front_proxy`]). No operator credential and no proxying grant is
//! involved, and nothing is answered to a caller that is not the API
//! server.
//!
//! Every replica of every controller serves it (leader or not), so it
//! stays up while any one runs: a replica answers for the whole release by
//! asking each controller's leader and the gateway ([`peers`]). The
//! resources are in [`resources`]. `/healthz`, `/livez` and `/readyz`
//! answer anyone, as upstream's servers do; they tell nothing.

pub mod front_proxy;
pub mod peers;
pub mod resources;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::Listener as _;
use futures::future::join_all;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use self::front_proxy::{FrontProxy, Source};
use self::peers::{Answer, Ask, Peers};
use self::resources::{COMPONENTS, Diagnosis, Kind, SERVICE_DIAGNOSES};
use crate::https::{Peer, TlsListener};
use crate::inspect::Inspection;
use crate::tls::{PemFiles, ServerTls};

/// How often the serving certificate's files are read again.
const TLS_RELOAD: Duration = Duration::from_secs(30);

/// The controllers, as their Leases name them.
pub const CONTROLLERS: [&str; 3] = ["node-controller", "service-controller", "route-controller"];

/// How the diagnostics API is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub listen: SocketAddr,
    /// The serving certificate and key (read again while serving).
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The request-header CA file and allowed names; `None`: both from
    /// kube-apiserver's ConfigMap.
    pub request_header: Option<(PathBuf, Vec<String>)>,
    /// The base of the release's object names.
    pub release: String,
    /// The release's namespace.
    pub namespace: String,
    /// The CA bundle that signed the leaders' and the gateway's admin
    /// certificates; without it no peer is asked (its certificate cannot
    /// be verified, and it would be sent this process's token).
    pub peer_ca: Option<PathBuf>,
    /// The token shown to the peers, bound to
    /// [`crate::admin::access::PEER_AUDIENCE`] (read at each use); with
    /// `peer_ca`.
    pub peer_token: Option<PathBuf>,
    /// The CA bundle the gateway's certificate is verified by (its gRPC
    /// one, which serves its admin port too).
    pub gateway_ca: Option<PathBuf>,
}

#[derive(Clone)]
struct Served {
    front_proxy: FrontProxy,
    peers: Peers,
}

/// Serves the diagnostics API in the background until `shutdown`; returns
/// the address bound. `identity` is this process's Lease identity and
/// `own` what it tells of its work.
pub async fn spawn(
    settings: &Settings,
    client: kube::Client,
    identity: String,
    own: Inspection,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let front_proxy = FrontProxy::new();
    let source = match &settings.request_header {
        Some((ca, allowed_names)) => Source::File {
            ca: ca.clone(),
            allowed_names: allowed_names.clone(),
        },
        None => Source::ConfigMap(client.clone()),
    };
    front_proxy.follow(source, shutdown.clone());
    let files = PemFiles {
        cert: settings.cert.clone(),
        key: settings.key.clone(),
        client_ca: None,
    };
    let tls = ServerTls::from_files_verifying(files, front_proxy.verifier(), &[b"http/1.1"])
        .context("the diagnostics API's certificate")?;
    tls.reload_every(TLS_RELOAD, shutdown.clone());
    let tcp = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("bind the diagnostics API on {}", settings.listen))?;
    let listener = TlsListener::new(tcp, tls)?;
    let bound = listener.local_addr()?.remote;
    let peers = Peers::new(
        client,
        settings.namespace.clone(),
        settings.release.clone(),
        peers::Trust {
            ca: settings.peer_ca.clone(),
            gateway_ca: settings.gateway_ca.clone(),
            token: settings.peer_token.clone(),
        },
        identity,
        own,
    );
    let app = router(Served { front_proxy, peers });
    tokio::spawn(async move {
        let served = axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
            .with_graceful_shutdown(async move { shutdown.cancelled().await });
        if let Err(e) = served.await {
            tracing::error!(error = %e, "diagnostics API failed");
        }
    });
    Ok(bound)
}

fn router(served: Served) -> Router {
    let ok = || async { "ok\n" };
    Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(ok))
        .fallback(api)
        .with_state(served)
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn failure(code: StatusCode, reason: &str, message: &str) -> Response {
    json_response(code, &resources::status(code.as_u16(), reason, message))
}

/// Everything but the health paths: the front proxy's requests only.
async fn api(
    State(served): State<Served>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let user = match served.front_proxy.authenticate(&peer, &headers) {
        Ok(user) => user,
        Err(why) => {
            tracing::debug!(remote = %peer.remote, why, "diagnostics request refused");
            return failure(StatusCode::UNAUTHORIZED, "Unauthorized", &why);
        }
    };
    if method != Method::GET {
        return failure(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            &format!("{method} is not supported: the diagnostics API is read-only"),
        );
    }
    if uri.query().is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "watch" && v != "false")
    }) {
        return failure(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "watch is not supported: the diagnostics API answers each question when asked",
        );
    }
    tracing::debug!(user = %user.name, path = %uri.path(), "diagnostics request");
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .unwrap_or_default();
    let segments: Vec<&str> = uri
        .path()
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segments.as_slice() {
        ["apis"] => json_response(StatusCode::OK, &resources::api_group_list()),
        ["apis", resources::GROUP] => json_response(StatusCode::OK, &resources::api_group()),
        ["apis", resources::GROUP, resources::VERSION] => {
            json_response(StatusCode::OK, &resources::api_resource_list())
        }
        ["apis", resources::GROUP, resources::VERSION, rest @ ..] => {
            let Some(request) = Request::parse(rest) else {
                return not_found(uri.path());
            };
            match answer(&served.peers, &request).await {
                Ok(Found::One(object)) if resources::wants_table(accept) => json_response(
                    StatusCode::OK,
                    &resources::table(request.kind, std::slice::from_ref(&object)),
                ),
                Ok(Found::One(object)) => json_response(StatusCode::OK, &object),
                Ok(Found::Many(items)) if resources::wants_table(accept) => {
                    json_response(StatusCode::OK, &resources::table(request.kind, &items))
                }
                Ok(Found::Many(items)) => {
                    json_response(StatusCode::OK, &resources::list(request.kind, items))
                }
                Err(response) => response,
            }
        }
        _ => not_found(uri.path()),
    }
}

fn not_found(path: &str) -> Response {
    failure(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("the server could not find the requested resource ({path})"),
    )
}

/// A resource request: the kind, the namespace (for a namespaced kind:
/// `None` means all namespaces) and the name (`None`: a list).
#[derive(Debug, PartialEq, Eq)]
struct Request {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
}

impl Request {
    fn parse(rest: &[&str]) -> Option<Self> {
        let kind = |plural: &str| resources::KINDS.into_iter().find(|k| k.plural == plural);
        let (namespace, plural, name) = match rest {
            ["namespaces", ns, plural] => (Some(*ns), *plural, None),
            ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
            [plural] => (None, *plural, None),
            [plural, name] => (None, *plural, Some(*name)),
            _ => return None,
        };
        let kind = kind(plural)?;
        // A namespaced kind's single object is named in its namespace; a
        // cluster-scoped kind has none.
        if kind.namespaced != namespace.is_some() && (name.is_some() || !kind.namespaced) {
            return None;
        }
        Some(Self {
            kind,
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
        })
    }
}

enum Found {
    One(Value),
    Many(Vec<Value>),
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

async fn answer(peers: &Peers, request: &Request) -> Result<Found, Response> {
    match request.kind {
        k if k == COMPONENTS => components(peers, request).await,
        k if k == SERVICE_DIAGNOSES => diagnoses(peers, request, "service-controller").await,
        _ => diagnoses(peers, request, "node-controller").await,
    }
}

async fn components(peers: &Peers, request: &Request) -> Result<Found, Response> {
    let in_release = request
        .namespace
        .as_deref()
        .is_none_or(|ns| ns == peers.namespace);
    let names: Vec<&str> = CONTROLLERS.into_iter().chain(["gateway"]).collect();
    let wanted: Vec<&str> = match &request.name {
        Some(name) if in_release && names.contains(&name.as_str()) => vec![name.as_str()],
        Some(name) => {
            return Err(failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!(
                    "components.{} {name:?} not found: the release's components are {} in namespace {}",
                    resources::GROUP,
                    names.join(", "),
                    peers.namespace
                ),
            ));
        }
        None if in_release => names,
        None => Vec::new(),
    };
    let now = &now();
    let items = join_all(wanted.into_iter().map(|name| async move {
        if name == "gateway" {
            let status = peers.from_gateway(&Ask::Status).await;
            resources::component(
                name,
                &peers.namespace,
                peers.own_identity(),
                None,
                &status,
                now,
            )
        } else {
            let leader = peers.leader(name).await;
            let status = peers.from_leader(&leader, &Ask::Status).await;
            resources::component(
                name,
                &peers.namespace,
                peers.own_identity(),
                Some(&leader),
                &status,
                now,
            )
        }
    }))
    .await;
    Ok(match request.name {
        Some(_) => Found::One(items.into_iter().next().unwrap_or_default()),
        None => Found::Many(items),
    })
}

/// A key as the controller writes it, and the gateway's name of the
/// object, for `name` in `namespace`.
fn keys(kind: Kind, namespace: Option<&str>, name: &str) -> (String, String) {
    match namespace {
        Some(ns) if kind.namespaced => (format!("{ns}/{name}"), format!("service/{ns}/{name}")),
        _ => (name.to_owned(), format!("node/{name}")),
    }
}

async fn diagnoses(peers: &Peers, request: &Request, controller: &str) -> Result<Found, Response> {
    let leader = peers.leader(controller).await;
    let (status, gateway) = tokio::join!(
        peers.from_leader(&leader, &Ask::Status),
        peers.from_gateway(&Ask::Status)
    );
    let now = now();
    let one = |namespace: Option<String>, name: String| {
        let (leader, status, gateway, now) = (&leader, &status, &gateway, &now);
        async move {
            let (key, object) = keys(request.kind, namespace.as_deref(), &name);
            let (key, object) = (Ask::Object(key), Ask::Object(object));
            let (queue, calls) =
                tokio::join!(peers.from_leader(leader, &key), peers.from_gateway(&object));
            Diagnosis {
                kind: request.kind,
                name: &name,
                namespace: namespace.as_deref(),
                served_by: peers.own_identity(),
                leader,
                controller: status,
                object: &queue,
                gateway,
                gateway_calls: &calls,
            }
            .to_json(now)
        }
    };
    if let Some(name) = &request.name {
        return Ok(Found::One(
            one(request.namespace.clone(), name.clone()).await,
        ));
    }
    let listed = troubled(&status, request.kind, request.namespace.as_deref())
        .map_err(|why| failure(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", &why))?;
    let items = join_all(listed.into_iter().map(|(ns, name)| one(ns, name))).await;
    Ok(Found::Many(items))
}

/// The objects in trouble that a leader's status lists, in `namespace`
/// when given; an error when the leader did not answer (a list cannot be
/// made then).
fn troubled(
    status: &Answer,
    kind: Kind,
    namespace: Option<&str>,
) -> Result<Vec<(Option<String>, String)>, String> {
    let status = status
        .as_ref()
        .map_err(|why| format!("the controller's leader did not answer: {why}"))?;
    let keys = status["troubled"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["key"].as_str());
    Ok(keys
        .filter_map(|key| {
            if kind.namespaced {
                let (ns, name) = key.split_once('/')?;
                namespace
                    .is_none_or(|wanted| wanted == ns)
                    .then(|| (Some(ns.to_owned()), name.to_owned()))
            } else {
                Some((None, key.to_owned()))
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    use self::resources::NODE_DIAGNOSES;

    #[test]
    fn paths_name_resources_as_kube_does() {
        let parse = |p: &str| Request::parse(&p.split('/').collect::<Vec<_>>());
        let svc = parse("namespaces/default/servicediagnoses/web").unwrap();
        assert_eq!(svc.kind, SERVICE_DIAGNOSES);
        assert_eq!(svc.namespace.as_deref(), Some("default"));
        assert_eq!(svc.name.as_deref(), Some("web"));
        assert!(
            parse("servicediagnoses").unwrap().namespace.is_none(),
            "all namespaces"
        );
        assert!(
            parse("servicediagnoses/web").is_none(),
            "a namespaced object needs its namespace"
        );
        assert_eq!(parse("nodediagnoses/n1").unwrap().kind, NODE_DIAGNOSES);
        assert!(parse("namespaces/default/nodediagnoses/n1").is_none());
        assert!(parse("namespaces/default/nodediagnoses").is_none());
        assert!(parse("widgets").is_none());
    }

    #[test]
    fn a_list_holds_the_troubled_keys_of_the_namespace_asked() {
        let status: Answer = Ok(serde_json::json!({"troubled": [
            {"key": "default/web"}, {"key": "shop/cart"}, {"key": "default/api"}
        ]}));
        let default = troubled(&status, SERVICE_DIAGNOSES, Some("default")).unwrap();
        assert_eq!(
            default,
            [
                (Some("default".into()), "web".into()),
                (Some("default".into()), "api".into())
            ]
        );
        assert_eq!(troubled(&status, SERVICE_DIAGNOSES, None).unwrap().len(), 3);
        assert!(troubled(&Err("down".into()), NODE_DIAGNOSES, None).is_err());
    }
}
