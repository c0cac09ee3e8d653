//! Request bodies in Kubernetes' protobuf encoding, which client-go's
//! typed clients send (kubectl's `create namespace` and `create service`,
//! Cluster Autoscaler's status ConfigMap, Node updates and evictions): the
//! `k8s\0` magic, then a `runtime.Unknown` envelope naming the kind around
//! the object's own message. Every kind of the API groups whose protos
//! this crate compiles (the Kubernetes API's own, vendored in
//! `proto/third_party/k8s.io`; see `build.rs`) is decoded, by its
//! descriptor, into the JSON the store keeps, as kube-apiserver takes every
//! built-in type in either encoding. A kind outside them is refused with
//! 415, naming the encodings accepted: the custom resources among them
//! (the CSI snapshots), as kube-apiserver takes custom resources as JSON
//! or YAML only.
//!
//! The protos name most fields as JSON does; the few that differ are
//! mapped here (Go's embedded structs, whose fields JSON inlines, and
//! `uID`), as are the types with a JSON form of their own (`Time`,
//! `MicroTime`, `Duration`, `Quantity`, `IntOrString`, `RawExtension`,
//! `FieldsV1`, and the `items` wrappers of `extra` maps).

use std::sync::LazyLock;

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MapKey, MessageDescriptor, ReflectMessage};
use serde_json::{Map, Value, json};

/// The media type of protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The prefix of every protobuf-encoded Kubernetes object.
const MAGIC: &[u8] = b"k8s\0";

/// The Kubernetes API's messages, compiled by `build.rs`.
static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(
        include_bytes!(concat!(env!("OUT_DIR"), "/k8s_descriptor.bin")).as_slice(),
    )
    .expect("the descriptor set build.rs wrote decodes")
});

const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";

/// Fields that are Go embedded structs: JSON writes their fields inline.
const INLINE: &[&str] = &[
    "volumeSource",
    "persistentVolumeSource",
    "ephemeralContainerCommon",
    "localObjectReference",
    "typeMeta",
];

/// Go pointer fields whose zero value says something an absent field does
/// not (`replicas: 0` is not "one replica"). Elsewhere a zero, an empty
/// string or `false` is what Go's protobuf writes for a field it has no
/// value for, where JSON's `omitempty` writes nothing, so they are left
/// out.
const KEEP_ZERO: &[&str] = &[
    "replicas",
    "terminationGracePeriodSeconds",
    "gracePeriodSeconds",
    "allocateLoadBalancerNodePorts",
    "automountServiceAccountToken",
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "fsGroup",
    "privileged",
    "readOnlyRootFilesystem",
    "allowPrivilegeEscalation",
    "parallelism",
    "completions",
    "backoffLimit",
    "activeDeadlineSeconds",
    "ttlSecondsAfterFinished",
    "suspend",
    "revisionHistoryLimit",
    "progressDeadlineSeconds",
    "maxUnavailable",
    "maxSurge",
    "minAvailable",
    "immutable",
    "optional",
    "defaultMode",
    "ready",
    "serving",
    "terminating",
];

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
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(envelope)
        .map_err(|e| Refused::Malformed(format!("not a runtime.Unknown: {e}")))?;
    let meta = unknown.type_meta.unwrap_or_default();
    let (api_version, kind) = (
        meta.api_version.unwrap_or_default(),
        meta.kind.unwrap_or_default(),
    );
    let descriptor = message_of(&api_version, &kind).ok_or_else(|| {
        Refused::Unsupported(format!(
            "{api_version} {kind} cannot be sent as protobuf here; send it as JSON or YAML"
        ))
    })?;
    let message = DynamicMessage::decode(descriptor, unknown.raw.unwrap_or_default().as_slice())
        .map_err(|e| Refused::Malformed(format!("the protobuf object does not decode: {e}")))?;
    let mut object = match to_json(&message) {
        Some(Value::Object(object)) => object,
        _ => Map::new(),
    };
    // A review's spec is its question, even when every field is empty.
    if message.descriptor().get_field_by_name("spec").is_some() {
        object.entry("spec").or_insert_with(|| json!({}));
    }
    object.insert("apiVersion".into(), json!(api_version));
    object.insert("kind".into(), json!(kind));
    Ok(Value::Object(object))
}

