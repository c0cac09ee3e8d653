//! Object validation against the Kubernetes API types (k8s-openapi), and
//! the OpenAPI v3 documents kubectl reads: to learn that this server
//! validates fields itself (`fieldValidation`), and to explain a kind's
//! fields (`kubectl explain`), with schemas read off the same types (see
//! `openapi`).
//!
//! An object is decoded into its typed form: a wrong type is an error. With
//! `fieldValidation=Strict`, a field the typed form does not keep is an
//! unknown field and an error; with `Warn` (the default) it is a warning.
//! A custom resource (`resources::Resource::custom`: a CRD's in a real
//! cluster), or a kind newer than the types here, has no type: it is kept
//! as written, and its document describes only the fields every object
//! has.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::openapi;
use super::resources::{RESOURCES, Resource};

/// Something done with the k8s-openapi type of a kind (see [`for_kind`]).
trait WithType {
    type Out;
    fn with<T: DeserializeOwned + Serialize + k8s_openapi::Resource>(self) -> Self::Out;
}

/// Does `f` with the k8s-openapi type of `group`'s `kind`; `None` for a
/// kind without one here.
fn for_kind<F: WithType>(group: &str, kind: &str, f: F) -> Option<F::Out> {
    use k8s_openapi::api::{
        apps, authentication, authorization, batch, certificates, coordination, core, discovery,
        events, policy, rbac, storage,
    };
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration;
    Some(match (group, kind) {
        ("", "Node") => f.with::<core::v1::Node>(),
        ("", "Service") => f.with::<core::v1::Service>(),
        ("", "Event") => f.with::<core::v1::Event>(),
        ("", "Namespace") => f.with::<core::v1::Namespace>(),
        ("", "Pod") => f.with::<core::v1::Pod>(),
        ("", "Endpoints") => f.with::<core::v1::Endpoints>(),
        ("", "ConfigMap") => f.with::<core::v1::ConfigMap>(),
        ("", "ServiceAccount") => f.with::<core::v1::ServiceAccount>(),
        ("", "ReplicationController") => f.with::<core::v1::ReplicationController>(),
        ("", "PersistentVolume") => f.with::<core::v1::PersistentVolume>(),
        ("", "PersistentVolumeClaim") => f.with::<core::v1::PersistentVolumeClaim>(),
        ("apps", "Deployment") => f.with::<apps::v1::Deployment>(),
        ("apps", "ReplicaSet") => f.with::<apps::v1::ReplicaSet>(),
        ("apps", "StatefulSet") => f.with::<apps::v1::StatefulSet>(),
        ("apps", "DaemonSet") => f.with::<apps::v1::DaemonSet>(),
        ("batch", "Job") => f.with::<batch::v1::Job>(),
        ("policy", "PodDisruptionBudget") => f.with::<policy::v1::PodDisruptionBudget>(),
        ("storage.k8s.io", "StorageClass") => f.with::<storage::v1::StorageClass>(),
        ("storage.k8s.io", "CSIDriver") => f.with::<storage::v1::CSIDriver>(),
        ("storage.k8s.io", "CSINode") => f.with::<storage::v1::CSINode>(),
        ("storage.k8s.io", "CSIStorageCapacity") => f.with::<storage::v1::CSIStorageCapacity>(),
        ("storage.k8s.io", "VolumeAttachment") => f.with::<storage::v1::VolumeAttachment>(),
        ("rbac.authorization.k8s.io", "ClusterRole") => f.with::<rbac::v1::ClusterRole>(),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            f.with::<rbac::v1::ClusterRoleBinding>()
        }
        ("rbac.authorization.k8s.io", "Role") => f.with::<rbac::v1::Role>(),
        ("rbac.authorization.k8s.io", "RoleBinding") => f.with::<rbac::v1::RoleBinding>(),
        ("apiregistration.k8s.io", "APIService") => f.with::<apiregistration::v1::APIService>(),
        ("events.k8s.io", "Event") => f.with::<events::v1::Event>(),
        ("coordination.k8s.io", "Lease") => f.with::<coordination::v1::Lease>(),
        ("discovery.k8s.io", "EndpointSlice") => f.with::<discovery::v1::EndpointSlice>(),
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            f.with::<certificates::v1::CertificateSigningRequest>()
        }
        ("authentication.k8s.io", "TokenReview") => f.with::<authentication::v1::TokenReview>(),
        ("authorization.k8s.io", "SubjectAccessReview") => {
            f.with::<authorization::v1::SubjectAccessReview>()
        }
        ("authorization.k8s.io", "LocalSubjectAccessReview") => {
            f.with::<authorization::v1::LocalSubjectAccessReview>()
        }
        ("authorization.k8s.io", "SelfSubjectAccessReview") => {
            f.with::<authorization::v1::SelfSubjectAccessReview>()
        }
        ("authorization.k8s.io", "SelfSubjectRulesReview") => {
            f.with::<authorization::v1::SelfSubjectRulesReview>()
        }
        _ => return None,
    })
}

