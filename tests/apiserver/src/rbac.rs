//! Role-based access control as the real API server applies it, for tests
//! that prove least privilege: Roles, ClusterRoles and their bindings are
//! objects of the API (`rbac.authorization.k8s.io/v1`), first those of the
//! manifests RBAC is turned on with (the Helm chart's, rendered), then
//! whatever is written, which applies from the next request on; every
//! request is checked against them, and the server remembers each refusal
//! and which (rule, verb, resource) grants were ever used, so a test can
//! fail on a missing permission and on one nobody needed.

use std::collections::BTreeSet;

use serde_json::{Value, json};

/// The API group of Roles, ClusterRoles and their bindings.
pub const GROUP: &str = "rbac.authorization.k8s.io";

/// The kinds of [`GROUP`], by plural.
pub const PLURALS: &[&str] = &[
    "clusterroles",
    "clusterrolebindings",
    "roles",
    "rolebindings",
];

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub username: String,
    pub groups: Vec<String>,
}

impl User {
    /// Members of `system:masters` pass every check, as on a real server.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// What kube-apiserver's own bootstrap policy lets every kubelet do that
/// concerns this server: create and read certificate signing requests
/// (the `system:node` and `selfnodeclient` roles). A chart never grants
/// it, so it is not in the report.
fn kubelet_bootstrap(user: &User, a: &Attributes) -> bool {
    a.path.is_none()
        && user.groups.iter().any(|g| g == "system:nodes")
        && a.group == "certificates.k8s.io"
        && a.resource == "certificatesigningrequests"
        && matches!(a.verb.as_str(), "create" | "get" | "list" | "watch")
}

/// The group every authenticated user is in.
const AUTHENTICATED: &str = "system:authenticated";

/// `system:discovery`'s URLs (kube-apiserver's bootstrap policy, bound to
/// `system:authenticated`).
const DISCOVERY_URLS: &[&str] = &[
    "/livez",
    "/readyz",
    "/healthz",
    "/version",
    "/version/",
    "/openapi",
    "/openapi/*",
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
];

/// `system:public-info-viewer`'s URLs (bound to `system:authenticated`
/// and `system:unauthenticated`).
const PUBLIC_INFO_URLS: &[&str] = &["/livez", "/readyz", "/healthz", "/version", "/version/"];

/// The reviews `system:basic-user` lets every authenticated user create
/// (in `authorization.k8s.io`).
const BASIC_USER_REVIEWS: &[&str] = &["selfsubjectaccessreviews", "selfsubjectrulesreviews"];

fn url_matches(urls: &[impl AsRef<str>], path: &str) -> bool {
    urls.iter().map(AsRef::as_ref).any(|u| {
        u == "*" || u == path || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*')))
    })
}

/// What kube-apiserver's bootstrap ClusterRoles and bindings allow that
/// concerns this server, with the reason its RBAC authorizer gives: the
/// kubelets' CSRs, `system:basic-user` (an authenticated user may ask
/// what they may do), `system:discovery` and `system:public-info-viewer`
/// (`get` on the discovery and health URLs). A chart never grants these,
/// so they are not in the report.
fn bootstrap(user: &User, a: &Attributes) -> Option<String> {
    let authenticated = user.groups.iter().any(|g| g == AUTHENTICATED);
    let by = |role: &str| {
        format!(
            "RBAC: allowed by ClusterRoleBinding {role:?} of ClusterRole {role:?} to Group {AUTHENTICATED:?}"
        )
    };
    if kubelet_bootstrap(user, a) {
        return Some(String::new());
    }
    match &a.path {
        None if authenticated
            && a.verb == "create"
            && a.group == "authorization.k8s.io"
            && BASIC_USER_REVIEWS.contains(&a.resource.as_str()) =>
        {
            Some(by("system:basic-user"))
        }
        Some(path) if a.verb == "get" && authenticated && url_matches(DISCOVERY_URLS, path) => {
            Some(by("system:discovery"))
        }
        Some(path) if a.verb == "get" && url_matches(PUBLIC_INFO_URLS, path) => {
            Some(if authenticated {
                by("system:public-info-viewer")
            } else {
                "RBAC: allowed by ClusterRoleBinding \"system:public-info-viewer\" of ClusterRole \"system:public-info-viewer\" to Group \"system:unauthenticated\"".to_owned()
            })
        }
        _ => None,
    }
}

/// The rules [`bootstrap`] stands for, as a rules review lists them:
/// (resource rules, non-resource rules).
fn bootstrap_rules(user: &User) -> (Vec<Value>, Vec<Value>) {
    let (mut resource, mut non_resource) = (Vec::new(), Vec::new());
    if user.groups.iter().any(|g| g == AUTHENTICATED) {
        resource.push(json!({"verbs": ["create"], "apiGroups": ["authorization.k8s.io"], "resources": BASIC_USER_REVIEWS}));
        non_resource.push(json!({"verbs": ["get"], "nonResourceURLs": DISCOVERY_URLS}));
    }
    if user.groups.iter().any(|g| g == "system:nodes") {
        resource.push(json!({"verbs": ["create", "get", "list", "watch"], "apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"]}));
    }
    non_resource.push(json!({"verbs": ["get"], "nonResourceURLs": PUBLIC_INFO_URLS}));
    (resource, non_resource)
}