/// The message of `kind` in `api_version`: the group's first label names
/// its proto package (`k8s.io.api.<label>.<version>`, `core` for the core
/// group); options every group takes are meta's.
fn message_of(api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    if matches!(
        kind,
        "DeleteOptions" | "CreateOptions" | "UpdateOptions" | "PatchOptions"
    ) {
        return POOL.get_message_by_name(&format!("{META}.{kind}"));
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let package = group
        .split('.')
        .next()
        .filter(|p| !p.is_empty())
        .unwrap_or("core");
    POOL.get_message_by_name(&format!("k8s.io.api.{package}.{version}.{kind}"))
}

/// A message as JSON; `None` when it holds nothing JSON would write.
fn to_json(message: &DynamicMessage) -> Option<Value> {
    let descriptor = message.descriptor();
    match descriptor.full_name() {
        name if name == format!("{META}.Time") => return time(message, false),
        name if name == format!("{META}.MicroTime") => return time(message, true),
        name if name == format!("{META}.Duration") => {
            let nanos = int_field(message, "duration")?;
            return Some(json!(go_duration(nanos)));
        }
        "k8s.io.apimachinery.pkg.api.resource.Quantity" => {
            return str_field(message, "string").map(Value::from);
        }
        "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => {
            return Some(if int_field(message, "type") == Some(1) {
                json!(str_field(message, "strVal").unwrap_or_default())
            } else {
                json!(int_field(message, "intVal").unwrap_or(0))
            });
        }
        "k8s.io.apimachinery.pkg.runtime.RawExtension" => return raw_json(message, "raw"),
        name if name == format!("{META}.FieldsV1") => return raw_json(message, "Raw"),
        name if name.ends_with(".ExtraValue") || name == format!("{META}.Verbs") => {
            let items = message.get_field_by_name("items")?;
            return value_json(&items);
        }
        _ => {}
    }
    let mut out = Map::new();
    for (field, value) in message.fields() {
        let name = field.json_name();
        let name = match field.name() {
            "uID" => "uid",
            other if INLINE.contains(&other) => {
                if let Some(Value::Object(inner)) = value_json(value) {
                    out.extend(inner);
                }
                continue;
            }
            _ => name,
        };
        let keep_zero = KEEP_ZERO.contains(&field.name());
        let converted = match value {
            prost_reflect::Value::Message(m)
                if keep_zero && m.descriptor().name() == "IntOrString" =>
            {
                to_json(m)
            }
            _ if keep_zero => scalar_json(value).or_else(|| value_json(value)),
            _ => value_json(value),
        };
        if let Some(v) = converted {
            out.insert(name.to_owned(), v);
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// A field's value as JSON; `None` for what JSON would leave out.
fn value_json(value: &prost_reflect::Value) -> Option<Value> {
    use prost_reflect::Value as V;
    match value {
        V::Message(m) => to_json(m),
        V::List(items) => {
            let items: Vec<Value> = items
                .iter()
                .map(|v| value_json(v).unwrap_or_else(|| zero_of(v)))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        V::Map(entries) => {
            let entries: Map<String, Value> = entries
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        MapKey::String(s) => s.clone(),
                        other => format!("{other:?}"),
                    };
                    (key, value_json(v).unwrap_or_else(|| zero_of(v)))
                })
                .collect();
            (!entries.is_empty()).then_some(Value::Object(entries))
        }
        other => scalar_json(other).filter(|v| !is_zero(v)),
    }
}

/// A scalar as JSON, zero or not.
fn scalar_json(value: &prost_reflect::Value) -> Option<Value> {
    use prost_reflect::Value as V;
    Some(match value {
        V::Bool(b) => json!(b),
        V::I32(i) => json!(i),
        V::I64(i) => json!(i),
        V::U32(i) => json!(i),
        V::U64(i) => json!(i),
        V::F32(f) => json!(f),
        V::F64(f) => json!(f),
        V::String(s) => json!(s),
        V::Bytes(b) => json!(data_encoding::BASE64.encode(b)),
        V::EnumNumber(n) => json!(n),
        V::Message(_) | V::List(_) | V::Map(_) => return None,
    })
}

/// What an element of a list or map that is empty stands for: a list
/// keeps its length, a map its keys.
fn zero_of(value: &prost_reflect::Value) -> Value {
    match value {
        prost_reflect::Value::Message(_) => json!({}),
        other => scalar_json(other).unwrap_or(Value::Null),
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

fn int_field(message: &DynamicMessage, name: &str) -> Option<i64> {
    match message.get_field_by_name(name)?.as_ref() {
        prost_reflect::Value::I64(i) => Some(*i),
        prost_reflect::Value::I32(i) => Some(i64::from(*i)),
        _ => None,
    }
}

fn str_field(message: &DynamicMessage, name: &str) -> Option<String> {
    message
        .get_field_by_name(name)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// Bytes that hold JSON (an embedded object, managed fields).
fn raw_json(message: &DynamicMessage, field: &str) -> Option<Value> {
    let raw = message.get_field_by_name(field)?;
    let bytes = raw.as_bytes()?;
    serde_json::from_slice(bytes).ok()
}

/// A `metav1.Time` (seconds) or `MicroTime` (microseconds) in RFC 3339;
/// Go's zero time, which it writes for a time never set, is no time.
fn time(message: &DynamicMessage, micro: bool) -> Option<Value> {
    /// `time.Time{}.Unix()`.
    const GO_ZERO: i64 = -62_135_596_800;
    // Go writes nothing inside for a zero time.
    if !message.has_field_by_name("seconds") && !message.has_field_by_name("nanos") {
        return None;
    }
    let seconds = int_field(message, "seconds").unwrap_or(0);
    let nanos = int_field(message, "nanos").unwrap_or(0);
    if seconds == GO_ZERO && nanos == 0 {
        return None;
    }
    let at = k8s_openapi::jiff::Timestamp::new(seconds, i32::try_from(nanos).unwrap_or(0)).ok()?;
    let text = if micro {
        at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
    } else {
        at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    };
    Some(json!(text))
}

/// A duration as Go writes one (`1h2m3.5s`, `250ms`, `0s`).
fn go_duration(nanos: i64) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n == 0 {
        return "0s".to_owned();
    }
    let fraction = |value: u64, unit: u64, suffix: &str| {
        let whole = value / unit;
        let rest = value % unit;
        if rest == 0 {
            format!("{whole}{suffix}")
        } else {
            let digits = unit.to_string().len() - 1;
            let text = format!("{rest:0digits$}");
            format!("{whole}.{}{suffix}", text.trim_end_matches('0'))
        }
    };
    if n < 1_000 {
        return format!("{sign}{n}ns");
    }
    if n < 1_000_000 {
        return format!("{sign}{}", fraction(n, 1_000, "µs"));
    }
    if n < 1_000_000_000 {
        return format!("{sign}{}", fraction(n, 1_000_000, "ms"));
    }
    let (hours, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (minutes, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let seconds = fraction(rest, 1_000_000_000, "s");
    match (hours, minutes) {
        (0, 0) => format!("{sign}{seconds}"),
        (0, m) => format!("{sign}{m}m{seconds}"),
        (h, m) => format!("{sign}{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_pb::api::authorization::v1 as authorization;
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::apimachinery::pkg::api::resource::Quantity;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
    use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;

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
        let ingress = wrap("networking.k8s.io/v1", "Ingress", Vec::new());
        assert!(
            matches!(decode(&ingress), Err(Refused::Unsupported(m)) if m.contains("JSON or YAML"))
        );
        let garbage = wrap("v1", "ConfigMap", vec![0xff, 0xff, 0xff]);
        assert!(matches!(decode(&garbage), Err(Refused::Malformed(_))));
    }

    #[test]
    fn custom_resources_are_refused_as_kube_apiserver_refuses_them() {
        for r in crate::resources::RESOURCES.iter().filter(|r| r.custom) {
            let body = wrap(&r.api_version(), r.kind, Vec::new());
            assert!(
                matches!(decode(&body), Err(Refused::Unsupported(m)) if m.contains("JSON or YAML")),
                "{} is refused",
                r.kind
            );
        }
    }

    #[test]
    fn a_config_map_decodes_as_cluster_autoscaler_writes_its_status() {
        let cm = core::ConfigMap {
            metadata: Some(ObjectMeta {
                name: Some("cluster-autoscaler-status".into()),
                namespace: Some("kube-system".into()),
                annotations: [(
                    "cluster-autoscaler.kubernetes.io/last-updated".to_owned(),
                    "2026-11-28 00:19:54.444 +0000 UTC".to_owned(),
                )]
                .into(),
                ..Default::default()
            }),
            immutable: None,
            data: [(
                "status".to_owned(),
                "time: x\nautoscalerStatus: Running\n".to_owned(),
            )]
            .into(),
            binary_data: [("blob".to_owned(), vec![0, 1, 2])].into(),
        };
        let got = decode(&wrap("v1", "ConfigMap", cm.encode_to_vec())).unwrap();
        assert_eq!(
            got,
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": "cluster-autoscaler-status", "namespace": "kube-system",
                    "annotations": {"cluster-autoscaler.kubernetes.io/last-updated": "2026-11-28 00:19:54.444 +0000 UTC"},
                },
                "data": {"status": "time: x\nautoscalerStatus: Running\n"},
                "binaryData": {"blob": "AAEC"},
            })
        );
    }

    #[test]
    fn a_node_update_keeps_its_times_quantities_taints_and_conditions() {
        let at = Time {
            seconds: Some(1_764_288_000),
            nanos: Some(0),
        };
        let node = core::Node {
            metadata: Some(ObjectMeta {
                name: Some("workers-7".into()),
                resource_version: Some("42".into()),
                uid: Some("0b1e".into()),
                creation_timestamp: Some(at),
                // Go's zero time, which the server never set.
                deletion_timestamp: None,
                ..Default::default()
            }),
            spec: Some(core::NodeSpec {
                provider_id: Some("sim:///zone-a/workers-7".into()),
                pod_cidr: Some("10.244.7.0/24".into()),
                unschedulable: Some(false),
                taints: vec![core::Taint {
                    key: Some("ToBeDeletedByClusterAutoscaler".into()),
                    value: Some("1764288000".into()),
                    effect: Some("NoSchedule".into()),
                    time_added: Some(Time::default()),
                }],
                ..Default::default()
            }),
            status: Some(core::NodeStatus {
                capacity: BTreeMap::from([(
                    "cpu".to_owned(),
                    Quantity {
                        string: Some("2".into()),
                    },
                )]),
                conditions: vec![core::NodeCondition {
                    r#type: Some("Ready".into()),
                    status: Some("True".into()),
                    last_heartbeat_time: Some(at),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        };
        let got = decode(&wrap("v1", "Node", node.encode_to_vec())).unwrap();
        assert_eq!(
            got,
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": "workers-7", "resourceVersion": "42", "uid": "0b1e",
                    "creationTimestamp": "2025-11-28T00:00:00Z",
                },
                "spec": {
                    "providerID": "sim:///zone-a/workers-7", "podCIDR": "10.244.7.0/24",
                    "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1764288000", "effect": "NoSchedule"}],
                },
                "status": {
                    "capacity": {"cpu": "2"},
                    "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-11-28T00:00:00Z"}],
                },
            })
        );
    }

    #[test]
    fn go_pointers_keep_their_zero_and_embedded_structs_are_inlined() {
        let pod = core::Pod {
            metadata: Some(ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            }),
            spec: Some(core::PodSpec {
                termination_grace_period_seconds: Some(0),
                volumes: vec![core::Volume {
                    name: Some("cfg".into()),
                    volume_source: Some(core::VolumeSource {
                        config_map: Some(core::ConfigMapVolumeSource {
                            local_object_reference: Some(core::LocalObjectReference {
                                name: Some("settings".into()),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                }],
                ..Default::default()
            }),
            status: None,
        };
        let got = decode(&wrap("v1", "Pod", pod.encode_to_vec())).unwrap();
        assert_eq!(
            got["spec"],
            json!({
                "terminationGracePeriodSeconds": 0,
                "volumes": [{"name": "cfg", "configMap": {"name": "settings"}}],
            })
        );
        let budget = k8s_pb::api::policy::v1::PodDisruptionBudget {
            metadata: Some(ObjectMeta {
                name: Some("b".into()),
                ..Default::default()
            }),
            spec: Some(k8s_pb::api::policy::v1::PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString {
                    r#type: Some(0),
                    int_val: Some(0),
                    str_val: None,
                }),
                ..Default::default()
            }),
            status: None,
        };
        let got = decode(&wrap(
            "policy/v1",
            "PodDisruptionBudget",
            budget.encode_to_vec(),
        ))
        .unwrap();
        assert_eq!(got["spec"], json!({"maxUnavailable": 0}));
    }

    #[test]
    fn an_eviction_and_its_delete_options_decode() {
        let eviction = k8s_pb::api::policy::v1::Eviction {
            metadata: Some(ObjectMeta {
                name: Some("web-1".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            }),
            delete_options: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::DeleteOptions {
                grace_period_seconds: Some(30),
                ..Default::default()
            }),
        };
        let got = decode(&wrap("policy/v1", "Eviction", eviction.encode_to_vec())).unwrap();
        assert_eq!(
            got,
            json!({
                "apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "web-1", "namespace": "shop"},
                "deleteOptions": {"gracePeriodSeconds": 30},
            })
        );
    }

    #[test]
    fn durations_read_as_go_writes_them() {
        for (nanos, text) in [
            (0, "0s"),
            (1_500_000, "1.5ms"),
            (90_000_000_000, "1m30s"),
            (3_723_500_000_000, "1h2m3.5s"),
            (-2_000_000_000, "-2s"),
        ] {
            assert_eq!(go_duration(nanos), text);
        }
    }
}
