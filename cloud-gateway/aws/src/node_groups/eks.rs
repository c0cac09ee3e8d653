//! EKS managed node groups: what EKS's `DescribeNodegroup` says a group's
//! nodes carry (labels, taints, and `resources/*` tags), read for a group
//! whose template has both `nodegroup-name` and `cluster-name` labels (from
//! the `eks:` tags EKS puts on the Auto Scaling groups it makes), as
//! Cluster Autoscaler's AWS provider reads it. An answer, or a failure,
//! is kept for [`NODEGROUP_REFRESH`], so a node group EKS cannot describe
//! costs one call per interval, not one per listing.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_eks::types::{Nodegroup, TaintEffect};
use ccm_provider::node_groups::Taint;

use crate::{AwsCloud, errors};

/// How long an EKS node group's description is kept (upstream's
/// `managedNodegroupCachedTTL`).
const NODEGROUP_REFRESH: Duration = Duration::from_secs(6 * 60);

/// What EKS says the nodes of one managed node group carry.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ManagedGroup {
    /// Labels: the node group's own, and those upstream derives from its
    /// settings (`amiType`, `diskSize`, `k8sVersion`,
    /// `eks.amazonaws.com/capacityType`, `eks.amazonaws.com/nodegroup`).
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// The node group's tags (its `resources/*` ones count).
    pub tags: BTreeMap<String, String>,
}

/// Descriptions by `(cluster, node group)`: `None` where EKS failed.
pub(super) type Cache = HashMap<(String, String), (Option<ManagedGroup>, Instant)>;

/// The Kubernetes effect of an EKS taint effect.
fn effect(effect: &TaintEffect) -> Option<&'static str> {
    match effect {
        TaintEffect::NoSchedule => Some("NoSchedule"),
        TaintEffect::NoExecute => Some("NoExecute"),
        TaintEffect::PreferNoSchedule => Some("PreferNoSchedule"),
        _ => None,
    }
}

/// What the nodes of the node group EKS described as `group` carry.
pub(super) fn managed_group(group: &Nodegroup) -> ManagedGroup {
    let mut labels = BTreeMap::new();
    if let Some(size) = group.disk_size() {
        labels.insert("diskSize".to_owned(), size.to_string());
    }
    let settings = [
        ("amiType", group.ami_type().map(|t| t.as_str())),
        (
            "eks.amazonaws.com/capacityType",
            group.capacity_type().map(|t| t.as_str()),
        ),
        ("k8sVersion", group.version()),
        ("eks.amazonaws.com/nodegroup", group.nodegroup_name()),
    ];
    for (label, value) in settings {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            labels.insert(label.to_owned(), value.to_owned());
        }
    }
    labels.extend(
        group
            .labels()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let mut taints = Vec::new();
    for taint in group.taints() {
        let Some(key) = taint.key() else { continue };
        match taint.effect().and_then(effect) {
            // Upstream drops a taint without a value; a node of the group
            // still carries it, so it is kept here with an empty value.
            Some(effect) => taints.push(Taint {
                key: key.to_owned(),
                value: taint.value().unwrap_or_default().to_owned(),
                effect: effect.to_owned(),
            }),
            None => tracing::warn!(
                nodegroup = group.nodegroup_name(),
                taint = key,
                "EKS taint ignored: its effect is not one Kubernetes knows"
            ),
        }
    }
    let tags = group
        .tags()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ManagedGroup {
        labels,
        taints,
        tags,
    }
}

impl AwsCloud {
    /// What EKS says of its node group `nodegroup` in `cluster`; `None`,
    /// with a warning, where EKS cannot say (the template goes without).
    pub(super) async fn managed_node_group(
        &self,
        cluster: &str,
        nodegroup: &str,
    ) -> Option<ManagedGroup> {
        let key = (cluster.to_owned(), nodegroup.to_owned());
        if let Some((known, at)) = self.group_cache().managed.get(&key)
            && at.elapsed() < NODEGROUP_REFRESH
        {
            return known.clone();
        }
        let answer = self
            .eks
            .describe_nodegroup()
            .cluster_name(cluster)
            .nodegroup_name(nodegroup)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeNodegroup", e));
        let known = match answer {
            Ok(answer) => answer.nodegroup().map(managed_group),
            Err(error) => {
                tracing::warn!(
                    cluster,
                    nodegroup,
                    %error,
                    "EKS node group not described; its template goes without its labels and taints"
                );
                None
            }
        };
        self.group_cache()
            .managed
            .insert(key, (known.clone(), Instant::now()));
        known
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_eks::types::{AmiTypes, CapacityTypes, Taint as EksTaint};

    use super::*;

    #[test]
    fn an_eks_node_group_gives_its_labels_settings_taints_and_tags() {
        let group = Nodegroup::builder()
            .nodegroup_name("ng-1")
            .version("1.30")
            .disk_size(20)
            .ami_type(AmiTypes::Al2X8664)
            .capacity_type(CapacityTypes::Spot)
            .labels("team", "ml")
            .labels("amiType", "mine")
            .taints(
                EksTaint::builder()
                    .key("gpu")
                    .value("true")
                    .effect(TaintEffect::NoSchedule)
                    .build(),
            )
            .taints(
                EksTaint::builder()
                    .key("dedicated")
                    .effect(TaintEffect::PreferNoSchedule)
                    .build(),
            )
            .tags(
                "k8s.io/cluster-autoscaler/node-template/resources/hugepages-1Gi",
                "2Gi",
            )
            .build();
        let got = managed_group(&group);
        let labels: Vec<(&str, &str)> = got
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            vec![
                // The node group's own label wins over a derived one.
                ("amiType", "mine"),
                ("diskSize", "20"),
                ("eks.amazonaws.com/capacityType", "SPOT"),
                ("eks.amazonaws.com/nodegroup", "ng-1"),
                ("k8sVersion", "1.30"),
                ("team", "ml"),
            ]
        );
        assert_eq!(
            got.taints,
            vec![
                Taint {
                    key: "gpu".into(),
                    value: "true".into(),
                    effect: "NoSchedule".into()
                },
                Taint {
                    key: "dedicated".into(),
                    value: String::new(),
                    effect: "PreferNoSchedule".into()
                },
            ]
        );
        assert_eq!(got.tags.len(), 1);
    }
}