/// What a request asks to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    /// `nodes` or `nodes/status`.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// A non-resource request's path (`/healthz`), for which only `verb`
    /// counts; `None` for a resource.
    pub path: Option<String>,
}

impl Attributes {
    /// A request on a resource.
    pub fn resource(
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Self {
        Self {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            namespace: namespace.map(Into::into),
            name: name.map(Into::into),
            path: None,
        }
    }

    /// A request on a non-resource URL: the verb is the HTTP method's,
    /// lower case, as kube-apiserver names it.
    pub fn non_resource(method: &str, path: &str) -> Self {
        Self {
            verb: method.to_ascii_lowercase(),
            group: String::new(),
            resource: String::new(),
            namespace: None,
            name: None,
            path: Some(path.into()),
        }
    }
}

#[derive(Clone, Debug)]
struct Rule {
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    resource_names: Vec<String>,
    non_resource_urls: Vec<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn matches(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

impl Rule {
    fn from_json(v: &Value) -> Self {
        Self {
            api_groups: strings(&v["apiGroups"]),
            resources: strings(&v["resources"]),
            verbs: strings(&v["verbs"]),
            resource_names: strings(&v["resourceNames"]),
            non_resource_urls: strings(&v["nonResourceURLs"]),
        }
    }

    /// Whether the rule allows `a`, matching as kube-apiserver's RBAC
    /// does: `*` matches any verb, group or resource, `*/SUB` any
    /// resource's subresource SUB, and a URL ending in `*` any path it
    /// begins.
    fn allows(&self, a: &Attributes) -> bool {
        if let Some(path) = &a.path {
            return matches(&self.verbs, &a.verb) && url_matches(&self.non_resource_urls, path);
        }
        let sub = a.resource.split_once('/').map(|(_, sub)| sub);
        let resource = self.resources.iter().any(|r| {
            r == "*" || *r == a.resource || sub.is_some_and(|sub| r.strip_prefix("*/") == Some(sub))
        });
        matches(&self.api_groups, &a.group)
            && matches(&self.verbs, &a.verb)
            && resource
            && (self.resource_names.is_empty()
                || a.name
                    .as_ref()
                    .is_some_and(|n| self.resource_names.contains(n)))
    }
}

#[derive(Clone, Debug)]
struct Role {
    /// `Role` or `ClusterRole`.
    kind: String,
    namespace: String,
    name: String,
    rules: Vec<Rule>,
    /// One of kube-apiserver's own (see [`bootstrap_roles`]), not the
    /// manifests': its grants are never reported unused, since no chart
    /// can take them back.
    bootstrap: bool,
}

impl Role {
    /// `ClusterRole/NAME` or `Role/NAMESPACE/NAME`: what a grant is
    /// remembered by, whatever roles come and go.
    fn id(&self) -> String {
        if self.kind == "Role" {
            format!("Role/{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}", self.kind, self.name)
        }
    }
}

/// The roles of kube-apiserver's bootstrap policy that aggregated API
/// servers are bound to (by the manifests' bindings, as kube-apiserver
/// has no bindings of them to anyone): `system:auth-delegator` (delegate
/// authentication and authorization with TokenReviews and
/// SubjectAccessReviews) and `kube-system/extension-apiserver-authentication-reader`
/// (read the front proxy's ConfigMap, see `front_proxy`).
fn bootstrap_roles() -> Vec<Role> {
    let role = |kind: &str, namespace: &str, name: &str, rules: Value| Role {
        kind: kind.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        rules: rules
            .as_array()
            .into_iter()
            .flatten()
            .map(Rule::from_json)
            .collect(),
        bootstrap: true,
    };
    vec![
        role(
            "ClusterRole",
            "",
            "system:auth-delegator",
            json!([
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
            ]),
        ),
        role(
            "Role",
            crate::front_proxy::CONFIG_MAP_NAMESPACE,
            "extension-apiserver-authentication-reader",
            json!([{
                "apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": [crate::front_proxy::CONFIG_MAP],
                "verbs": ["get", "list", "watch"],
            }]),
        ),
    ]
}

#[derive(Clone, Debug)]
struct Binding {
    name: String,
    /// `None` for a ClusterRoleBinding.
    namespace: Option<String>,
    role_kind: String,
    role_name: String,
    subjects: Vec<Value>,
}

impl Binding {
    /// A ServiceAccount subject's namespace: its own, else the binding's.
    fn subject_namespace<'a>(&'a self, s: &'a Value) -> &'a str {
        s["namespace"]
            .as_str()
            .or(self.namespace.as_deref())
            .unwrap_or_default()
    }

    /// The first subject that is `user`, if any.
    fn subject_for(&self, user: &User) -> Option<&Value> {
        self.subjects.iter().find(|s| {
            let name = s["name"].as_str().unwrap_or_default();
            match s["kind"].as_str().unwrap_or_default() {
                "ServiceAccount" => {
                    let ns = self.subject_namespace(s);
                    user.username == format!("system:serviceaccount:{ns}:{name}")
                }
                "User" => user.username == name,
                "Group" => user.groups.iter().any(|g| g == name),
                _ => false,
            }
        })
    }

    /// Why a grant through this binding to `subject` allows a request, as
    /// kube-apiserver's RBAC authorizer words it.
    fn reason(&self, subject: &Value) -> String {
        let kind = subject["kind"].as_str().unwrap_or_default();
        let name = subject["name"].as_str().unwrap_or_default();
        let who = match kind {
            "ServiceAccount" => format!(
                "{kind} {:?}",
                format!("{name}/{}", self.subject_namespace(subject))
            ),
            _ => format!("{kind} {name:?}"),
        };
        let binding = match &self.namespace {
            None => format!("ClusterRoleBinding {:?}", self.name),
            Some(ns) => format!("RoleBinding {:?}", format!("{}/{ns}", self.name)),
        };
        format!(
            "RBAC: allowed by {binding} of {} {:?} to {who}",
            self.role_kind, self.role_name
        )
    }
}

/// One grant: a verb on a resource by one rule of one role (its id).
type Grant = (String, usize, String, String);

/// The policy and what it saw.
#[derive(Debug, Default)]
pub struct Rbac {
    roles: Vec<Role>,
    bindings: Vec<Binding>,
    used: BTreeSet<Grant>,
    denied: Vec<Value>,
}

impl Rbac {
    /// Loads every Role, ClusterRole, RoleBinding and ClusterRoleBinding
    /// among `objects`; anything else is ignored.
    pub fn from_objects(objects: &[Value]) -> Self {
        let mut rbac = Self::default();
        for o in objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            let namespace = o["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned();
            let name = o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            match kind {
                "Role" | "ClusterRole" => rbac.roles.push(Role {
                    kind: kind.to_owned(),
                    namespace: if kind == "Role" {
                        namespace
                    } else {
                        String::new()
                    },
                    name,
                    rules: o["rules"]
                        .as_array()
                        .map(|r| r.iter().map(Rule::from_json).collect())
                        .unwrap_or_default(),
                    bootstrap: false,
                }),
                "RoleBinding" | "ClusterRoleBinding" => rbac.bindings.push(Binding {
                    name,
                    namespace: (kind == "RoleBinding").then_some(namespace),
                    role_kind: o["roleRef"]["kind"].as_str().unwrap_or_default().to_owned(),
                    role_name: o["roleRef"]["name"].as_str().unwrap_or_default().to_owned(),
                    subjects: o["subjects"].as_array().cloned().unwrap_or_default(),
                }),
                _ => {}
            }
        }
        // kube-apiserver keeps its own roles whatever is applied; a
        // manifest's role of the same name is the one here, as if it had
        // been reconciled into it.
        for role in bootstrap_roles() {
            let defined = rbac.roles.iter().any(|r| {
                r.kind == role.kind && r.name == role.name && r.namespace == role.namespace
            });
            if !defined {
                rbac.roles.push(role);
            }
        }
        rbac
    }

    /// The bindings that apply to `user` where `namespace` is (every
    /// ClusterRoleBinding, then the RoleBindings of the namespace, as
    /// kube-apiserver visits them), each with the subject that is the user
    /// and the index of the role it names.
    fn bound<'a>(
        &'a self,
        user: &'a User,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a Binding, &'a Value, usize)> + 'a {
        let cluster = self.bindings.iter().filter(|b| b.namespace.is_none());
        // A RoleBinding grants only inside its namespace, whatever the
        // role it names.
        let local = self
            .bindings
            .iter()
            .filter(move |b| b.namespace.is_some() && b.namespace.as_deref() == namespace);
        cluster.chain(local).filter_map(move |b| {
            let subject = b.subject_for(user)?;
            let role = self.roles.iter().position(|r| {
                r.kind == b.role_kind
                    && r.name == b.role_name
                    && (r.kind == "ClusterRole" || Some(&r.namespace) == b.namespace.as_ref())
            })?;
            Some((b, subject, role))
        })
    }

