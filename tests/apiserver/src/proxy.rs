//! `pods/proxy` and `services/proxy`, as kube-apiserver serves them. A
//! request to `/api/v1/namespaces/NS/pods/ID/proxy/PATH` (or
//! `services/ID/...`), where `ID` is `NAME`, `NAME:PORT` or
//! `SCHEME:NAME:PORT`, goes on to the backend at `/PATH` with the same
//! method, query, headers (less the caller's credentials and hop-by-hop
//! ones) and body; the backend's status, headers and body come back as
//! they are.
//!
//! The backend, found as kube-apiserver finds it:
//! - a pod: its first IP (`status.podIPs[0].ip`, else `status.podIP`) at
//!   `PORT` taken as it is (a number: kube-apiserver looks up no container
//!   port names, so a name fails to dial), else at the first container port
//!   the pod declares, else at 80;
//! - a Service: its `Endpoints` object of the same name, at the endpoint
//!   port named `PORT` (a number is first turned into the name of the
//!   Service port with that number; no `PORT` means the unnamed port), in
//!   the first subset that has that port and an address.
//!
//! Errors are kube-apiserver's: `invalid pod request` (400), the pod,
//! Service or Endpoints not found (404), `address not allowed` for a pod
//! without an IP (400), `no endpoints available for service` (503),
//! `no service port N found` (503), and `error trying to reach service:
//! ...` (503) when the backend cannot be reached, fails or stays silent
//! for [`TIMEOUT`]. `.../proxy` with no path is redirected to `.../proxy/`
//! for GET and HEAD.
//!
//! Unlike kube-apiserver: only `http` backends (`https:` is refused),
//! loopback pod IPs are allowed (tests' backends listen on 127.0.0.1),
//! endpoint addresses are not checked against their pods (`targetRef`),
//! the first subset and address are taken rather than random ones, no
//! `X-Forwarded-*` headers are added and HTML answers' links are not
//! rewritten.

pub(crate) mod upstream;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::resources::{self, Resource};
use super::store::{ApiError, Store};

/// How long a backend has to answer, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// What a proxy request names.
pub(crate) struct Destination<'a> {
    /// `pods` or `services`.
    pub plural: &'static str,
    pub namespace: &'a str,
    /// The name segment as sent: `NAME`, `NAME:PORT` or `SCHEME:NAME:PORT`.
    pub id: &'a str,
    /// The path segments after `proxy`.
    pub rest: &'a [String],
}

/// The RBAC verb of a proxy request: from its method alone, never `list`
/// or `watch`.
pub(crate) fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

/// Forwards one request to the backend `to` names; see the module's doc.
pub(crate) async fn forward(
    store: &Store,
    to: &Destination<'_>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let singular = to.plural.trim_end_matches('s');
    let id = split_id(to.id)
        .ok_or_else(|| ApiError::bad_request(format!("invalid {singular} request {:?}", to.id)))?;
    if id.scheme == "https" {
        return Err(ApiError::bad_request(format!(
            "{:?}: the test API server proxies to http backends only, not https",
            to.id
        )));
    }
    let backend = match to.plural {
        "pods" => pod_backend(store, to.namespace, &id)?,
        "services" => service_backend(store, to.namespace, &id, to.id)?,
        other => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("{other} has no subresource proxy"),
            ));
        }
    };
    if to.rest.is_empty()
        && !uri.path().ends_with('/')
        && matches!(*method, Method::GET | Method::HEAD)
    {
        return Ok(redirect_to_slash(uri));
    }
    let address = backend.address().map_err(unreachable)?;
    let target = forwarded_target(to.rest, uri);
    let request = upstream::Request {
        method: method.as_str(),
        target: &target,
        headers: forwarded_headers(headers),
        body: &body,
    };
    let answer = upstream::exchange(address, &request, TIMEOUT)
        .await
        .map_err(unreachable)?;
    Ok(answer_response(answer, *method == Method::HEAD))
}

fn unavailable(message: String) -> ApiError {
    ApiError::new(503, "ServiceUnavailable", message)
}

fn unreachable(why: String) -> ApiError {
    unavailable(format!("error trying to reach service: {why}"))
}

/// `SCHEME:NAME:PORT` taken apart as kube-apiserver does
/// (`SplitSchemeNamePort`); the scheme and the port may be empty.
#[derive(Debug, PartialEq)]
struct Id<'a> {
    scheme: &'a str,
    name: &'a str,
    port: &'a str,
}

fn split_id(id: &str) -> Option<Id<'_>> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    let known = matches!(scheme, "" | "http" | "https");
    (known && !name.is_empty()).then_some(Id { scheme, name, port })
}

