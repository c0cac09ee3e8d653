//! API aggregation as kube-apiserver's kube-aggregator does it. An
//! `APIService` (`apiregistration.k8s.io/v1`) named `<version>.<group>`
//! whose `spec.service` names a Service hands that group version to
//! another server, an aggregated API server (such as the controllers'
//! `diagnostics.cloudgateway.io`):
//!
//! - discovery lists its group ([`remote_groups`]: `/apis` and
//!   `/apis/<group>` are answered here);
//! - every request under `/apis/<group>/<version>`, its discovery
//!   document included, is authenticated and authorised here as any other,
//!   with the attributes its path gives ([`attributes`]), then forwarded
//!   ([`forward`]) over TLS to one of the Service's endpoints
//!   (see `backend`), presenting the front proxy's client certificate (see
//!   `front_proxy`) and naming the caller in `X-Remote-*` headers;
//! - a background task keeps each APIService's `Available` condition (see
//!   `availability`).
//!
//! APIServices without `spec.service` stand for the group versions served
//! here; [`register_local`] makes one for each at start, as
//! kube-apiserver's autoregister controller does.
//!
//! Unlike kube-aggregator: no watches or other streams (the answer is read
//! whole), no `X-Remote-Extra-*` headers, no aggregated discovery
//! (`apidiscovery.k8s.io`: kubectl reads the legacy documents), no
//! ExternalName Services, and an APIService without a `caBundle` (nor
//! `insecureSkipTLSVerify`) trusts no server rather than the system's
//! roots.

pub(crate) mod availability;
mod backend;

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use serde_json::{Value, json};

use super::front_proxy::{GROUP_HEADER, UID_HEADER, USER_HEADER};
use super::http::{query, selected_name, verb};
use super::proxy::{self, upstream};
use super::rbac;
use super::resources::{self, RESOURCES, Resource};
use super::store::{ApiError, Store};
use super::{Shared, TokenUser};

/// The group of APIServices.
pub(crate) const GROUP: &str = "apiregistration.k8s.io";

/// The APIService resource.
fn api_services() -> &'static Resource {
    resources::find(GROUP, "v1", "apiservices").expect("APIServices are served")
}

/// The APIService that hands `group`/`version` to another server, if
/// there is one.
pub(crate) fn remote(store: &Store, group: &str, version: &str) -> Option<Value> {
    store
        .get(api_services(), "", &format!("{version}.{group}"))
        .ok()
        .filter(|a| backend::ServiceRef::of(a).is_some())
}

/// Registers an APIService for each group version served here (`v1.` for
/// the core group, `v1.<group>` for the others), local and available, as
/// kube-apiserver's autoregister controller does: for the groups of custom
/// resources as its CRD registration controller does, with their low
/// priority. Those there already are left as they are.
pub(crate) fn register_local(store: &Store) {
    let mut served: Vec<(&str, bool)> = RESOURCES.iter().map(|r| (r.group, r.custom)).collect();
    served.sort_unstable();
    served.dedup();
    for (group, custom) in served {
        let name = format!("v1.{group}");
        if store.get(api_services(), "", &name).is_ok() {
            continue;
        }
        let (managed, group_priority, version_priority) = match (group, custom) {
            (_, true) => ("true", 1000, 100),
            ("", false) => ("onstart", 18000, 15),
            (_, false) => ("onstart", 17000, 15),
        };
        let local = json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "APIService",
            "metadata": {"name": name, "labels": {"kube-aggregator.kubernetes.io/automanaged": managed}},
            "spec": {
                "group": group,
                "version": "v1",
                "groupPriorityMinimum": group_priority,
                "versionPriority": version_priority,
            },
            "status": {"conditions": [availability::condition(&availability::Verdict::local(), &super::store::now())]},
        });
        if let Err(e) = store.create(api_services(), "", local) {
            tracing::warn!(%name, error = %e.message, "local APIService not registered");
        }
    }
}

/// The groups the APIServices with a Service hand to other servers, as
/// `/apis` lists them after those served here.
pub(crate) fn remote_groups(store: &Store) -> Vec<Value> {
    groups(&store.list(api_services(), None).0)
}