/// Decodes an object into its type and encodes it again.
struct RoundTrip<'a>(&'a Value);

impl WithType for RoundTrip<'_> {
    type Out = Result<Value, String>;

    fn with<T: DeserializeOwned + Serialize + k8s_openapi::Resource>(self) -> Self::Out {
        // From the borrowed value: no copy of the whole object per write.
        let typed = T::deserialize(self.0).map_err(|e| e.to_string())?;
        serde_json::to_value(typed).map_err(|e| e.to_string())
    }
}

/// Decodes `obj` as its kind; the typed form re-encoded, or the error.
fn typed(kind: &str, group: &str, obj: &Value) -> Result<Option<Value>, String> {
    for_kind(group, kind, RoundTrip(obj)).transpose()
}

/// Reads a type's schemas (see `openapi`).
struct Trace;

impl WithType for Trace {
    type Out = Result<openapi::Types, String>;

    fn with<T: DeserializeOwned + Serialize + k8s_openapi::Resource>(self) -> Self::Out {
        openapi::trace::<T>()
    }
}

/// Paths present in `given` but not in `kept`.
fn unknown_fields(prefix: &str, given: &Value, kept: &Value, out: &mut Vec<String>) {
    match (given, kept) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, value) in g {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                match k.get(key) {
                    Some(kept_value) => unknown_fields(&path, value, kept_value, out),
                    // Nulls and empty values may be dropped on the way out.
                    None if value.is_null() || value == &json!({}) || value == &json!([]) => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                unknown_fields(&format!("{prefix}[{i}]"), gv, kv, out);
            }
        }
        _ => {}
    }
}

/// How strictly unknown fields are treated (`fieldValidation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("Strict") => Self::Strict,
            Some("Ignore") => Self::Ignore,
            _ => Self::Warn,
        }
    }
}

/// Checks `obj`; returns the object as it is stored (unknown fields
/// dropped, as the real server does) with warnings, or the error message.
pub fn validate(
    resource: &Resource,
    obj: &Value,
    mode: FieldValidation,
) -> Result<(Value, Vec<String>), String> {
    let Some(kept) = typed(resource.kind, resource.group, obj)? else {
        return Ok((obj.clone(), Vec::new()));
    };
    let mut unknown = Vec::new();
    unknown_fields("", obj, &kept, &mut unknown);
    unknown.retain(|f| !f.starts_with("metadata.managedFields"));
    let messages: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    match mode {
        FieldValidation::Strict if !messages.is_empty() => {
            Err(format!("strict decoding error: {}", messages.join(", ")))
        }
        FieldValidation::Warn => Ok((kept, messages)),
        _ => Ok((kept, Vec::new())),
    }
}

fn gv_path(r: &Resource) -> String {
    if r.group.is_empty() {
        format!("api/{}", r.version)
    } else {
        format!("apis/{}/{}", r.group, r.version)
    }
}

/// Every group version's document, by its path (`api/v1`), made once.
fn documents() -> &'static BTreeMap<String, Value> {
    static DOCUMENTS: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    DOCUMENTS.get_or_init(|| {
        let paths: std::collections::BTreeSet<String> = RESOURCES.iter().map(gv_path).collect();
        paths
            .into_iter()
            .filter_map(|gv| Some((gv.clone(), document(&gv)?)))
            .collect()
    })
}