    /// Whether `user` may do `a`: the reason kube-apiserver gives and every
    /// grant that allows it, or `None`. Records nothing.
    fn decide(&self, user: &User, a: &Attributes) -> Option<(String, Vec<Grant>)> {
        if user.is_master() {
            // kube-apiserver's privileged-group authorizer gives no reason.
            return Some((String::new(), Vec::new()));
        }
        if let Some(reason) = bootstrap(user, a) {
            return Some((reason, Vec::new()));
        }
        let mut reason = None;
        let mut grants = Vec::new();
        for (binding, subject, role) in self.bound(user, a.namespace.as_deref()) {
            for (i, rule) in self.roles[role].rules.iter().enumerate() {
                if rule.allows(a) {
                    reason.get_or_insert_with(|| binding.reason(subject));
                    grants.push((self.roles[role].id(), i, a.verb.clone(), a.resource.clone()));
                }
            }
        }
        reason.map(|r| (r, grants))
    }

    /// The policy of `objects` (the API's RBAC objects as they stand now),
    /// remembering what this one saw: the grants used and the refusals.
    pub fn reloaded(&self, objects: &[Value]) -> Self {
        Self {
            used: self.used.clone(),
            denied: self.denied.clone(),
            ..Self::from_objects(objects)
        }
    }

