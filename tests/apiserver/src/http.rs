//! The HTTP face of the test server: discovery, the resource verbs, the
//! four patch types, watches, TokenReview, `proxy` (see `proxy`), and the
//! API groups other servers serve (see `aggregation`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::aggregation;
use super::evictions;
use super::patch::strategic_merge;
use super::pki;
use super::protobuf;
use super::proxy;
use super::rbac;
use super::resources::{self, RESOURCES, Resource};
use super::reviews;
use super::schema::{self, FieldValidation};
use super::selectors::Selector;
use super::store::{ApiError, Change, ChangeType, Store};
use super::table;
use super::tokens;
use super::{Shared, TokenUser};
use ccm_runtime::https::Peer;

fn json_response(code: u16, body: &impl serde::Serialize) -> Response {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(body).expect("a response is JSON"),
    )
        .into_response()
}

/// `work` on a blocking thread. kube-apiserver's goroutines are preempted;
/// a task is not, and watches waiting on its thread stall behind it (a
/// 10,000-node join's progress list held them half a second), so work
/// that grows with the store (a list, a bulk create) is done here.
async fn off_async<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.code, &self.to_status())
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query's parameters, decoded.
pub(crate) fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

struct Target {
    resource: &'static Resource,
    namespace: Option<String>,
    /// The name as the path spells it: for `proxy`, with the scheme and
    /// port it may carry (`http:NAME:PORT`), as kube-apiserver authorizes.
    name: Option<String>,
    sub: Option<String>,
    /// The segments after the subresource: the path `proxy` forwards.
    rest: Vec<String>,
}

fn target(group: &str, version: &str, segs: &[&str]) -> Option<Target> {
    let namespaced = segs.len() >= 3
        && segs[0] == "namespaces"
        && resources::find(group, version, segs[2]).is_some_and(|r| r.namespaced);
    // `object`: the name, the subresource and what follows.
    let (namespace, plural, object) = match segs {
        [_, ns, plural, object @ ..] if namespaced => (Some(ns.to_string()), *plural, object),
        [plural, object @ ..] => (None, *plural, object),
        [] => return None,
    };
    let resource = resources::find(group, version, plural)?;
    Some(Target {
        resource,
        namespace,
        name: object.first().map(|s| s.to_string()),
        sub: object.get(1).map(|s| s.to_string()),
        rest: object.iter().skip(2).map(|s| s.to_string()).collect(),
    })
}