/// `/openapi/v3`: where each group version's document is, with a hash of
/// it, as clients cache them by it.
pub fn openapi_root() -> Value {
    let mut paths = serde_json::Map::new();
    for (gv, doc) in documents() {
        let mut hasher = std::hash::DefaultHasher::new();
        doc.to_string().hash(&mut hasher);
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={:016X}", hasher.finish())}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<group version>`.
pub fn openapi_group_version(gv: &str) -> Option<Value> {
    documents().get(gv).cloned()
}

/// The document of the group version at `gv`: the operations kubectl
/// looks for, each with the kind it acts on (a PATCH with its
/// `fieldValidation` parameter, which tells kubectl this server checks
/// fields itself; a POST for the reviews), and the schemas of the kinds
/// and everything they hold.
fn document(gv: &str) -> Option<Value> {
    let served: Vec<&Resource> = RESOURCES.iter().filter(|r| gv_path(r) == gv).collect();
    let first = served.first()?;
    let mut paths = serde_json::Map::new();
    let mut traced = Vec::new();
    let mut untyped = Vec::new();
    for r in &served {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let prefix = if r.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("/{gv}/{}", r.plural)
        };
        let parameters = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
        ]);
        let patch = json!({
            "operationId": format!("patch{}", r.kind),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
            "parameters": parameters,
            "responses": {"200": {"description": "OK"}},
        });
        if r.create_only {
            paths.insert(
                prefix.clone(),
                json!({"post": {
                    "operationId": format!("create{}", r.kind),
                    "x-kubernetes-action": "post",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": parameters,
                    "responses": {"201": {"description": "Created"}},
                }}),
            );
        }
        // kubectl learns from a kind's PATCH operation whether the server
        // checks fields itself; if not, it checks them with OpenAPI v2,
        // which this server does not serve. So the reviews, which cannot
        // be patched (405), are listed with one too: `kubectl create -f`
        // of a review then works, and the server checks its fields.
        paths.insert(format!("{prefix}/{{name}}"), json!({"patch": patch}));
        match for_kind(r.group, r.kind, Trace) {
            Some(Ok(types)) => traced.push((r.kind, types)),
            Some(Err(e)) => tracing::warn!(kind = r.kind, error = %e, "no schema"),
            None => untyped.push(r),
        }
    }
    let kinds: Vec<(&str, &openapi::Types)> = traced.iter().map(|(k, t)| (*k, t)).collect();
    let mut schemas = openapi::components(first.group, first.version, &kinds);
    // The custom resources, and the kinds newer than the types here: the
    // fields every object has.
    for r in untyped {
        let (name, schema) = openapi::custom_schema(r.group, r.version, r.kind);
        schemas.insert(name, schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> &'static Resource {
        super::super::resources::find("", "v1", "nodes").unwrap()
    }

    #[test]
    fn unknown_fields_are_errors_when_strict_and_warnings_otherwise() {
        let obj = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24", "flavour": "x"}});
        let err = validate(node(), &obj, FieldValidation::Strict).unwrap_err();
        assert!(err.contains("unknown field \"spec.flavour\""), "{err}");
        let (stored, warnings) = validate(node(), &obj, FieldValidation::Warn).unwrap();
        assert_eq!(warnings, ["unknown field \"spec.flavour\""]);
        assert!(
            stored["spec"].get("flavour").is_none(),
            "unknown fields are not stored"
        );
        assert_eq!(stored["spec"]["podCIDR"], "10.0.0.0/24");
        assert!(
            validate(node(), &obj, FieldValidation::Ignore)
                .unwrap()
                .1
                .is_empty()
        );
    }

    /// Built-in kinds newer than the k8s-openapi types here (1.32's),
    /// kept as written as a custom resource is: `(group, kind)`.
    const NEWER_THAN_THE_TYPES: &[(&str, &str)] = &[("storage.k8s.io", "VolumeAttributesClass")];

    #[test]
    fn every_served_kind_is_validated_and_explained_by_its_own_type() {
        for r in RESOURCES.iter().filter(|r| !r.custom) {
            let newer = NEWER_THAN_THE_TYPES.contains(&(r.group, r.kind));
            match for_kind(r.group, r.kind, Trace) {
                Some(Ok(_)) if newer => {
                    panic!("{} has a type now: drop it from the newer", r.qualified())
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("{} does not trace: {e}", r.qualified()),
                None if newer => {}
                None => panic!("{} has no type", r.qualified()),
            }
        }
    }

    #[test]
    fn each_kind_has_a_schema_kubectl_explain_finds_by_its_group_version_kind() {
        let doc = openapi_group_version("api/v1").unwrap();
        let schemas = &doc["components"]["schemas"];
        let service = &schemas["io.k8s.api.core.v1.Service"];
        assert_eq!(
            service["x-kubernetes-group-version-kind"],
            json!([{"group": "", "kind": "Service", "version": "v1"}])
        );
        assert_eq!(
            service["properties"]["spec"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.ServiceSpec"
        );
        let spec = &schemas["io.k8s.api.core.v1.ServiceSpec"]["properties"];
        assert_eq!(spec["type"]["type"], "string");
        assert_eq!(spec["ports"]["type"], "array");
        assert_eq!(
            spec["ports"]["items"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.ServicePort"
        );
        assert_eq!(spec["loadBalancerClass"]["type"], "string");
        let taints = &schemas["io.k8s.api.core.v1.NodeSpec"]["properties"]["taints"];
        assert_eq!(
            taints["items"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.Taint"
        );
        assert_eq!(
            schemas["io.k8s.apimachinery.pkg.apis.meta.v1.Time"]["format"],
            "date-time"
        );
        // Every reference resolves.
        let text = doc.to_string();
        for piece in text.split("#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(
                schemas.get(name).is_some(),
                "{name} is referenced but missing"
            );
        }
        assert_eq!(
            doc["paths"]["/api/v1/namespaces/{namespace}/services/{name}"]["patch"]["x-kubernetes-group-version-kind"]
                ["kind"],
            "Service"
        );
        let lease = openapi_group_version("apis/coordination.k8s.io/v1").unwrap();
        let spec = &lease["components"]["schemas"]["io.k8s.api.coordination.v1.LeaseSpec"];
        assert_eq!(spec["properties"]["holderIdentity"]["type"], "string");
        assert_eq!(
            spec["properties"]["renewTime"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime"
        );
        let root = openapi_root();
        assert!(
            root["paths"]["apis/authorization.k8s.io/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/apis/authorization.k8s.io/v1?hash=")
        );
    }

    #[test]
    fn custom_resources_are_kept_as_written_and_explained_as_objects_of_their_kind() {
        let custom: Vec<&Resource> = RESOURCES.iter().filter(|r| r.custom).collect();
        assert!(!custom.is_empty());
        for r in custom {
            assert!(
                for_kind(r.group, r.kind, Trace).is_none(),
                "{} is a custom resource but has a type",
                r.qualified()
            );
            let obj = json!({
                "apiVersion": r.api_version(), "kind": r.kind, "metadata": {"name": "x"},
                "spec": {"anything": [1, {"nested": true}]}, "driver": "ebs.csi.aws.com",
            });
            assert_eq!(
                validate(r, &obj, FieldValidation::Strict),
                Ok((obj.clone(), Vec::new())),
                "{} is kept as written",
                r.qualified()
            );
            let doc = openapi_group_version(&gv_path(r)).unwrap();
            let operation = format!(
                "/{}{}/{}/{{name}}",
                gv_path(r),
                if r.namespaced {
                    "/namespaces/{namespace}"
                } else {
                    ""
                },
                r.plural
            );
            let patch = &doc["paths"][&operation]["patch"];
            assert_eq!(
                patch["x-kubernetes-group-version-kind"]["kind"], r.kind,
                "{operation}"
            );
            assert!(
                patch["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["name"] == "fieldValidation"),
                "kubectl leaves the checking of {} to the server",
                r.kind
            );
            let (name, _) = openapi::custom_schema(r.group, r.version, r.kind);
            let schema = &doc["components"]["schemas"][&name];
            assert_eq!(
                schema["x-kubernetes-group-version-kind"],
                json!([{"group": r.group, "kind": r.kind, "version": r.version}]),
                "{name}"
            );
            assert_eq!(schema["x-kubernetes-preserve-unknown-fields"], true);
        }
        let (name, _) = openapi::custom_schema("snapshot.storage.k8s.io", "v1", "VolumeSnapshot");
        assert_eq!(name, "io.k8s.storage.snapshot.v1.VolumeSnapshot");
        assert!(
            openapi_root()["paths"]["apis/snapshot.storage.k8s.io/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/apis/snapshot.storage.k8s.io/v1?hash=")
        );
    }

    #[test]
    fn wrong_types_are_always_errors() {
        let obj = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"unschedulable": "yes"}});
        assert!(validate(node(), &obj, FieldValidation::Ignore).is_err());
    }
}