    /// Whether `user` may do `a`, and why, without acting on it: neither a
    /// refusal nor a use of a grant is recorded. This answers access
    /// reviews, which are questions, not requests.
    pub fn check(&self, user: &User, a: &Attributes) -> (bool, String) {
        match self.decide(user, a) {
            Some((reason, _)) => (true, reason),
            None => (false, String::new()),
        }
    }

    /// Whether `user` may do `a`; records the grants used or the refusal.
    pub fn authorize(&mut self, user: &User, a: &Attributes) -> bool {
        match self.decide(user, a) {
            Some((_, grants)) => {
                self.used.extend(grants);
                true
            }
            None => {
                self.denied.push(json!({
                    "user": user.username, "verb": a.verb, "group": a.group,
                    "resource": a.resource, "namespace": a.namespace, "name": a.name,
                }));
                false
            }
        }
    }

    /// What `user` may do in `namespace` (cluster-wide grants included),
    /// as a SelfSubjectRulesReview's status lists it: the rules of every
    /// role bound to the user, each split into its resource and
    /// non-resource parts, after the bootstrap policy's. Records nothing.
    pub fn rules_for(&self, user: &User, namespace: &str) -> Value {
        let (mut resource, mut non_resource) = if user.is_master() {
            everything()
        } else {
            (Vec::new(), Vec::new())
        };
        let (boot_resource, boot_non_resource) = bootstrap_rules(user);
        resource.extend(boot_resource);
        non_resource.extend(boot_non_resource);
        let namespace = (!namespace.is_empty()).then_some(namespace);
        for (_, _, role) in self.bound(user, namespace) {
            for rule in &self.roles[role].rules {
                if !rule.resources.is_empty() {
                    let mut r = json!({"verbs": rule.verbs, "apiGroups": rule.api_groups, "resources": rule.resources});
                    if !rule.resource_names.is_empty() {
                        r["resourceNames"] = json!(rule.resource_names);
                    }
                    resource.push(r);
                }
                if !rule.non_resource_urls.is_empty() {
                    non_resource.push(
                        json!({"verbs": rule.verbs, "nonResourceURLs": rule.non_resource_urls}),
                    );
                }
            }
        }
        json!({"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": false})
    }

