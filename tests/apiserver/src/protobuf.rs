//! Request bodies in Kubernetes' protobuf encoding, which kubectl's typed
//! clients send (`kubectl create namespace`, `kubectl create service`):
//! the `k8s\0` magic, then a `runtime.Unknown` envelope naming the kind
//! around the object's own message. They are decoded with the `k8s-pb`
//! types into the JSON the store keeps. Kinds without a decoder here are
//! refused with 415, naming the encodings accepted.

use std::collections::BTreeMap;

use k8s_pb::api::authentication::v1 as authentication;
use k8s_pb::api::authorization::v1 as authorization;
use k8s_pb::api::certificates::v1 as certificates;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{Map, Value, json};

/// The media type of protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The prefix of every protobuf-encoded Kubernetes object.
const MAGIC: &[u8] = b"k8s\0";

/// Whether a `Content-Type` is the protobuf encoding.
pub fn is_protobuf(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim() == MEDIA_TYPE)
}

/// Why a protobuf body was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a Kubernetes protobuf object (400).
    Malformed(String),
    /// A kind this server does not decode from protobuf (415).
    Unsupported(String),
}

/// Decodes a protobuf body into the object's JSON form.
pub fn decode(body: &[u8]) -> Result<Value, Refused> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| Refused::Malformed("a protobuf body starts with k8s\\0".into()))?;
    let unknown = Unknown::decode(envelope)
        .map_err(|e| Refused::Malformed(format!("not a runtime.Unknown: {e}")))?;
    let meta = unknown.type_meta.unwrap_or_default();
    let (api_version, kind) = (
        meta.api_version.unwrap_or_default(),
        meta.kind.unwrap_or_default(),
    );
    let raw = unknown.raw.unwrap_or_default();
    let mut object = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => namespace(core::Namespace::decode(raw.as_slice()).map_err(bad)?),
        ("v1", "Service") => service(core::Service::decode(raw.as_slice()).map_err(bad)?),
        // `kubectl create serviceaccount` and `kubectl create token`.
        ("v1", "ServiceAccount") => {
            let sa = core::ServiceAccount::decode(raw.as_slice()).map_err(bad)?;
            Obj::default()
                .put("metadata", metadata(sa.metadata))
                .flag(
                    "automountServiceAccountToken",
                    sa.automount_service_account_token,
                )
                .0
        }
        ("authentication.k8s.io/v1", "TokenRequest") => {
            token_request(authentication::TokenRequest::decode(raw.as_slice()).map_err(bad)?)
        }
        // `kubectl certificate approve/deny` sends these.
        ("certificates.k8s.io/v1", "CertificateSigningRequest") => {
            csr(certificates::CertificateSigningRequest::decode(raw.as_slice()).map_err(bad)?)
        }
        // `kubectl auth can-i` asks with these.
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => {
            let r = authorization::SelfSubjectAccessReview::decode(raw.as_slice()).map_err(bad)?;
            let spec = r.spec.unwrap_or_default();
            review(
                r.metadata,
                access_attributes(spec.resource_attributes, spec.non_resource_attributes),
            )
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => {
            let r = authorization::SelfSubjectRulesReview::decode(raw.as_slice()).map_err(bad)?;
            let spec = Obj::default().string("namespace", r.spec.and_then(|s| s.namespace));
            review(r.metadata, spec)
        }
        ("authorization.k8s.io/v1", "SubjectAccessReview") => {
            let r = authorization::SubjectAccessReview::decode(raw.as_slice()).map_err(bad)?;
            review(r.metadata, subject_access(r.spec.unwrap_or_default()))
        }
        ("authorization.k8s.io/v1", "LocalSubjectAccessReview") => {
            let r = authorization::LocalSubjectAccessReview::decode(raw.as_slice()).map_err(bad)?;
            review(r.metadata, subject_access(r.spec.unwrap_or_default()))
        }
        _ => {
            return Err(Refused::Unsupported(format!(
                "{api_version} {kind} cannot be sent as protobuf here; send it as JSON or YAML"
            )));
        }
    };
    object.insert("apiVersion".into(), json!(api_version));
    object.insert("kind".into(), json!(kind));
    Ok(Value::Object(object))
}

fn bad(e: prost::DecodeError) -> Refused {
    Refused::Malformed(format!("the protobuf object does not decode: {e}"))
}

/// Builds a JSON object, leaving out absent and empty fields as the JSON
/// encoding does. Go writes its non-pointer fields to protobuf even when
/// they hold their zero value (`nodePort: 0`), where JSON's `omitempty`
/// leaves them out; so empty strings, zeros and `false` are left out too.
#[derive(Default)]
struct Obj(Map<String, Value>);

impl Obj {
    fn put(mut self, key: &str, value: Option<Value>) -> Self {
        if let Some(value) = value {
            self.0.insert(key.into(), value);
        }
        self
    }

    fn string(self, key: &str, value: Option<String>) -> Self {
        self.put(key, value.filter(|v| !v.is_empty()).map(Value::String))
    }

    fn int(self, key: &str, value: Option<i32>) -> Self {
        self.put(key, value.filter(|v| *v != 0).map(Value::from))
    }

