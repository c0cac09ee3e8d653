//! `authorization.k8s.io/v1`'s reviews, questions to the authorizer:
//! SubjectAccessReview (may this user, or these groups, do this?),
//! LocalSubjectAccessReview (the same, confined to one namespace),
//! SelfSubjectAccessReview (may I?, which `kubectl auth can-i` asks) and
//! SelfSubjectRulesReview (what may I do here?, `kubectl auth can-i
//! --list`). Each is answered from the RBAC in force (see `rbac`), as
//! kube-apiserver answers it, and stored nowhere. Asking records nothing
//! in the RBAC report: a review is a question, not a request.

use serde_json::{Value, json};

use super::Shared;
use super::rbac::{Attributes, User};
use super::resources::Resource;
use super::store::ApiError;

/// The review `review` of `resource` sent by `caller` (in `namespace`,
/// for a LocalSubjectAccessReview), answered: the review as sent, with
/// its `status`.
pub fn answer(
    shared: &Shared,
    resource: &Resource,
    namespace: &str,
    caller: Option<&User>,
    mut review: Value,
) -> Result<Value, ApiError> {
    let invalid = |message: String| ApiError::invalid(resource, "", message);
    let spec = &review["spec"];
    let status = match resource.plural {
        "selfsubjectrulesreviews" => {
            shared.rules(caller, spec["namespace"].as_str().unwrap_or_default())
        }
        plural => {
            if plural == "localsubjectaccessreviews" {
                local(&review, namespace).map_err(invalid)?;
            }
            let attributes = attributes(spec).map_err(invalid)?;
            let user = match plural {
                "selfsubjectaccessreviews" => caller.cloned(),
                _ => Some(subject(spec).map_err(invalid)?),
            };
            // Without RBAC there is no caller to name, and anyone may do
            // anything.
            let (allowed, reason) = user.map_or((true, String::new()), |user| {
                shared.check(&user, &attributes)
            });
            let mut status = json!({"allowed": allowed});
            if !reason.is_empty() {
                status["reason"] = json!(reason);
            }
            status
        }
    };
    if !review["metadata"].is_object() {
        review["metadata"] = json!({});
    }
    review["metadata"]["creationTimestamp"] = Value::Null;
    if resource.namespaced {
        review["metadata"]["namespace"] = json!(namespace);
    }
    review["apiVersion"] = json!(resource.api_version());
    review["kind"] = json!(resource.kind);
    review["status"] = status;
    Ok(review)
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

fn present<'a>(spec: &'a Value, key: &str) -> Option<&'a Value> {
    spec.get(key).filter(|v| !v.is_null())
}

/// What a SubjectAccessReview's spec asks about, as the authorizer sees
/// a request: the resource with its subresource (`nodes/status`), or a
/// non-resource path. Exactly one of the two may be given.
fn attributes(spec: &Value) -> Result<Attributes, String> {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    match (
        present(spec, "resourceAttributes"),
        present(spec, "nonResourceAttributes"),
    ) {
        (Some(_), Some(_)) => Err(
            "spec.nonResourceAttributes: Invalid value: \"object\": cannot be specified in combination with resourceAttributes".into(),
        ),
        (None, None) => Err(
            "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified".into(),
        ),
        (Some(r), None) => {
            let resource = match text(r, "subresource") {
                "" => text(r, "resource").to_owned(),
                sub => format!("{}/{sub}", text(r, "resource")),
            };
            Ok(Attributes {
                verb: text(r, "verb").into(),
                group: text(r, "group").into(),
                resource,
                namespace: some(text(r, "namespace")),
                name: some(text(r, "name")),
                path: None,
            })
        }
        (None, Some(n)) => Ok(Attributes {
            verb: text(n, "verb").into(),
            group: String::new(),
            resource: String::new(),
            namespace: None,
            name: None,
            path: Some(text(n, "path").into()),
        }),
    }
}

/// The user a SubjectAccessReview asks about: its name and groups as
/// given (no `system:authenticated` is added, as kube-apiserver adds
/// none).
fn subject(spec: &Value) -> Result<User, String> {
    let username = text(spec, "user").to_owned();
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(|g| g.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if username.is_empty() && groups.is_empty() {
        return Err(
            "spec.user: Invalid value: \"\": at least one of user or group must be specified"
                .into(),
        );
    }
    Ok(User { username, groups })
}

/// A LocalSubjectAccessReview asks about its own namespace's resources
/// only.
fn local(review: &Value, namespace: &str) -> Result<(), String> {
    let spec = &review["spec"];
    if present(spec, "nonResourceAttributes").is_some() {
        return Err("spec.nonResourceAttributes: Invalid value: \"object\": disallowed on this kind of request".into());
    }
    if let Some(r) = present(spec, "resourceAttributes")
        && text(r, "namespace") != namespace
    {
        return Err(format!(
            "spec.resourceAttributes.namespace: Invalid value: {:?}: must match metadata.namespace",
            text(r, "namespace")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_asks_about_a_resource_with_its_subresource_or_a_path() {
        let a = attributes(&json!({"resourceAttributes": {"verb": "patch", "resource": "nodes", "subresource": "status", "name": "n1"}})).unwrap();
        assert_eq!(
            a,
            Attributes::resource("patch", "", "nodes/status", None, Some("n1"))
        );
        let a = attributes(&json!({"resourceAttributes": {"verb": "get", "group": "coordination.k8s.io", "resource": "leases", "namespace": "kube-system"}})).unwrap();
        assert_eq!(
            a,
            Attributes::resource(
                "get",
                "coordination.k8s.io",
                "leases",
                Some("kube-system"),
                None
            )
        );
        let a = attributes(&json!({"nonResourceAttributes": {"verb": "get", "path": "/healthz"}}))
            .unwrap();
        assert_eq!(
            (a.verb.as_str(), a.path.as_deref()),
            ("get", Some("/healthz"))
        );
        let both = json!({"resourceAttributes": {}, "nonResourceAttributes": {}});
        assert!(attributes(&both).unwrap_err().contains("in combination"));
        assert!(
            attributes(&json!({}))
                .unwrap_err()
                .contains("exactly one of")
        );
    }

    #[test]
    fn a_subject_is_a_user_or_groups_as_given() {
        let u = subject(&json!({"user": "bob"})).unwrap();
        assert_eq!((u.username.as_str(), u.groups.len()), ("bob", 0));
        let u = subject(&json!({"groups": ["system:masters"]})).unwrap();
        assert!(u.is_master());
        assert!(
            subject(&json!({}))
                .unwrap_err()
                .contains("at least one of user or group")
        );
    }

    #[test]
    fn a_local_review_stays_in_its_namespace() {
        let review = |ns: &str| json!({"spec": {"resourceAttributes": {"verb": "get", "resource": "pods", "namespace": ns}}});
        assert!(local(&review("default"), "default").is_ok());
        assert!(
            local(&review("other"), "default")
                .unwrap_err()
                .contains("must match metadata.namespace")
        );
        let path = json!({"spec": {"nonResourceAttributes": {"verb": "get", "path": "/"}}});
        assert!(local(&path, "default").unwrap_err().contains("disallowed"));
    }
}
