//! A node group's template `v1.Node`, in Kubernetes' protobuf encoding, as
//! Cluster Autoscaler decodes `NodeGroupTemplateNodeInfoResponse.nodeBytes`
//! to scale a group up from zero: the well-known labels a kubelet and the
//! node controller would give a node of the group, the group's own labels
//! (which may override them: a provider states `kubernetes.io/arch` where
//! it knows it) and taints, its capacity (all of it allocatable), and
//! Ready. As upstream's AWS provider, it names no GPU type: the autoscaler
//! reads a GPU node's type from the label only on real nodes.

use std::collections::BTreeMap;

use ccm_provider::node_groups::NodeTemplate;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message;

/// The template node of the group `id`, encoded.
pub fn encode(id: &str, template: &NodeTemplate) -> Vec<u8> {
    node(id, template).encode_to_vec()
}

fn node(id: &str, t: &NodeTemplate) -> core::Node {
    let name = format!("template-node-for-{id}");
    let mut labels = BTreeMap::from([
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
        ("kubernetes.io/hostname".to_owned(), name.clone()),
    ]);
    let mut set = |key: &str, value: &str| {
        if !value.is_empty() {
            labels.insert(key.to_owned(), value.to_owned());
        }
    };
    set("node.kubernetes.io/instance-type", &t.instance_type);
    set("topology.kubernetes.io/region", &t.region);
    set(
        "topology.kubernetes.io/zone",
        t.zones.first().map_or("", String::as_str),
    );
    labels.extend(t.labels.clone());
    let quantities: BTreeMap<String, Quantity> = t
        .capacity
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Quantity {
                    string: Some(v.clone()),
                },
            )
        })
        .collect();
    core::Node {
        metadata: Some(ObjectMeta {
            name: Some(name),
            labels,
            ..ObjectMeta::default()
        }),
        spec: Some(core::NodeSpec {
            taints: t
                .taints
                .iter()
                .map(|taint| core::Taint {
                    key: Some(taint.key.clone()),
                    value: Some(taint.value.clone()).filter(|v| !v.is_empty()),
                    effect: Some(taint.effect.clone()),
                    ..core::Taint::default()
                })
                .collect(),
            ..core::NodeSpec::default()
        }),
        status: Some(core::NodeStatus {
            capacity: quantities.clone(),
            allocatable: quantities,
            conditions: vec![core::NodeCondition {
                r#type: Some("Ready".into()),
                status: Some("True".into()),
                reason: Some("TemplateNode".into()),
                ..core::NodeCondition::default()
            }],
            ..core::NodeStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use ccm_provider::node_groups::Taint;

    use super::*;

    #[test]
    fn the_template_decodes_as_a_node_with_the_groups_shape() {
        let template = NodeTemplate {
            instance_type: "p3.2xlarge".into(),
            zones: vec!["eu-west-1a".into()],
            region: "eu-west-1".into(),
            capacity: BTreeMap::from([
                ("cpu".into(), "8".into()),
                ("memory".into(), "62Gi".into()),
                ("pods".into(), "58".into()),
                ("nvidia.com/gpu".into(), "1".into()),
            ]),
            labels: BTreeMap::from([
                ("team".into(), "ml".into()),
                ("kubernetes.io/arch".into(), "arm64".into()),
            ]),
            taints: vec![Taint {
                key: "gpu".into(),
                value: String::new(),
                effect: "NoSchedule".into(),
            }],
        };
        let decoded = core::Node::decode(encode("gpu", &template).as_slice()).unwrap();
        let labels = decoded.metadata.unwrap().labels;
        assert_eq!(labels["node.kubernetes.io/instance-type"], "p3.2xlarge");
        assert_eq!(labels["topology.kubernetes.io/zone"], "eu-west-1a");
        assert_eq!(labels["team"], "ml");
        // The provider's word wins over the default; no GPU type is made up.
        assert_eq!(labels["kubernetes.io/arch"], "arm64");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert!(!labels.contains_key("k8s.amazonaws.com/accelerator"));
        let status = decoded.status.unwrap();
        assert_eq!(
            status.allocatable["nvidia.com/gpu"].string.as_deref(),
            Some("1")
        );
        assert_eq!(
            decoded.spec.unwrap().taints[0].effect.as_deref(),
            Some("NoSchedule")
        );
    }
}