    fn flag(self, key: &str, value: Option<bool>) -> Self {
        self.put(key, value.filter(|v| *v).map(Value::from))
    }

    fn list<T: Into<Value>>(self, key: &str, values: Vec<T>) -> Self {
        let value = (!values.is_empty())
            .then(|| Value::Array(values.into_iter().map(Into::into).collect()));
        self.put(key, value)
    }

    fn map(self, key: &str, values: BTreeMap<String, String>) -> Self {
        let value = (!values.is_empty()).then(|| json!(values));
        self.put(key, value)
    }

    fn value(self) -> Option<Value> {
        (!self.0.is_empty()).then_some(Value::Object(self.0))
    }
}

fn csr(c: certificates::CertificateSigningRequest) -> Map<String, Value> {
    let b64 = |bytes: Option<Vec<u8>>| {
        bytes
            .filter(|b| !b.is_empty())
            .map(|b| data_encoding::BASE64.encode(&b))
    };
    let time = |t: Option<k8s_pb::apimachinery::pkg::apis::meta::v1::Time>| {
        t.and_then(|t| t.seconds)
            .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
            .map(|t| t.to_string())
    };
    let spec = c.spec.unwrap_or_default();
    let status = c.status.unwrap_or_default();
    let conditions: Vec<Value> = status
        .conditions
        .into_iter()
        .filter_map(|cond| {
            Obj::default()
                .string("type", cond.r#type)
                .string("status", cond.status)
                .string("reason", cond.reason)
                .string("message", cond.message)
                .string("lastUpdateTime", time(cond.last_update_time))
                .string("lastTransitionTime", time(cond.last_transition_time))
                .value()
        })
        .collect();
    let spec = Obj::default()
        .string("request", b64(spec.request))
        .string("signerName", spec.signer_name)
        .int("expirationSeconds", spec.expiration_seconds)
        .list("usages", spec.usages)
        .string("username", spec.username)
        .string("uid", spec.uid)
        .list("groups", spec.groups)
        .value();
    let status = Obj::default()
        .list("conditions", conditions)
        .string("certificate", b64(status.certificate))
        .value();
    Obj::default()
        .put("metadata", metadata(c.metadata))
        .put("spec", spec)
        .put("status", status)
        .0
}

/// A review: its metadata and spec (a review's status is the server's).
fn review(meta: Option<ObjectMeta>, spec: Obj) -> Map<String, Value> {
    Obj::default()
        .put("metadata", metadata(meta))
        .put("spec", Some(spec.value().unwrap_or_else(|| json!({}))))
        .0
}

/// What an access review asks about.
fn access_attributes(
    resource: Option<authorization::ResourceAttributes>,
    non_resource: Option<authorization::NonResourceAttributes>,
) -> Obj {
    let resource = resource.map(|r| {
        Obj::default()
            .string("namespace", r.namespace)
            .string("verb", r.verb)
            .string("group", r.group)
            .string("version", r.version)
            .string("resource", r.resource)
            .string("subresource", r.subresource)
            .string("name", r.name)
            .value()
            .unwrap_or_else(|| json!({}))
    });
    let non_resource = non_resource.map(|n| {
        Obj::default()
            .string("path", n.path)
            .string("verb", n.verb)
            .value()
            .unwrap_or_else(|| json!({}))
    });
    Obj::default()
        .put("resourceAttributes", resource)
        .put("nonResourceAttributes", non_resource)
}

/// A SubjectAccessReview's spec: what it asks about, and of whom.
fn subject_access(spec: authorization::SubjectAccessReviewSpec) -> Obj {
    let extra: BTreeMap<String, Value> = spec
        .extra
        .into_iter()
        .map(|(k, v)| (k, json!(v.items)))
        .collect();
    access_attributes(spec.resource_attributes, spec.non_resource_attributes)
        .string("user", spec.user)
        .list("groups", spec.groups)
        .put("extra", (!extra.is_empty()).then(|| json!(extra)))
        .string("uid", spec.uid)
}

fn metadata(meta: Option<ObjectMeta>) -> Option<Value> {
    let m = meta?;
    Obj::default()
        .string("name", m.name)
        .string("generateName", m.generate_name)
        .string("namespace", m.namespace)
        .string("resourceVersion", m.resource_version)
        .map("labels", m.labels)
        .map("annotations", m.annotations)
        .list("finalizers", m.finalizers)
        .value()
}

fn int_or_string(v: IntOrString) -> Option<Value> {
    match (v.r#type, v.int_val, v.str_val) {
        (Some(1), _, Some(s)) if !s.is_empty() => Some(json!(s)),
        (_, Some(i), _) if i != 0 => Some(json!(i)),
        _ => None,
    }
}

fn token_request(r: authentication::TokenRequest) -> Map<String, Value> {
    let spec = r.spec.unwrap_or_default();
    let bound = spec.bound_object_ref.and_then(|b| {
        Obj::default()
            .string("kind", b.kind)
            .string("apiVersion", b.api_version)
            .string("name", b.name)
            .string("uid", b.u_id)
            .value()
    });
    let spec = Obj::default()
        .list("audiences", spec.audiences)
        .put(
            "expirationSeconds",
            spec.expiration_seconds.filter(|s| *s != 0).map(Value::from),
        )
        .put("boundObjectRef", bound);
    review(r.metadata, spec)
}

fn namespace(ns: core::Namespace) -> Map<String, Value> {
    let spec = ns
        .spec
        .and_then(|s| Obj::default().list("finalizers", s.finalizers).value());
    Obj::default()
        .put("metadata", metadata(ns.metadata))
        .put("spec", spec)
        .0
}

fn service(svc: core::Service) -> Map<String, Value> {
    let spec = svc.spec.and_then(|s| {
        let ports: Vec<Value> = s
            .ports
            .into_iter()
            .filter_map(|p| {
                Obj::default()
                    .string("name", p.name)
                    .string("protocol", p.protocol)
                    .string("appProtocol", p.app_protocol)
                    .int("port", p.port)
                    .put("targetPort", p.target_port.and_then(int_or_string))
                    .int("nodePort", p.node_port)
                    .value()
            })
            .collect();
        Obj::default()
            .list("ports", ports)
            .map("selector", s.selector)
            .string("clusterIP", s.cluster_ip)
            .list("clusterIPs", s.cluster_ips)
            .string("type", s.r#type)
            .list("externalIPs", s.external_ips)
            .string("sessionAffinity", s.session_affinity)
            .string("loadBalancerIP", s.load_balancer_ip)
            .list("loadBalancerSourceRanges", s.load_balancer_source_ranges)
            .string("externalName", s.external_name)
            .string("externalTrafficPolicy", s.external_traffic_policy)
            .int("healthCheckNodePort", s.health_check_node_port)
            .flag("publishNotReadyAddresses", s.publish_not_ready_addresses)
            .list("ipFamilies", s.ip_families)
            .string("ipFamilyPolicy", s.ip_family_policy)
            .put(
                "allocateLoadBalancerNodePorts",
                s.allocate_load_balancer_node_ports.map(Value::from),
            )
            .string("loadBalancerClass", s.load_balancer_class)
            .string("internalTrafficPolicy", s.internal_traffic_policy)
            .string("trafficDistribution", s.traffic_distribution)
            .value()
    });
    Obj::default()
        .put("metadata", metadata(svc.metadata))
        .put("spec", spec)
        .0
}

#[cfg(test)]
mod tests {
    use k8s_pb::apimachinery::pkg::runtime::TypeMeta;

    use super::*;

    fn wrap(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let mut body = MAGIC.to_vec();
        Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: None,
            content_type: None,
        }
        .encode(&mut body)
        .unwrap();
        body
    }

    #[test]
    fn a_service_decodes_as_kubectl_create_service_sends_it() {
        let svc = core::Service {
            metadata: Some(ObjectMeta {
                name: Some("web".into()),
                labels: [("app".to_owned(), "web".to_owned())].into(),
                ..Default::default()
            }),
            spec: Some(core::ServiceSpec {
                r#type: Some("LoadBalancer".into()),
                ports: vec![core::ServicePort {
                    name: Some("80-8080".into()),
                    protocol: Some("TCP".into()),
                    port: Some(80),
                    target_port: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(8080),
                        str_val: None,
                    }),
                    node_port: Some(0),
                    ..Default::default()
                }],
                selector: [("app".to_owned(), "web".to_owned())].into(),
                cluster_ip: Some(String::new()),
                health_check_node_port: Some(0),
                publish_not_ready_addresses: Some(false),
                ..Default::default()
            }),
            status: None,
        };
        let got = decode(&wrap("v1", "Service", svc.encode_to_vec())).unwrap();
        assert_eq!(
            got,
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {
                    "type": "LoadBalancer",
                    "selector": {"app": "web"},
                    "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                },
            })
        );
    }

    #[test]
    fn a_self_subject_access_review_decodes_as_kubectl_auth_can_i_sends_it() {
        let r = authorization::SelfSubjectAccessReview {
            metadata: Some(ObjectMeta::default()),
            spec: Some(authorization::SelfSubjectAccessReviewSpec {
                resource_attributes: Some(authorization::ResourceAttributes {
                    namespace: Some("default".into()),
                    verb: Some("list".into()),
                    group: Some(String::new()),
                    resource: Some("nodes".into()),
                    subresource: Some(String::new()),
                    name: Some(String::new()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            }),
            status: None,
        };
        let got = decode(&wrap(
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview",
            r.encode_to_vec(),
        ))
        .unwrap();
        assert_eq!(
            got,
            json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"namespace": "default", "verb": "list", "resource": "nodes"}},
            })
        );
    }

    #[test]
    fn other_kinds_and_garbage_are_refused_with_a_reason() {
        assert!(matches!(decode(b"{}"), Err(Refused::Malformed(_))));
        let pod = wrap("v1", "Pod", Vec::new());
        assert!(matches!(decode(&pod), Err(Refused::Unsupported(m)) if m.contains("JSON or YAML")));
    }
}