/// Every request lands here.
pub async fn handle(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // Verified against the cluster CA in the handshake.
    let cert = peer.client_cert.as_deref().and_then(pki::client_user);
    let cert = cert.as_ref();
    let path = uri.path().trim_end_matches('/');
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let ["apis", group, version, rest @ ..] = segs.as_slice()
        && let Some(api_service) = aggregation::remote(&shared.store, group, version)
    {
        let to = aggregation::Destination {
            api_service: &api_service,
            group,
            version,
            rest,
        };
        let response = aggregation::forward(&shared, &to, &method, &uri, &headers, cert, body)
            .await
            .unwrap_or_else(IntoResponse::into_response);
        return match aggregation::counted_as(&to, &method, &uri) {
            Some(what) => {
                shared
                    .accounting
                    .count(&shared.user_name(&headers, cert), what, response)
            }
            None => response,
        };
    }
    // The test server's own endpoints (faults, bulk creation, the RBAC
    // report): as kube-apiserver's /debug/*, a non-resource URL someone
    // must be granted once RBAC is on (system:masters is).
    if let ["debug", ..] = segs.as_slice()
        && let Err(refused) = shared.caller(&headers, cert).and_then(|user| {
            shared.authorize(
                user.as_ref(),
                &rbac::Attributes::non_resource(method.as_str(), path),
            )
        })
    {
        return refused.into_response();
    }
    let response = match segs.as_slice() {
        ["debug", "rbac"] => shared
            .rbac_report()
            .map(|report| json_response(200, &report))
            .ok_or_else(|| ApiError::new(404, "NotFound", "RBAC is not enforced")),
        ["debug", "objects"] if method == Method::POST => match parse_body(&body) {
            Ok(list) => {
                let store = shared.store.clone();
                let created = off_async(move || create_many(&store, &list)).await;
                Ok(json_response(200, &created))
            }
            Err(e) => Err(e),
        },
        ["debug", "faults"] if method == Method::POST => {
            parse_body(&body).and_then(|faults| apply_faults(&shared, &faults))
        }
        ["debug", "requests"] if method == Method::GET => {
            Ok(json_response(200, &shared.accounting.report()))
        }
        ["debug", "requests"] if method == Method::DELETE => {
            shared.accounting.reset();
            Ok(json_response(200, &json!({})))
        }
        ["version"] => Ok(json_response(200, &version())),
        ["healthz"] | ["livez"] | ["readyz"] => Ok((StatusCode::OK, "ok").into_response()),
        ["api"] => Ok(json_response(
            200,
            &json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.address}],
            }),
        )),
        ["apis"] => Ok(json_response(200, &api_groups(&shared.store))),
        ["apis", group] => api_group(&shared.store, group).map(|g| json_response(200, &g)),
        ["api", "v1"] => Ok(json_response(200, &resource_list("", "v1"))),
        ["apis", group, version] if resources::groups().contains(group) => {
            Ok(json_response(200, &resource_list(group, version)))
        }
        ["openapi", "v3"] => Ok(json_response(200, &schema::openapi_root())),
        ["openapi", "v3", rest @ ..] => schema::openapi_group_version(&rest.join("/"))
            .map(|doc| json_response(200, &doc))
            .ok_or_else(|| ApiError::new(404, "NotFound", "no such group version")),
        ["api", "v1", rest @ ..] => {
            dispatch(
                &shared,
                "",
                "v1",
                rest,
                method.clone(),
                &uri,
                (&headers, cert),
                body,
            )
            .await
        }
        ["apis", group, version, rest @ ..] => {
            dispatch(
                &shared,
                group,
                version,
                rest,
                method.clone(),
                &uri,
                (&headers, cert),
                body,
            )
            .await
        }
        _ => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    };
    let response = response.unwrap_or_else(IntoResponse::into_response);
    let (group, version, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return response,
    };
    let Some(t) = target(group, version, rest) else {
        return response;
    };
    let what = format!(
        "{} {}{}",
        crate::accounting::verb(&method, &uri, t.name.is_some()),
        t.resource.plural,
        t.sub.map(|s| format!("/{s}")).unwrap_or_default()
    );
    shared
        .accounting
        .count(&shared.user_name(&headers, cert), what, response)
}

/// `POST /debug/objects`: creates every object of a list (`{"items":
/// [...]}`, any served kinds, each with its `apiVersion` and `kind`) in one
/// request, its status included, each checked as a create is: how a
/// benchmark registers 100,000 Nodes as their kubelets would, without
/// 200,000 requests. Watchers see each object added, then its status.
/// Answers how many were made and why the others were not.
fn create_many(store: &Store, list: &Value) -> Value {
    let mut created = 0;
    let mut failed = Vec::new();
    for obj in list["items"].as_array().into_iter().flatten() {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let made = (|| {
            let resource = RESOURCES
                .iter()
                .find(|r| {
                    !r.create_only
                        && r.kind == obj["kind"].as_str().unwrap_or_default()
                        && r.api_version() == obj["apiVersion"].as_str().unwrap_or_default()
                })
                .ok_or_else(|| {
                    ApiError::bad_request("no served resource of this apiVersion and kind")
                })?;
            let ns = if resource.namespaced {
                obj["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_owned()
            } else {
                String::new()
            };
            let obj = checked(
                resource,
                obj.clone(),
                FieldValidation::Strict,
                &mut Vec::new(),
            )?;
            let status = obj.get("status").cloned();
            let made = store.create(resource, &ns, obj)?;
            if let Some(status) = status.filter(|s| resource.has_status && s.is_object()) {
                let name = made["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                store.update(resource, &ns, &name, true, |old| {
                    let mut new = old.clone();
                    new["status"] = status;
                    Ok(new)
                })?;
            }
            Ok::<_, ApiError>(())
        })();
        match made {
            Ok(()) => created += 1,
            Err(e) => failed.push(json!({"name": name, "error": e.message})),
        }
    }
    json!({"created": created, "failed": failed})
}