/// Where a request goes. The port stays as written: kube-apiserver hands
/// it to the dialer, which refuses a name.
#[derive(Debug, PartialEq)]
struct Backend {
    ip: IpAddr,
    port: Option<String>,
}

impl Backend {
    /// The address to dial; the error is the dialer's, as Go words it.
    fn address(&self) -> Result<SocketAddr, String> {
        let Some(port) = &self.port else {
            return Ok(SocketAddr::new(self.ip, 80));
        };
        match port.parse::<u16>() {
            Ok(number) => Ok(SocketAddr::new(self.ip, number)),
            Err(_) if port.bytes().all(|b| b.is_ascii_digit()) => {
                Err(format!("dial tcp: address {port}: invalid port"))
            }
            Err(_) => Err(format!("dial tcp: address tcp/{port}: unknown port")),
        }
    }
}

fn core(plural: &str) -> Result<&'static Resource, ApiError> {
    resources::find("", "v1", plural)
        .ok_or_else(|| ApiError::new(404, "NotFound", format!("{plural} are not served")))
}

fn pod_backend(store: &Store, namespace: &str, id: &Id<'_>) -> Result<Backend, ApiError> {
    let pod = store.get(core("pods")?, namespace, id.name)?;
    let port = Some(id.port)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .or_else(|| first_container_port(&pod));
    let ip = pod_ip(&pod).ok_or_else(|| ApiError::bad_request("address not allowed"))?;
    Ok(Backend { ip, port })
}

/// The first port the first container declaring any declares.
fn first_container_port(pod: &Value) -> Option<String> {
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .find_map(|c| c["ports"].as_array()?.first()?["containerPort"].as_i64())
        .map(|port| port.to_string())
}

/// The pod's first IP, if it is one to proxy to.
fn pod_ip(pod: &Value) -> Option<IpAddr> {
    let status = &pod["status"];
    let ip: IpAddr = status["podIPs"][0]["ip"]
        .as_str()
        .or_else(|| status["podIP"].as_str())?
        .parse()
        .ok()?;
    (!ip.is_unspecified() && !ip.is_multicast()).then_some(ip)
}

fn service_backend(
    store: &Store,
    namespace: &str,
    id: &Id<'_>,
    raw_id: &str,
) -> Result<Backend, ApiError> {
    let port_name = match id.port.parse::<i64>() {
        Ok(number) => service_port_name(store, namespace, id.name, number)?,
        Err(_) => id.port.to_owned(),
    };
    let endpoints = store.get(core("endpoints")?, namespace, id.name)?;
    let subsets = endpoints["subsets"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if subsets.is_empty() {
        return Err(unavailable(format!(
            "no endpoints available for service {:?}",
            id.name
        )));
    }
    subsets
        .iter()
        .find_map(|subset| subset_backend(subset, &port_name))
        .ok_or_else(|| unavailable(format!("no endpoints available for service {raw_id:?}")))
}

/// The name of the Service port numbered `number` (empty if unnamed).
fn service_port_name(
    store: &Store,
    namespace: &str,
    name: &str,
    number: i64,
) -> Result<String, ApiError> {
    let service = store.get(core("services")?, namespace, name)?;
    service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_i64() == Some(number))
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .ok_or_else(|| {
            unavailable(format!(
                "no service port {number} found for service {name:?}"
            ))
        })
}

/// The first address of `subset` at its port named `port_name`.
fn subset_backend(subset: &Value, port_name: &str) -> Option<Backend> {
    let port = subset["ports"]
        .as_array()?
        .iter()
        .find(|p| p["name"].as_str().unwrap_or_default() == port_name)?["port"]
        .as_i64()?;
    let ip = subset["addresses"]
        .as_array()?
        .iter()
        .find_map(|a| a["ip"].as_str()?.parse().ok())?;
    Some(Backend {
        ip,
        port: Some(port.to_string()),
    })
}