    /// Every refusal so far, and every (rule, verb, resource) grant of the
    /// policy's own roles that no request used. The bootstrap roles the
    /// policy's bindings name grant as the manifests' do, but are neither
    /// counted nor reported: the manifests cannot change them.
    pub fn report(&self) -> Value {
        let mut unused = Vec::new();
        for role in self.roles.iter().filter(|r| !r.bootstrap) {
            let id = role.id();
            for (i, rule) in role.rules.iter().enumerate() {
                for verb in &rule.verbs {
                    for resource in &rule.resources {
                        if !self
                            .used
                            .contains(&(id.clone(), i, verb.clone(), resource.clone()))
                        {
                            unused.push(json!({
                                "role": format!("{}/{}", role.kind, role.name),
                                "rule": i, "verb": verb, "resource": resource,
                                "apiGroups": rule.api_groups,
                                "resourceNames": rule.resource_names,
                            }));
                        }
                    }
                }
            }
        }
        let roles = self.roles.iter().filter(|r| !r.bootstrap).count();
        json!({"denied": self.denied, "unused": unused, "roles": roles, "bindings": self.bindings.len()})
    }
}

/// Every verb on everything: what a rules review lists for a member of
/// `system:masters`, or for anyone while RBAC is off.
pub fn everything() -> (Vec<Value>, Vec<Value>) {
    (
        vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
        vec![json!({"verbs": ["*"], "nonResourceURLs": ["*"]})],
    )
}

/// The message a real server gives for a refusal.
pub fn forbidden_message(user: &User, a: &Attributes) -> String {
    let what = match &a.name {
        Some(name) => format!("{} {name:?}", a.resource),
        None => a.resource.clone(),
    };
    let scope = match &a.namespace {
        Some(ns) => format!("in the namespace {ns:?}"),
        None => "at the cluster scope".to_owned(),
    };
    format!(
        "{what} is forbidden: User {:?} cannot {} resource {:?} in API group {:?} {scope}",
        user.username, a.verb, a.resource, a.group
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Rbac {
        let docs: Vec<Value> = serde_norway::from_str::<Vec<Value>>(
            r#"
- kind: ClusterRole
  metadata: {name: nodes}
  rules:
    - {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
    - {apiGroups: [""], resources: [nodes/status], verbs: [patch]}
- kind: ClusterRoleBinding
  metadata: {name: nodes}
  roleRef: {kind: ClusterRole, name: nodes}
  subjects: [{kind: ServiceAccount, name: ctl, namespace: kube-system}]
- kind: Role
  metadata: {name: lease, namespace: kube-system}
  rules:
    - {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, update], resourceNames: [mine]}
- kind: RoleBinding
  metadata: {name: lease, namespace: kube-system}
  roleRef: {kind: Role, name: lease}
  subjects: [{kind: ServiceAccount, name: ctl}]
"#,
        )
        .unwrap();
        Rbac::from_objects(&docs)
    }

    fn ask(
        verb: &str,
        group: &str,
        resource: &str,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> Attributes {
        Attributes::resource(verb, group, resource, ns, name)
    }

    #[test]
    fn bindings_grant_only_what_their_rules_say_where_they_say() {
        let mut rbac = policy();
        let ctl = User {
            username: "system:serviceaccount:kube-system:ctl".into(),
            groups: vec!["system:serviceaccounts".into()],
        };
        let other = User {
            username: "system:serviceaccount:default:ctl".into(),
            groups: vec![],
        };
        let lease = "coordination.k8s.io";
        let cases = [
            (&ctl, ask("list", "", "nodes", None, None), true),
            (
                &ctl,
                ask("patch", "", "nodes/status", None, Some("n")),
                true,
            ),
            (&ctl, ask("patch", "", "nodes", None, Some("n")), false),
            (&ctl, ask("delete", "", "nodes", None, Some("n")), false),
            (
                &ctl,
                ask("get", lease, "leases", Some("kube-system"), Some("mine")),
                true,
            ),
            (
                &ctl,
                ask("get", lease, "leases", Some("kube-system"), Some("theirs")),
                false,
            ),
            (
                &ctl,
                ask("get", lease, "leases", Some("default"), Some("mine")),
                false,
            ),
            (&other, ask("list", "", "nodes", None, None), false),
        ];
        for (user, a, want) in cases {
            assert_eq!(
                rbac.authorize(user, &a),
                want,
                "{a:?} for {}",
                user.username
            );
        }
        let report = rbac.report();
        assert_eq!(report["denied"].as_array().unwrap().len(), 5);
        let unused: Vec<String> = report["unused"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| {
                format!(
                    "{} {}",
                    u["verb"].as_str().unwrap(),
                    u["resource"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(unused, ["get nodes", "watch nodes", "update leases"]);
    }

    #[test]
    fn bindings_to_bootstrap_roles_grant_what_kube_apiserver_s_roles_grant() {
        let docs: Vec<Value> = serde_norway::from_str(
            r#"
- kind: ClusterRoleBinding
  metadata: {name: diag:auth-delegator}
  roleRef: {kind: ClusterRole, name: "system:auth-delegator"}
  subjects: [{kind: ServiceAccount, name: diag, namespace: kube-system}]
- kind: RoleBinding
  metadata: {name: diag:auth-reader, namespace: kube-system}
  roleRef: {kind: Role, name: extension-apiserver-authentication-reader}
  subjects: [{kind: ServiceAccount, name: diag, namespace: kube-system}]
"#,
        )
        .unwrap();
        let mut rbac = Rbac::from_objects(&docs);
        let diag = User {
            username: "system:serviceaccount:kube-system:diag".into(),
            groups: vec!["system:serviceaccounts".into()],
        };
        let other = User {
            username: "system:serviceaccount:kube-system:other".into(),
            groups: vec!["system:serviceaccounts".into()],
        };
        let config_map = Some(crate::front_proxy::CONFIG_MAP);
        let cases = [
            (
                &diag,
                ask(
                    "create",
                    "authentication.k8s.io",
                    "tokenreviews",
                    None,
                    None,
                ),
                true,
            ),
            (
                &diag,
                ask(
                    "create",
                    "authorization.k8s.io",
                    "subjectaccessreviews",
                    None,
                    None,
                ),
                true,
            ),
            (
                &diag,
                ask("get", "", "configmaps", Some("kube-system"), config_map),
                true,
            ),
            (
                &diag,
                ask("watch", "", "configmaps", Some("kube-system"), config_map),
                true,
            ),
            (
                &diag,
                ask("list", "", "configmaps", Some("kube-system"), None),
                false,
            ),
            (
                &diag,
                ask("get", "", "configmaps", Some("kube-system"), Some("other")),
                false,
            ),
            (
                &diag,
                ask("get", "", "configmaps", Some("default"), config_map),
                false,
            ),
            (
                &other,
                ask(
                    "create",
                    "authentication.k8s.io",
                    "tokenreviews",
                    None,
                    None,
                ),
                false,
            ),
        ];
        for (user, a, want) in cases {
            assert_eq!(
                rbac.authorize(user, &a),
                want,
                "{a:?} for {}",
                user.username
            );
        }
        let (allowed, reason) = rbac.check(
            &diag,
            &ask(
                "create",
                "authentication.k8s.io",
                "tokenreviews",
                None,
                None,
            ),
        );
        assert!(allowed);
        assert_eq!(
            reason,
            "RBAC: allowed by ClusterRoleBinding \"diag:auth-delegator\" of ClusterRole \"system:auth-delegator\" to ServiceAccount \"diag/kube-system\""
        );
        let report = rbac.report();
        assert_eq!(report["unused"], json!([]), "{report}");
        assert_eq!(report["roles"], 0);
        assert_eq!(report["bindings"], 2);
    }
}