/// `POST /debug/faults`: the API server's own failures, made on purpose
/// for tests and the chaos soak. `{"expireWatches": true}` ends every
/// watch and forgets the history, so each client's next watch gets 410
/// Gone and must list again; `{"refuseUpdates": {"resource": "services",
/// "seconds": 30}}` answers every update of that resource with 409
/// Conflict for that long (with `"subresource": "status"`, only updates of
/// its status). Both may come in one request.
fn apply_faults(shared: &Shared, faults: &Value) -> Result<Response, ApiError> {
    let refuse = &faults["refuseUpdates"];
    let refused = if refuse.is_null() {
        None
    } else {
        let resource = refuse["resource"]
            .as_str()
            .filter(|r| RESOURCES.iter().any(|known| known.plural == *r))
            .ok_or_else(|| {
                ApiError::bad_request("refuseUpdates.resource: a served resource's plural")
            })?;
        let seconds = refuse["seconds"]
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 86_400.0)
            .ok_or_else(|| ApiError::bad_request("refuseUpdates.seconds: 0 to 86400"))?;
        let status_only = match &refuse["subresource"] {
            Value::Null => false,
            v if v == "status" => true,
            _ => {
                return Err(ApiError::bad_request(
                    "refuseUpdates.subresource: status, or none",
                ));
            }
        };
        Some((resource, status_only, Duration::from_secs_f64(seconds)))
    };
    let expire = match &faults["expireWatches"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => return Err(ApiError::bad_request("expireWatches: true or false")),
    };
    if let Some((resource, status_only, duration)) = refused {
        shared.store.refuse_updates(resource, status_only, duration);
        tracing::warn!(
            resource,
            status_only,
            ?duration,
            "fault: every update refused with 409 Conflict"
        );
    }
    if expire {
        // Past every version a client has seen, so each one's next watch
        // is refused, however current it was.
        shared.store.bump_resource_version(1);
        shared.disconnect.send_modify(|n| *n += 1);
        tracing::warn!("fault: every watch ended and the history forgotten");
    }
    Ok(json_response(
        200,
        &json!({"expireWatches": expire, "refuseUpdates": refuse}),
    ))
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "32", "gitVersion": "v1.32.0-ccm-test",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// A group served here, as discovery describes it (its one version is
/// `v1`).
fn served_group(group: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `/apis`: the groups served here, then those other servers serve (see
/// `aggregation`).
fn api_groups(store: &Store) -> Value {
    let mut groups: Vec<Value> = resources::groups().into_iter().map(served_group).collect();
    groups.extend(aggregation::remote_groups(store));
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`: one group, served here or elsewhere.
fn api_group(store: &Store, group: &str) -> Result<Value, ApiError> {
    let found = if resources::groups().contains(&group) {
        Some(served_group(group))
    } else {
        aggregation::remote_groups(store)
            .into_iter()
            .find(|g| g["name"] == group)
    };
    let mut found = found.ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    })?;
    found["kind"] = json!("APIGroup");
    found["apiVersion"] = json!("v1");
    Ok(found)
}

fn resource_list(group: &str, version: &str) -> Value {
    let verbs = json!([
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch"
    ]);
    let mut out = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut entry = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": if r.create_only { json!(["create"]) } else { verbs.clone() },
            "shortNames": r.short_names,
        });
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        out.push(entry);
        let mut subresources: Vec<&str> = r.subresources.to_vec();
        if r.has_status {
            subresources.push("status");
        }
        subresources.sort_unstable();
        for sub in subresources {
            let (kind, verbs) = r.subresource_discovery(sub);
            let mut entry = json!({
                "name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": kind, "verbs": verbs,
            });
            // An eviction is a `policy/v1` object posted to a pod.
            if sub == "eviction" {
                entry["group"] = json!("policy");
                entry["version"] = json!("v1");
            }
            out.push(entry);
        }
    }
    // kube-apiserver registers, and lists, its resources sorted by path
    // (`pods`, `pods/proxy`, `pods/status`, `services`...): `kubectl get
    // all` lists them in this order.
    out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out})
}

