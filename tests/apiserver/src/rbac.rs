//! Role-based access control as the real API server applies it, for tests
//! that prove least privilege: Roles, ClusterRoles and their bindings are
//! loaded from manifests (the Helm chart's, rendered), every request is
//! checked against them, and the server remembers each refusal and which
//! (rule, verb, resource) grants were ever used, so a test can fail on a
//! missing permission and on one nobody needed.

use std::collections::BTreeSet;

use serde_json::{Value, json};

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
    user.groups.iter().any(|g| g == "system:nodes")
        && a.group == "certificates.k8s.io"
        && a.resource == "certificatesigningrequests"
        && matches!(a.verb.as_str(), "create" | "get" | "list" | "watch")
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
}

#[derive(Clone, Debug)]
struct Rule {
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    resource_names: Vec<String>,
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
        }
    }

    fn allows(&self, a: &Attributes) -> bool {
        matches(&self.api_groups, &a.group)
            && matches(&self.verbs, &a.verb)
            && matches(&self.resources, &a.resource)
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
}

#[derive(Clone, Debug)]
struct Binding {
    /// `None` for a ClusterRoleBinding.
    namespace: Option<String>,
    role_kind: String,
    role_name: String,
    subjects: Vec<Value>,
}

impl Binding {
    fn binds(&self, user: &User) -> bool {
        self.subjects.iter().any(|s| {
            let name = s["name"].as_str().unwrap_or_default();
            match s["kind"].as_str().unwrap_or_default() {
                "ServiceAccount" => {
                    let ns = s["namespace"]
                        .as_str()
                        .or(self.namespace.as_deref())
                        .unwrap_or_default();
                    user.username == format!("system:serviceaccount:{ns}:{name}")
                }
                "User" => user.username == name,
                "Group" => user.groups.iter().any(|g| g == name),
                _ => false,
            }
        })
    }
}

/// One grant: a verb on a resource by one rule of one role.
type Grant = (usize, usize, String, String);

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
                }),
                "RoleBinding" | "ClusterRoleBinding" => rbac.bindings.push(Binding {
                    namespace: (kind == "RoleBinding").then_some(namespace),
                    role_kind: o["roleRef"]["kind"].as_str().unwrap_or_default().to_owned(),
                    role_name: o["roleRef"]["name"].as_str().unwrap_or_default().to_owned(),
                    subjects: o["subjects"].as_array().cloned().unwrap_or_default(),
                }),
                _ => {}
            }
        }
        rbac
    }

    /// Whether `user` may do `a`; records the grants used or the refusal.
    pub fn authorize(&mut self, user: &User, a: &Attributes) -> bool {
        if user.is_master() || kubelet_bootstrap(user, a) {
            return true;
        }
        let mut grants = Vec::new();
        for b in self.bindings.iter().filter(|b| b.binds(user)) {
            // A RoleBinding grants only inside its namespace, whatever the
            // role it names.
            if let Some(ns) = &b.namespace
                && a.namespace.as_ref() != Some(ns)
            {
                continue;
            }
            let role = self.roles.iter().position(|r| {
                r.kind == b.role_kind
                    && r.name == b.role_name
                    && (r.kind == "ClusterRole" || Some(&r.namespace) == b.namespace.as_ref())
            });
            let Some(role) = role else { continue };
            for (i, rule) in self.roles[role].rules.iter().enumerate() {
                if rule.allows(a) {
                    grants.push((role, i, a.verb.clone(), a.resource.clone()));
                }
            }
        }
        if grants.is_empty() {
            self.denied.push(json!({
                "user": user.username, "verb": a.verb, "group": a.group,
                "resource": a.resource, "namespace": a.namespace, "name": a.name,
            }));
            return false;
        }
        self.used.extend(grants);
        true
    }

    /// Every refusal so far, and every (rule, verb, resource) grant of the
    /// policy that no request used.
    pub fn report(&self) -> Value {
        let mut unused = Vec::new();
        for (ri, role) in self.roles.iter().enumerate() {
            for (i, rule) in role.rules.iter().enumerate() {
                for verb in &rule.verbs {
                    for resource in &rule.resources {
                        if !self.used.contains(&(ri, i, verb.clone(), resource.clone())) {
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
        json!({"denied": self.denied, "unused": unused, "roles": self.roles.len(), "bindings": self.bindings.len()})
    }
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
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
        }
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
}