/// The discovery entries (APIGroup, less its kind) of the groups
/// `api_services` hand to other servers, ordered as kube-aggregator orders
/// them: by the highest `groupPriorityMinimum` of each group's APIServices,
/// then by name; each group's versions by `versionPriority`, highest
/// first, then as Kubernetes orders version names, the first preferred.
fn groups(api_services: &[Value]) -> Vec<Value> {
    let mut by_group: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for a in api_services {
        let spec = &a["spec"];
        let (Some(group), Some(_)) = (spec["group"].as_str(), backend::ServiceRef::of(a)) else {
            continue;
        };
        if !group.is_empty() && spec["version"].as_str().is_some_and(|v| !v.is_empty()) {
            by_group.entry(group).or_default().push(a);
        }
    }
    let mut ordered: Vec<(i64, &str, Vec<&Value>)> = by_group
        .into_iter()
        .map(|(group, mut versions)| {
            versions.sort_by_key(|a| {
                let spec = &a["spec"];
                (
                    Reverse(spec["versionPriority"].as_i64().unwrap_or(0)),
                    version_key(spec["version"].as_str().unwrap_or_default()),
                )
            });
            let priority = versions
                .iter()
                .filter_map(|a| a["spec"]["groupPriorityMinimum"].as_i64())
                .max()
                .unwrap_or(0);
            (priority, group, versions)
        })
        .collect();
    ordered.sort_by_key(|(priority, group, _)| (Reverse(*priority), *group));
    ordered
        .into_iter()
        .map(|(_, group, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|a| {
                    let version = a["spec"]["version"].as_str().unwrap_or_default();
                    json!({"groupVersion": format!("{group}/{version}"), "version": version})
                })
                .collect();
            json!({"name": group, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect()
}

/// Where a version name sorts, as Kubernetes' `CompareKubeAwareVersionStrings`
/// orders them: GA (`v2`, `v1`) before beta before alpha, higher numbers
/// first, then names that are none of these, alphabetically.
fn version_key(version: &str) -> (u8, Reverse<u64>, Reverse<u64>, String) {
    let other = (3, Reverse(0), Reverse(0), version.to_owned());
    let Some(rest) = version.strip_prefix('v') else {
        return other;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let Ok(major) = rest[..digits].parse::<u64>() else {
        return other;
    };
    let (maturity, minor) = match &rest[digits..] {
        "" => (0, ""),
        tail => match (tail.strip_prefix("beta"), tail.strip_prefix("alpha")) {
            (Some(minor), _) => (1, minor),
            (_, Some(minor)) => (2, minor),
            _ => return other,
        },
    };
    match minor.parse::<u64>() {
        Ok(minor) => (maturity, Reverse(major), Reverse(minor), String::new()),
        Err(_) if minor.is_empty() => (maturity, Reverse(major), Reverse(0), String::new()),
        Err(_) => other,
    }
}

/// What a request under `/apis/<group>/<version>` asks, as
/// kube-apiserver's request info reads it from the path alone (it knows
/// nothing of the aggregated server's resources): `rest` are the segments
/// after the version. The discovery document itself (no `rest`) is a
/// non-resource URL.
pub(crate) fn attributes(
    group: &str,
    version: &str,
    rest: &[&str],
    method: &Method,
    q: &HashMap<String, String>,
) -> rbac::Attributes {
    if rest.is_empty() {
        return rbac::Attributes::non_resource(
            method.as_str(),
            &format!("/apis/{group}/{version}"),
        );
    }
    let (namespace, parts) = split_namespace(rest);
    let name = parts.get(1).map(|n| n.to_string());
    // HEAD reads as GET does.
    let as_read = if *method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    let verb = verb(as_read, name.is_some(), q);
    let name = name.or_else(|| {
        (*as_read == Method::GET)
            .then(|| selected_name(q))
            .flatten()
    });
    let resource = match parts.get(2) {
        Some(sub) => format!("{}/{sub}", parts[0]),
        None => parts[0].to_owned(),
    };
    rbac::Attributes {
        verb: verb.to_owned(),
        group: group.to_owned(),
        resource,
        namespace,
        name,
        path: None,
    }
}

/// The namespace a path after the version is in, and the segments
/// from its resource on: `namespaces/NS/...` is NS's resources, but
/// `namespaces/NS`, `namespaces/NS/status` and `namespaces/NS/finalize`
/// are the namespace itself.
fn split_namespace<'a>(rest: &'a [&'a str]) -> (Option<String>, &'a [&'a str]) {
    match rest {
        ["namespaces", ns, resource, ..] if !matches!(*resource, "status" | "finalize") => {
            (Some(ns.to_string()), &rest[2..])
        }
        ["namespaces", ns, ..] => (Some(ns.to_string()), rest),
        _ => (None, rest),
    }
}

/// What `/debug/requests` counts a forwarded request as (`list
/// servicediagnoses`), as it counts those for resources served here;
/// `None` for the discovery document, which is not counted.
pub(crate) fn counted_as(to: &Destination<'_>, method: &Method, uri: &Uri) -> Option<String> {
    let (_, parts) = split_namespace(to.rest);
    let a = attributes(to.group, to.version, to.rest, method, &query(uri));
    let named = parts.len() > 1;
    a.path.is_none().then(|| {
        format!(
            "{} {}",
            crate::accounting::verb(method, uri, named),
            a.resource
        )
    })
}

/// What kube-apiserver's validation refuses of an APIService, with its
/// messages: a name other than `<version>.<group>`, priorities out of
/// range, a local one with TLS settings, a Service without a namespace,
/// name or valid port, and both `insecureSkipTLSVerify` and a `caBundle`.
pub(crate) fn validate(api_service: &Value) -> Result<(), String> {
    let spec = &api_service["spec"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let (name, group, version) = (
        text(&api_service["metadata"]["name"]),
        text(&spec["group"]),
        text(&spec["version"]),
    );
    let mut errors = Vec::new();
    let required = format!("{version}.{group}");
    if name != required {
        errors.push(format!(
            "metadata.name: Invalid value: {name:?}: must be {required}"
        ));
    }
    if version.is_empty() {
        errors.push("spec.version: Required value".to_owned());
    }
    let priority = |field: &str, max: i64| {
        let value = spec[field].as_i64().unwrap_or(0);
        (!(1..=max).contains(&value)).then(|| {
            format!("spec.{field}: Invalid value: {value}: must be positive and less than {max}")
        })
    };
    errors.extend(priority("groupPriorityMinimum", 20000));
    errors.extend(priority("versionPriority", 1000));
    let bundle = spec["caBundle"].as_str().is_some_and(|b| !b.is_empty());
    let insecure = spec["insecureSkipTLSVerify"] == true;
    let service = &spec["service"];
    if service.is_object() {
        for field in ["namespace", "name"] {
            if text(&service[field]).is_empty() {
                errors.push(format!("spec.service.{field}: Required value"));
            }
        }
        if let Some(port) = service["port"]
            .as_i64()
            .filter(|p| !(1..=65535).contains(p))
        {
            errors.push(format!(
                "spec.service.port: Invalid value: {port}: must be between 1 and 65535, inclusive"
            ));
        }
        if insecure && bundle {
            errors.push(
                "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present"
                    .to_owned(),
            );
        }
    } else {
        if bundle {
            errors.push("spec.caBundle: Invalid value: \"(bytes)\": local APIServices may not have a caBundle".to_owned());
        }
        if insecure {
            errors.push("spec.insecureSkipTLSVerify: Invalid value: true: local APIServices may not have insecureSkipTLSVerify".to_owned());
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(format!("[{}]", errors.join(", "))),
    }
}

/// Whom a forwarded request is from, as the `X-Remote-*` headers name
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    user: rbac::User,
    uid: Option<String>,
}

impl Identity {
    /// The identity of a request whose caller, once authenticated and
    /// impersonation applied, is `caller` (`None` while RBAC is off and no
    /// one is impersonated: then the bearer token's user, else
    /// `system:anonymous`, as a server with anonymous requests allowed
    /// names them). The uid is the token's, unless someone else is
    /// impersonated.
    fn of(
        shared: &Shared,
        caller: Option<rbac::User>,
        headers: &HeaderMap,
        cert: Option<&TokenUser>,
    ) -> Self {
        let token = shared.token_user(headers, cert);
        let impersonating = headers.contains_key("impersonate-user");
        let uid = token
            .as_ref()
            .filter(|_| !impersonating)
            .map(|t| t.uid.clone())
            .filter(|uid| !uid.is_empty());
        let user = match (caller, token) {
            (Some(user), _) => user,
            (None, Some(token)) => {
                let mut groups = token.groups;
                groups.push("system:authenticated".into());
                rbac::User {
                    username: token.username,
                    groups,
                }
            }
            (None, None) => rbac::User {
                username: "system:anonymous".into(),
                groups: vec!["system:unauthenticated".into()],
            },
        };
        Self { user, uid }
    }

    /// The headers that carry it. A value a header cannot carry (a line
    /// break in a name from a tokens file) is left out.
    fn headers(&self) -> Vec<(&'static str, &[u8])> {
        let mut out = vec![(USER_HEADER, self.user.username.as_bytes())];
        out.extend(
            self.user
                .groups
                .iter()
                .map(|g| (GROUP_HEADER, g.as_bytes())),
        );
        out.extend(self.uid.iter().map(|uid| (UID_HEADER, uid.as_bytes())));
        out.retain(|(_, value)| !value.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)));
        out
    }
}

/// The headers the aggregated server gets: the caller's, less its
/// credentials, hop-by-hop headers and any `X-Remote-*` it sent (only the
/// front proxy may say who the user is), then the identity's.
fn forwarded_headers<'a>(
    headers: &'a HeaderMap,
    identity: &'a Identity,
) -> Vec<(&'a str, &'a [u8])> {
    let mut out: Vec<(&str, &[u8])> = proxy::forwarded_headers(headers)
        .into_iter()
        .filter(|(name, _)| !name.starts_with("x-remote-"))
        .collect();
    out.extend(identity.headers());
    out
}

/// A request to a group version another server serves.
pub(crate) struct Destination<'a> {
    /// The APIService `<version>.<group>`, with its `spec.service`.
    pub api_service: &'a Value,
    /// The API group, as the path names it.
    pub group: &'a str,
    /// The group's version, as the path names it.
    pub version: &'a str,
    /// The path segments after the version.
    pub rest: &'a [&'a str],
}

/// Forwards a request to the server `to.api_service` names, once its
/// caller may make it (401 and 403 as for any request); see the module's
/// doc. 503 when the Service has no endpoints, none can be reached over
/// TLS (each is tried in turn, starting from the next in rotation), or
/// the one reached does not answer within [`proxy::TIMEOUT`].
pub(crate) async fn forward(
    shared: &Arc<Shared>,
    to: &Destination<'_>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    cert: Option<&TokenUser>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let q = query(uri);
    let caller = shared.caller(headers, cert)?;
    shared.authorize(
        caller.as_ref(),
        &attributes(to.group, to.version, to.rest, method, &q),
    )?;
    let identity = Identity::of(shared, caller, headers, cert);
    let service = backend::ServiceRef::of(to.api_service)
        .ok_or_else(|| ApiError::new(503, "ServiceUnavailable", "service unavailable"))?;
    let addresses = backend::addresses(&shared.store, &service).map_err(|missing| {
        let message = match missing.reason {
            backend::SERVICE_NOT_FOUND => "service unavailable".to_owned(),
            _ => format!("no endpoints available for service {:?}", service.name),
        };
        ApiError::new(503, "ServiceUnavailable", message)
    })?;
    let trust = backend::trust(to.api_service).map_err(unreachable)?;
    let tls = shared
        .front_proxy
        .client_config(trust)
        .map_err(|e| ApiError::new(500, "InternalError", e))?;
    let start = shared.next_backend.fetch_add(1, Ordering::Relaxed);
    let target = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let request = upstream::Request {
        method: method.as_str(),
        target: &target,
        headers: forwarded_headers(headers, &identity),
        body: &body,
    };
    let exchange = async {
        let (stream, addr) =
            backend::connect(tls, &service.server_name(), &addresses, start).await?;
        upstream::exchange_over(stream, &addr.to_string(), &request).await
    };
    let answer = tokio::time::timeout(proxy::TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", proxy::TIMEOUT)))
        .map_err(unreachable)?;
    Ok(proxy::answer_response(answer, *method == Method::HEAD))
}

fn unreachable(why: String) -> ApiError {
    ApiError::new(
        503,
        "ServiceUnavailable",
        format!("error trying to reach service: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_service(version: &str, group: &str, priorities: (i64, i64), remote: bool) -> Value {
        let mut a = json!({"metadata": {"name": format!("{version}.{group}")}, "spec": {
            "group": group, "version": version,
            "groupPriorityMinimum": priorities.0, "versionPriority": priorities.1,
        }});
        if remote {
            a["spec"]["service"] = json!({"namespace": "ns", "name": "svc"});
        }
        a
    }

    #[test]
    fn discovery_lists_remote_groups_by_priority_with_the_preferred_version_first() {
        let listed = groups(&[
            api_service("v1", "b.example", (1000, 15), true),
            api_service("v1beta1", "b.example", (1000, 15), true),
            api_service("v2alpha1", "b.example", (1000, 15), true),
            api_service("v2", "b.example", (1000, 10), true),
            api_service("v1", "a.example", (1000, 15), true),
            api_service("v1", "top.example", (2000, 15), true),
            api_service("v1", "local.example", (9000, 15), false),
            api_service("v1", "", (18000, 15), false),
        ]);
        let names: Vec<&str> = listed.iter().map(|g| g["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["top.example", "a.example", "b.example"]);
        let b = &listed[2];
        let versions: Vec<&str> = b["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["version"].as_str().unwrap())
            .collect();
        assert_eq!(versions, ["v1", "v1beta1", "v2alpha1", "v2"]);
        assert_eq!(
            b["preferredVersion"],
            json!({"groupVersion": "b.example/v1", "version": "v1"})
        );
    }

    #[test]
    fn api_services_are_validated_as_kube_apiserver_validates_them() {
        let remote = api_service("v1", "b.example", (1000, 15), true);
        assert_eq!(validate(&remote), Ok(()));
        assert_eq!(validate(&api_service("v1", "", (18000, 15), false)), Ok(()));
        let refused = |change: &dyn Fn(&mut Value)| {
            let mut a = remote.clone();
            change(&mut a);
            validate(&a).unwrap_err()
        };
        assert_eq!(
            refused(&|a| a["metadata"]["name"] = json!("v1.other.example")),
            "metadata.name: Invalid value: \"v1.other.example\": must be v1.b.example"
        );
        assert_eq!(
            refused(&|a| a["spec"]["versionPriority"] = json!(0)),
            "spec.versionPriority: Invalid value: 0: must be positive and less than 1000"
        );
        assert_eq!(
            refused(&|a| {
                a["spec"]["caBundle"] = json!("Zm9v");
                a["spec"]["insecureSkipTLSVerify"] = json!(true);
            }),
            "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present"
        );
        let several = refused(&|a| {
            a["spec"]["service"] = json!({"name": "svc", "port": 0});
            a["spec"]["groupPriorityMinimum"] = json!(30000);
        });
        assert!(
            several.starts_with('[')
                && several.contains("spec.service.namespace: Required value")
                && several.contains("spec.service.port")
                && several.contains("groupPriorityMinimum"),
            "{several}"
        );
        let mut local = api_service("v1", "b.example", (1000, 15), false);
        local["spec"]["insecureSkipTLSVerify"] = json!(true);
        assert!(
            validate(&local)
                .unwrap_err()
                .contains("local APIServices may not")
        );
    }

    #[test]
    fn version_names_sort_as_kubernetes_sorts_them() {
        let mut names = vec![
            "v1alpha1",
            "foo",
            "v1",
            "v2beta1",
            "v1beta2",
            "v10",
            "v2",
            "v1beta1",
            "bar",
            "v11alpha2",
        ];
        names.sort_by_key(|v| version_key(v));
        assert_eq!(
            names,
            [
                "v10",
                "v2",
                "v1",
                "v2beta1",
                "v1beta2",
                "v1beta1",
                "v11alpha2",
                "v1alpha1",
                "bar",
                "foo"
            ]
        );
    }

    #[test]
    fn paths_give_the_attributes_kube_apiserver_authorises() {
        let group = "diagnostics.example";
        let ask = |method: Method, path: &str, q: &[(&str, &str)]| {
            let rest: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
            let q = q
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let a = attributes(group, "v1", &rest, &method, &q);
            (
                a.verb,
                a.resource,
                a.namespace,
                a.name,
                a.path,
                a.group.is_empty(),
            )
        };
        let some = |s: &str| Some(s.to_owned());
        let cases = [
            (
                ask(Method::GET, "", &[]),
                (
                    "get",
                    "",
                    None,
                    None,
                    some("/apis/diagnostics.example/v1"),
                    true,
                ),
            ),
            (
                ask(Method::GET, "namespaces/ns/things", &[]),
                ("list", "things", some("ns"), None, None, false),
            ),
            (
                ask(Method::GET, "namespaces/ns/things", &[("watch", "true")]),
                ("watch", "things", some("ns"), None, None, false),
            ),
            (
                ask(
                    Method::GET,
                    "things",
                    &[("fieldSelector", "metadata.name=one")],
                ),
                ("list", "things", None, some("one"), None, false),
            ),
            (
                ask(Method::GET, "namespaces/ns/things/one", &[]),
                ("get", "things", some("ns"), some("one"), None, false),
            ),
            (
                ask(Method::PUT, "namespaces/ns/things/one/status", &[]),
                (
                    "update",
                    "things/status",
                    some("ns"),
                    some("one"),
                    None,
                    false,
                ),
            ),
            (
                ask(Method::POST, "namespaces/ns/things", &[]),
                ("create", "things", some("ns"), None, None, false),
            ),
            (
                ask(Method::PATCH, "things/one", &[]),
                ("patch", "things", None, some("one"), None, false),
            ),
            (
                ask(Method::DELETE, "namespaces/ns/things/one", &[]),
                ("delete", "things", some("ns"), some("one"), None, false),
            ),
            (
                ask(Method::DELETE, "namespaces/ns/things", &[]),
                ("deletecollection", "things", some("ns"), None, None, false),
            ),
            (
                ask(Method::GET, "namespaces/ns", &[]),
                ("get", "namespaces", some("ns"), some("ns"), None, false),
            ),
            (
                ask(Method::GET, "namespaces/ns/status", &[]),
                (
                    "get",
                    "namespaces/status",
                    some("ns"),
                    some("ns"),
                    None,
                    false,
                ),
            ),
        ];
        for (got, want) in cases {
            let want = (
                want.0.to_owned(),
                want.1.to_owned(),
                want.2,
                want.3,
                want.4,
                want.5,
            );
            assert_eq!(got, want);
        }
    }

    #[test]
    fn forwarded_headers_carry_the_identity_and_none_of_the_callers_claims() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("authorization", "Bearer secret"),
            ("impersonate-user", "someone"),
            ("x-remote-user", "forged"),
            ("x-remote-group", "system:masters"),
            (
                "accept",
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
            ),
            ("content-type", "application/json"),
        ] {
            headers.append(name, value.parse().unwrap());
        }
        let identity = Identity {
            user: rbac::User {
                username: "alice".into(),
                groups: vec![
                    "devs".into(),
                    "system:authenticated".into(),
                    "bad\r\nX-A: b".into(),
                ],
            },
            uid: Some("42".into()),
        };
        let sent: Vec<(String, String)> = forwarded_headers(&headers, &identity)
            .into_iter()
            .map(|(n, v)| {
                (
                    n.to_ascii_lowercase(),
                    String::from_utf8(v.to_vec()).unwrap(),
                )
            })
            .collect();
        let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        assert_eq!(
            sent,
            [
                pair(
                    "accept",
                    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
                ),
                pair("content-type", "application/json"),
                pair("x-remote-user", "alice"),
                pair("x-remote-group", "devs"),
                pair("x-remote-group", "system:authenticated"),
                pair("x-remote-uid", "42"),
            ]
        );
    }
}