/// The RBAC verb of a request.
pub(crate) fn verb(method: &Method, named: bool, q: &HashMap<String, String>) -> &'static str {
    let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    match (method.as_str(), named) {
        ("GET", _) if watching => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// The name a list or watch is confined to by its field selector
/// (`metadata.name=NAME`), which kube-apiserver authorises as a request
/// for that name: a Role limited to `resourceNames` may list and watch
/// its objects one at a time.
pub(crate) fn selected_name(q: &HashMap<String, String>) -> Option<String> {
    q.get("fieldSelector")?.split(',').find_map(|term| {
        let (field, value) = term.split_once('=')?;
        let value = value.strip_prefix('=').unwrap_or(value);
        (field.trim() == "metadata.name").then(|| value.trim().to_owned())
    })
}

/// The object of a create or update: protobuf when the client says so
/// (kubectl's typed clients do), else JSON or YAML.
fn parse_object(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !protobuf::is_protobuf(content_type) {
        return parse_body(body);
    }
    protobuf::decode(body).map_err(|refused| match refused {
        protobuf::Refused::Malformed(why) => ApiError::bad_request(why),
        protobuf::Refused::Unsupported(why) => ApiError::new(415, "UnsupportedMediaType", why),
    })
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .or_else(|_| serde_norway::from_slice(body))
        .map_err(|e| {
            ApiError::bad_request(format!("the request body is not valid JSON or YAML: {e}"))
        })
}

#[allow(clippy::too_many_arguments, reason = "one request's parts")]
async fn dispatch(
    shared: &Arc<Shared>,
    group: &str,
    version: &str,
    segs: &[&str],
    method: Method,
    uri: &Uri,
    (headers, cert): (&HeaderMap, Option<&TokenUser>),
    body: Bytes,
) -> Result<Response, ApiError> {
    let q = query(uri);
    let (t, user) = authorized_target(shared, group, version, segs, &method, &q, (headers, cert))?;
    let resource = t.resource;
    let ns = t.namespace.clone().unwrap_or_default();
    if let (Some("proxy"), Some(id)) = (t.sub.as_deref(), t.name.as_deref()) {
        let to = proxy::Destination {
            plural: resource.plural,
            namespace: &ns,
            id,
            rest: &t.rest,
        };
        return proxy::forward(&shared.store, &to, &method, uri, headers, body).await;
    }
    let status = t.sub.is_some();
    let mode = FieldValidation::parse(q.get("fieldValidation").map(String::as_str));
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let mut warnings = Vec::new();
    let store = &shared.store;
    if resource.create_only {
        return match (method, t.name) {
            (Method::POST, None) => {
                let review = parse_object(headers, &body)?;
                check_kind(resource, &review)?;
                let review = checked(resource, review, mode, &mut warnings)?;
                let answer = match resource.plural {
                    "tokenreviews" => shared.token_review(review),
                    _ => reviews::answer(shared, resource, &ns, user.as_ref(), review)?,
                };
                Ok(with_warnings(json_response(201, &answer), &warnings))
            }
            _ => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("only create is allowed on {}", resource.plural),
            )),
        };
    }
    let writes = method != Method::GET;
    let answer = match (method, t.name) {
        (Method::GET, None) => get_collection(shared, resource, t.namespace, &q, accept).await,
        (Method::GET, Some(name)) => {
            let obj = store.get(resource, &ns, &name)?;
            if table::wants_table(accept) {
                let rv = obj["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let include = table::Include::parse(q.get("includeObject").map(String::as_str));
                return Ok(json_response(
                    200,
                    &table::table(resource, &[obj], &rv, include),
                ));
            }
            Ok(json_response(200, &obj))
        }
        (Method::POST, None) => {
            let mut obj = parse_object(headers, &body)?;
            check_kind(resource, &obj)?;
            if resource.plural == "certificatesigningrequests" {
                requested_by(&mut obj, user.as_ref());
            }
            let obj = checked(resource, obj, mode, &mut warnings)?;
            let created = store.create(resource, &ns, obj)?;
            mirror_event(store, resource, &ns, &created);
            Ok(with_warnings(json_response(201, &created), &warnings))
        }
        (Method::POST, Some(name)) if t.sub.as_deref() == Some("eviction") => {
            let eviction = parse_object(headers, &body)?;
            Ok(json_response(
                201,
                &evictions::evict(store, &ns, &name, &eviction)?,
            ))
        }
        (Method::POST, Some(name)) if t.sub.as_deref() == Some("token") => {
            // A credential is handed out to a known caller only, RBAC
            // enforced or not: the sandbox and CI trust these tokens.
            if shared.token_user(headers, cert).is_none() {
                return Err(ApiError::new(
                    401,
                    "Unauthorized",
                    "a token request needs an authenticated caller",
                ));
            }
            let request = parse_object(headers, &body)?;
            let answer = tokens::request(store, &shared.pki.signing_key, &ns, &name, request)?;
            Ok(json_response(201, &answer))
        }
        (Method::PUT, Some(name)) if t.sub.as_deref() == Some("approval") => {
            let obj = parse_object(headers, &body)?;
            check_kind(resource, &obj)?;
            let obj = checked(resource, obj, mode, &mut warnings)?;
            let conditions = approval_conditions(&obj)?;
            let signer = store.get(resource, &ns, &name)?["spec"]["signerName"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            may_approve(shared, user.as_ref(), &signer)?;
            let updated = store.update(resource, &ns, &name, true, |old| {
                let mut new = old.clone();
                new["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"].clone();
                if !new["status"].is_object() {
                    new["status"] = json!({});
                }
                new["status"]["conditions"] = conditions;
                Ok(new)
            })?;
            Ok(with_warnings(json_response(200, &updated), &warnings))
        }
        (Method::PUT, Some(name)) => {
            let obj = parse_object(headers, &body)?;
            check_kind(resource, &obj)?;
            let obj = checked(resource, obj, mode, &mut warnings)?;
            let updated = store.update(resource, &ns, &name, status, |_| Ok(obj))?;
            Ok(with_warnings(json_response(200, &updated), &warnings))
        }
        (Method::PATCH, Some(name)) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
            let response = patch(
                store,
                resource,
                &ns,
                &name,
                status,
                &content_type,
                &body,
                mode,
                &mut warnings,
            )?;
            if resource.group == "events.k8s.io"
                && let Ok(event) = store.get(resource, &ns, &name)
            {
                mirror_event(store, resource, &ns, &event);
            }
            Ok(with_warnings(response, &warnings))
        }
        (Method::DELETE, Some(name)) => {
            let options: Value = if body.is_empty() {
                json!({})
            } else {
                parse_object(headers, &body)?
            };
            let pre = &options["preconditions"];
            let preconditions = (
                pre["uid"].as_str().map(str::to_owned),
                pre["resourceVersion"].as_str().map(str::to_owned),
            );
            Ok(json_response(
                200,
                &store.delete(resource, &ns, &name, preconditions)?,
            ))
        }
        (method, _) => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not allowed here"),
        )),
    };
    // A written rule applies to the next request, as on a cluster.
    if writes && answer.is_ok() && resource.group == rbac::GROUP {
        shared.reload_rbac();
    }
    answer
}