/// kube-apiserver's answer to `.../proxy` without a path.
fn redirect_to_slash(uri: &Uri) -> Response {
    let location = match uri.query().filter(|q| !q.is_empty()) {
        Some(query) => format!("{}/?{query}", uri.path()),
        None => format!("{}/", uri.path()),
    };
    let mut response = StatusCode::MOVED_PERMANENTLY.into_response();
    if let Ok(location) = HeaderValue::try_from(location) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// The path and query the backend gets: what follows `proxy`, with the
/// request's trailing slash and query.
fn forwarded_target(rest: &[String], uri: &Uri) -> String {
    let mut target = format!("/{}", rest.join("/"));
    if !rest.is_empty() && uri.path().ends_with('/') {
        target.push('/');
    }
    if let Some(query) = uri.query().filter(|q| !q.is_empty()) {
        target.push('?');
        target.push_str(query);
    }
    target
}

/// Headers about one connection rather than the message (RFC 9110
/// §7.6.1), which a proxy does not pass on.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The caller's headers the backend gets: not the hop-by-hop ones, not
/// those the proxy sets itself, and not the caller's credentials, which
/// kube-apiserver drops once it has authenticated the request.
pub(crate) fn forwarded_headers(headers: &HeaderMap) -> Vec<(&str, &[u8])> {
    headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .filter(|(name, _)| {
            !hop_by_hop(name)
                && !matches!(*name, "host" | "content-length" | "authorization")
                && !name.starts_with("impersonate-")
        })
        .collect()
}

/// The backend's answer as the caller gets it. The body is whole, so its
/// length is set anew (kept as sent for HEAD, which has none).
pub(crate) fn answer_response(answer: upstream::Answer, head: bool) -> Response {
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = answer.status;
    for (name, value) in answer.headers {
        let lower = name.to_ascii_lowercase();
        if hop_by_hop(&lower) || (lower == "content-length" && !head) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(lower.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn id(scheme: &'static str, name: &'static str, port: &'static str) -> Id<'static> {
        Id { scheme, name, port }
    }

    #[test]
    fn ids_split_as_kube_apiserver_splits_them() {
        assert_eq!(split_id("web"), Some(id("", "web", "")));
        assert_eq!(split_id("web:8080"), Some(id("", "web", "8080")));
        assert_eq!(split_id("web:"), Some(id("", "web", "")));
        assert_eq!(split_id("http:web:admin"), Some(id("http", "web", "admin")));
        assert_eq!(split_id("https:web:"), Some(id("https", "web", "")));
        for bad in ["", ":80", "ftp:web:80", "a:b:c:d", "http::80"] {
            assert_eq!(split_id(bad), None, "{bad}");
        }
    }

    fn store_with(objects: &[(&str, Value)]) -> Store {
        let store = Store::new(100);
        let namespaces = core("namespaces").unwrap();
        store
            .create(namespaces, "", json!({"metadata": {"name": "ns"}}))
            .unwrap();
        for (plural, obj) in objects {
            store
                .create(core(plural).unwrap(), "ns", obj.clone())
                .unwrap();
        }
        store
    }

    fn backend(ip: &str, port: Option<&str>) -> Backend {
        Backend {
            ip: ip.parse().unwrap(),
            port: port.map(str::to_owned),
        }
    }

    #[test]
    fn a_pod_is_reached_at_its_first_ip_and_the_port_given_or_its_first() {
        let pod = |name: &str, status: Value, containers: Value| {
            (
                "pods",
                json!({"metadata": {"name": name}, "spec": {"containers": containers}, "status": status}),
            )
        };
        let ported = json!([{"name": "a"}, {"name": "b", "ports": [{"name": "admin", "containerPort": 9090}, {"containerPort": 9091}]}]);
        let store = store_with(&[
            pod(
                "two-ips",
                json!({"podIP": "10.0.0.9", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}),
                ported.clone(),
            ),
            pod(
                "old-style",
                json!({"podIP": "127.0.0.1"}),
                json!([{"name": "a"}]),
            ),
            pod("pending", json!({"phase": "Pending"}), ported),
        ]);
        let ask = |name, port| pod_backend(&store, "ns", &id("", name, port));
        assert_eq!(
            ask("two-ips", "").unwrap(),
            backend("10.0.0.1", Some("9090"))
        );
        assert_eq!(
            ask("two-ips", "80").unwrap(),
            backend("10.0.0.1", Some("80"))
        );
        assert_eq!(
            ask("two-ips", "admin").unwrap(),
            backend("10.0.0.1", Some("admin"))
        );
        assert_eq!(ask("old-style", "").unwrap(), backend("127.0.0.1", None));
        let err = ask("pending", "").unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (400, "address not allowed")
        );
        let err = ask("nowhere", "").unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (404, "pods \"nowhere\" not found")
        );
    }

    #[test]
    fn ports_dial_as_numbers_only() {
        assert_eq!(
            backend("10.0.0.1", None).address().unwrap().to_string(),
            "10.0.0.1:80"
        );
        assert_eq!(
            backend("fd00::1", Some("8080"))
                .address()
                .unwrap()
                .to_string(),
            "[fd00::1]:8080"
        );
        assert_eq!(
            backend("10.0.0.1", Some("admin")).address().unwrap_err(),
            "dial tcp: address tcp/admin: unknown port"
        );
        assert_eq!(
            backend("10.0.0.1", Some("70000")).address().unwrap_err(),
            "dial tcp: address 70000: invalid port"
        );
    }

    #[test]
    fn a_service_is_reached_at_its_endpoints_port_of_the_same_name() {
        let service = json!({"metadata": {"name": "gw"}, "spec": {"ports": [
            {"name": "grpc", "port": 443, "targetPort": 50051},
            {"name": "admin", "port": 8080, "targetPort": "admin"},
        ]}});
        let endpoints = json!({"metadata": {"name": "gw"}, "subsets": [
            {"notReadyAddresses": [{"ip": "10.0.0.8"}], "ports": [{"name": "admin", "port": 9999}]},
            {"addresses": [{"ip": "not-an-ip"}, {"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
             "ports": [{"name": "grpc", "port": 50051}, {"name": "admin", "port": 9090}]},
        ]});
        let single = json!({"metadata": {"name": "single"}, "spec": {"ports": [{"port": 80}]}});
        let single_endpoints = json!({"metadata": {"name": "single"}, "subsets": [
            {"addresses": [{"ip": "10.0.0.3"}], "ports": [{"port": 8000}]},
        ]});
        let empty = json!({"metadata": {"name": "empty"}, "spec": {"ports": [{"port": 80}]}});
        let store = store_with(&[
            ("services", service),
            ("endpoints", endpoints),
            ("services", single),
            ("endpoints", single_endpoints),
            ("services", empty.clone()),
            ("endpoints", empty),
            (
                "services",
                json!({"metadata": {"name": "lonely"}, "spec": {"ports": [{"port": 80}]}}),
            ),
        ]);
        let ask = |raw: &str| {
            let parsed = split_id(raw).unwrap();
            service_backend(&store, "ns", &parsed, raw)
        };
        let admin = backend("10.0.0.1", Some("9090"));
        assert_eq!(ask("gw:admin").unwrap(), admin);
        assert_eq!(ask("http:gw:8080").unwrap(), admin);
        assert_eq!(ask("gw:grpc").unwrap(), backend("10.0.0.1", Some("50051")));
        assert_eq!(ask("single").unwrap(), backend("10.0.0.3", Some("8000")));
        assert_eq!(ask("single:80").unwrap(), backend("10.0.0.3", Some("8000")));
        let refused = |raw: &str| {
            let err = ask(raw).unwrap_err();
            (err.code, err.message)
        };
        // Without a port, only an unnamed endpoint port will do.
        assert_eq!(
            refused("gw"),
            (503, "no endpoints available for service \"gw\"".into())
        );
        assert_eq!(
            refused("gw:metrics"),
            (
                503,
                "no endpoints available for service \"gw:metrics\"".into()
            )
        );
        assert_eq!(
            refused("gw:9090"),
            (503, "no service port 9090 found for service \"gw\"".into())
        );
        assert_eq!(
            refused("empty"),
            (503, "no endpoints available for service \"empty\"".into())
        );
        assert_eq!(
            refused("lonely"),
            (404, "endpoints \"lonely\" not found".into())
        );
        assert_eq!(
            refused("nowhere:80"),
            (404, "services \"nowhere\" not found".into())
        );
    }

    #[test]
    fn the_path_after_proxy_is_forwarded_with_its_slash_and_query() {
        let rest = |segs: &[&str]| segs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let uri = |u: &str| u.parse::<Uri>().unwrap();
        let base = "/api/v1/namespaces/ns/pods/p/proxy";
        assert_eq!(forwarded_target(&[], &uri(&format!("{base}/"))), "/");
        assert_eq!(
            forwarded_target(
                &rest(&["debug", "status"]),
                &uri(&format!("{base}/debug/status?key=a%2Fb&x"))
            ),
            "/debug/status?key=a%2Fb&x"
        );
        assert_eq!(
            forwarded_target(&rest(&["ui"]), &uri(&format!("{base}/ui/"))),
            "/ui/"
        );
        let redirect = redirect_to_slash(&uri(&format!("{base}?x=1")));
        assert_eq!(redirect.status(), 301);
        assert_eq!(redirect.headers()[header::LOCATION], format!("{base}/?x=1"));
    }

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_behind() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("authorization", "Bearer secret"),
            ("impersonate-user", "someone"),
            ("connection", "keep-alive"),
            ("host", "apiserver"),
            ("content-length", "2"),
            ("accept", "application/json"),
            ("x-request-id", "42"),
        ] {
            headers.insert(name, value.parse().unwrap());
        }
        let kept: Vec<&str> = forwarded_headers(&headers)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(kept, ["accept", "x-request-id"]);
    }
}