/// Sets a CSR's requester fields from the caller, as kube-apiserver does:
/// whatever the body says of them is replaced. Without authentication the
/// caller is the sandbox's administrator.
fn requested_by(obj: &mut Value, user: Option<&rbac::User>) {
    let (username, groups) = match user {
        Some(u) => (u.username.clone(), u.groups.clone()),
        None => (
            "system:admin".to_owned(),
            vec![
                "system:masters".to_owned(),
                "system:authenticated".to_owned(),
            ],
        ),
    };
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = obj["spec"].as_object_mut().expect("an object");
    spec.insert("username".into(), json!(username));
    spec.insert("groups".into(), json!(groups));
    spec.remove("uid");
    spec.remove("extra");
}

/// Whether `user` may approve (or deny) for `signer`, as kube-apiserver
/// asks: the verb `approve` on `signers` named the signer or its domain's
/// wildcard (`kubernetes.io/*`).
fn may_approve(
    shared: &Arc<Shared>,
    user: Option<&rbac::User>,
    signer: &str,
) -> Result<(), ApiError> {
    let ask = |name: String| {
        shared.authorize(
            user,
            &rbac::Attributes {
                verb: "approve".into(),
                group: "certificates.k8s.io".into(),
                resource: "signers".into(),
                namespace: None,
                name: Some(name),
                path: None,
            },
        )
    };
    let wildcard = signer
        .split_once('/')
        .map(|(domain, _)| format!("{domain}/*"));
    match ask(signer.to_owned()) {
        Ok(()) => Ok(()),
        Err(e) => wildcard.map_or(Err(e), ask),
    }
}

/// The approval conditions of a CSR sent to `approval`: `Approved` or
/// `Denied` (never both), each `True`; the rest of the body is ignored.
fn approval_conditions(obj: &Value) -> Result<Value, ApiError> {
    let conditions = obj["status"]["conditions"].clone();
    let list = conditions.as_array().cloned().unwrap_or_default();
    let has = |kind: &str| list.iter().any(|c| c["type"] == kind);
    if has("Approved") && has("Denied") {
        return Err(ApiError::new(
            422,
            "Invalid",
            "status.conditions: Approved and Denied conditions are mutually exclusive",
        ));
    }
    if let Some(c) = list.iter().find(|c| c["status"] != "True") {
        return Err(ApiError::new(
            422,
            "Invalid",
            format!("status.conditions: {} must be True", c["type"]),
        ));
    }
    Ok(Value::Array(list))
}

/// The resource a request addresses, once its caller may act on it.
fn authorized_target(
    shared: &Arc<Shared>,
    group: &str,
    version: &str,
    segs: &[&str],
    method: &Method,
    q: &HashMap<String, String>,
    (headers, cert): (&HeaderMap, Option<&TokenUser>),
) -> Result<(Target, Option<rbac::User>), ApiError> {
    let t = target(group, version, segs).ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    })?;
    let resource = t.resource;
    if let Some(sub) = t.sub.as_ref().filter(|s| {
        let served =
            (*s == "status" && resource.has_status) || resource.subresources.contains(&s.as_str());
        !served
    }) {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!("{} has no subresource {sub}", resource.plural),
        ));
    }
    if !t.rest.is_empty() && t.sub.as_deref() != Some("proxy") {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    if resource.namespaced && t.name.is_some() && t.namespace.is_none() {
        return Err(ApiError::new(
            404,
            "NotFound",
            "namespaced resources are addressed in a namespace",
        ));
    }
    let user = shared.caller(headers, cert)?;
    shared.authorize(
        user.as_ref(),
        &rbac::Attributes {
            verb: match t.sub.as_deref() {
                Some("proxy") => proxy::verb(method),
                _ => verb(method, t.name.is_some(), q),
            }
            .to_owned(),
            group: group.to_owned(),
            resource: match &t.sub {
                Some(sub) => format!("{}/{sub}", resource.plural),
                None => resource.plural.to_owned(),
            },
            namespace: t.namespace.clone(),
            name: t
                .name
                .clone()
                .or_else(|| (*method == Method::GET).then(|| selected_name(q)).flatten()),
            path: None,
        },
    )?;
    Ok((t, user))
}

/// A list, a Table of it, or a watch.
async fn get_collection(
    shared: &Arc<Shared>,
    resource: &'static Resource,
    namespace: Option<String>,
    q: &HashMap<String, String>,
    accept: &str,
) -> Result<Response, ApiError> {
    let selector = Selector::parse(
        q.get("labelSelector").map(String::as_str),
        q.get("fieldSelector").map(String::as_str),
    )
    .map_err(ApiError::bad_request)?;
    if matches!(q.get("watch").map(String::as_str), Some("true" | "1")) {
        return watch(shared, resource, namespace, selector, q);
    }
    let listed = list(&shared.store, resource, namespace.as_deref(), &selector, q)?;
    let table = table::wants_table(accept)
        .then(|| table::Include::parse(q.get("includeObject").map(String::as_str)));
    Ok(off_async(move || listed.response(table)).await)
}

/// Checks an object against its type, handling unknown fields per `mode`;
/// returns it as it is to be stored.
fn checked(
    resource: &Resource,
    obj: Value,
    mode: FieldValidation,
    warnings: &mut Vec<String>,
) -> Result<Value, ApiError> {
    let (stored, found) = schema::validate(resource, &obj, mode).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            resource.kind, resource.version, resource.kind
        ))
    })?;
    warnings.extend(found);
    let mut stored = stored;
    if resource.group.is_empty() && resource.kind == "Event" {
        super::events::core_shape(&mut stored);
    }
    if resource.group == aggregation::GROUP && resource.kind == "APIService" {
        let name = stored["metadata"]["name"].as_str().unwrap_or_default();
        aggregation::validate(&stored).map_err(|e| ApiError::invalid(resource, name, e))?;
    }
    Ok(stored)
}

fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let value = format!("299 - {:?}", w);
        if let Ok(v) = value.parse() {
            response.headers_mut().append("Warning", v);
        }
    }
    response
}

/// Keeps the core/v1 view of `events.k8s.io` events (see `events`).
fn mirror_event(store: &Store, resource: &Resource, namespace: &str, obj: &Value) {
    if resource.group == "events.k8s.io" {
        super::events::mirror(store, namespace, obj);
    }
}

fn check_kind(resource: &Resource, obj: &Value) -> Result<(), ApiError> {
    match obj["kind"].as_str() {
        Some(kind) if kind != resource.kind => Err(ApiError::bad_request(format!(
            "the kind of the body ({kind}) does not match the resource ({})",
            resource.kind
        ))),
        _ => Ok(()),
    }
}

#[allow(clippy::too_many_arguments, reason = "one request's parts")]
fn patch(
    store: &Store,
    resource: &'static Resource,
    ns: &str,
    name: &str,
    status: bool,
    content_type: &str,
    body: &[u8],
    mode: FieldValidation,
    warnings: &mut Vec<String>,
) -> Result<Response, ApiError> {
    // kube-apiserver knows no strategic merge keys of a custom resource's
    // lists, so it takes no strategic merge patch of one; kubectl sends
    // merge patches instead.
    if resource.custom && content_type == "application/strategic-merge-patch+json" {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    }
    let apply = content_type == "application/apply-patch+yaml";
    if apply {
        // Server-side apply creates what does not exist yet.
        if let Err(e) = store.get(resource, ns, name) {
            if e.code != 404 {
                return Err(e);
            }
            let mut obj = parse_body(body)?;
            obj["metadata"]["name"] = json!(name);
            let obj = checked(resource, obj, mode, warnings)?;
            return Ok(json_response(201, &store.create(resource, ns, obj)?));
        }
    }
    let updated = store.update(resource, ns, name, status, |old| {
        let mut doc = old.clone();
        match content_type {
            "application/json-patch+json" => {
                let ops: json_patch::Patch = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                super::patch::json_patch(&mut doc, &ops).map_err(|e| ApiError::invalid(resource, name, e))?;
            }
            "application/merge-patch+json" => json_patch::merge(&mut doc, &parse_body(body)?),
            "application/strategic-merge-patch+json" | "application/apply-patch+yaml" => {
                strategic_merge(resource.kind, &mut doc, &parse_body(body)?)
                    .map_err(|e| ApiError::invalid(resource, name, e))?;
            }
            other => {
                return Err(ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})")));
            }
        }
        checked(resource, doc, mode, warnings)
    })?;
    Ok(json_response(200, &updated))
}

/// A list, whole or one page of it (`limit`, `continue`). As
/// kube-apiserver's, every page of one list has the resourceVersion of its
/// first page (the continue token carries it), so a client that watches
/// from it after the last page is replayed whatever changed while it
/// paged; a token older than the history kept is 410 Gone.
fn list(
    store: &Store,
    resource: &'static Resource,
    namespace: Option<&str>,
    selector: &Selector,
    q: &HashMap<String, String>,
) -> Result<Listed, ApiError> {
    let token = q.get("continue").filter(|c| !c.is_empty());
    let (first_rv, after) = match token {
        Some(token) => {
            let (rv, ns, name) = parse_continue(token).ok_or_else(|| {
                ApiError::bad_request(format!("invalid continue token {token:?}"))
            })?;
            if !store.can_continue(rv) {
                return Err(ApiError::new(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (Some(rv), Some((ns, name)))
        }
        None => (None, None),
    };
    let limit: usize = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let page = store.page(
        resource,
        namespace,
        after
            .as_ref()
            .map(|(ns, name)| (ns.as_str(), name.as_str())),
        limit,
        |o| selector.matches(o),
    );
    let rv = first_rv.unwrap_or(page.rv);
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some((ns, name)) = &page.next {
        metadata["continue"] = json!(format!("{rv}/{ns}/{name}"));
    }
    Ok(Listed {
        resource,
        metadata,
        items: page.items,
    })
}

/// A page of a list, read and not yet written.
struct Listed {
    resource: &'static Resource,
    metadata: Value,
    items: Vec<Arc<Value>>,
}

impl Listed {
    /// The list as JSON, or as a Table with `table`'s rows.
    fn response(self, table: Option<table::Include>) -> Response {
        if let Some(include) = table {
            let items: Vec<Value> = self.items.iter().map(|o| Value::clone(o)).collect();
            let rv = self.metadata["resourceVersion"]
                .as_str()
                .unwrap_or_default();
            return json_response(200, &table::table(self.resource, &items, rv, include));
        }
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct List<'a> {
            kind: String,
            api_version: String,
            metadata: &'a Value,
            items: Vec<&'a Value>,
        }
        let list = List {
            kind: format!("{}List", self.resource.kind),
            api_version: self.resource.api_version(),
            metadata: &self.metadata,
            items: self.items.iter().map(|o| &**o).collect(),
        };
        json_response(200, &list)
    }
}

/// A continue token: the first page's resourceVersion and the namespace
/// and name the last page ended with.
fn parse_continue(token: &str) -> Option<(u64, String, String)> {
    let mut parts = token.splitn(3, '/');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, parts.next()?.to_owned(), parts.next()?.to_owned()))
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    object_line(kind, &object.to_string())
}

/// A watch event around an object already written as JSON: no copy of
/// the object is made to write it.
fn object_line(kind: &str, object: &str) -> Bytes {
    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n"))
}

fn bookmark(resource: &Resource, rv: u64, initial_end: bool) -> Bytes {
    let mut object = json!({
        "kind": resource.kind,
        "apiVersion": resource.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
    });
    if initial_end {
        object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line("BOOKMARK", &object)
}

/// What a watcher with `selector` sees of `change`, if anything.
fn view(
    change: &Change,
    resource: &Resource,
    namespace: Option<&str>,
    selector: &Selector,
) -> Option<Bytes> {
    if change.resource.group != resource.group || change.resource.plural != resource.plural {
        return None;
    }
    if namespace.is_some_and(|ns| ns != change.namespace) {
        return None;
    }
    let now = change.kind != ChangeType::Deleted && selector.matches(&change.object);
    let before = change.old.as_ref().is_some_and(|o| selector.matches(o));
    let kind = match (change.kind, before, now) {
        (ChangeType::Deleted, true, _) => "DELETED",
        (ChangeType::Added, _, true) => "ADDED",
        (ChangeType::Modified, true, true) => "MODIFIED",
        (ChangeType::Modified, false, true) => "ADDED",
        (ChangeType::Modified, true, false) => "DELETED",
        _ => return None,
    };
    Some(object_line(kind, change.json()))
}

fn watch(
    shared: &Arc<Shared>,
    resource: &'static Resource,
    namespace: Option<String>,
    selector: Selector,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let since: u64 = q
        .get("resourceVersion")
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let initial_events = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let store = shared.store.clone();
    let interval = shared.bookmark_interval;
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);

    // Without a resourceVersion (or with 0) a watch starts with the current
    // objects as ADDED events, as the real server does.
    let mut initial = Vec::new();
    let start = if since == 0 || initial_events {
        let (items, rv) = store.list(resource, namespace.as_deref());
        initial = items.into_iter().filter(|o| selector.matches(o)).collect();
        rv
    } else {
        since
    };
    let subscription = store.watch(start);
    let mut disconnect = shared.disconnect.subscribe();
    disconnect.mark_unchanged();
    tokio::spawn(async move {
        let send = |bytes: Bytes| {
            let tx = tx.clone();
            async move { tx.send(Ok(bytes)).await.is_ok() }
        };
        let (replay, mut live) = match subscription {
            Ok(s) => s,
            Err(floor) => {
                let gone = ApiError::new(
                    410,
                    "Expired",
                    format!("too old resource version: {since} ({floor})"),
                );
                send(event_line("ERROR", &gone.to_status())).await;
                return;
            }
        };
        for object in initial {
            if !send(event_line("ADDED", &object)).await {
                return;
            }
        }
        let mut last = start;
        if initial_events {
            send(bookmark(resource, last, true)).await;
        }
        for change in replay {
            last = change.rv;
            if let Some(line) = view(&change, resource, namespace.as_deref(), &selector)
                && !send(line).await
            {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                change = live.recv() => match change {
                    Ok(change) if change.rv > last => {
                        last = change.rv;
                        if let Some(line) = view(&change, resource, namespace.as_deref(), &selector)
                                && !send(line).await
                        {
                                return;
                        }
                    }
                    Ok(_) => {}
                    // A watcher too slow to keep up is cut off; the client
                    // watches again from its last resourceVersion.
                    Err(_) => return,
                },
                _ = ticker.tick(), if bookmarks => {
                    if !send(bookmark(resource, last, false)).await {
                        return;
                    }
                }
                _ = tx.closed() => return,
                _ = &mut deadline => return,
                _ = disconnect.changed() => return,
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header("Transfer-Encoding", "chunked")
        .body(body)
        .expect("valid response"))
}
