//! Node groups, as Cluster Autoscaler scales them (its `NodeGroup`): a set
//! of like instances whose size the cloud keeps at a target between a
//! minimum and a maximum. The gateway serves them to Cluster Autoscaler's
//! external gRPC client; a provider reports what the cloud has and
//! changes only the target, or deletes named instances.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::Result;

/// Node groups, if the provider has them.
#[async_trait]
pub trait NodeGroups: Send + Sync {
    /// Every node group of `cluster` the autoscaler may scale (on AWS, the
    /// Auto Scaling groups carrying Cluster Autoscaler's discovery tags),
    /// with their instances: one consistent read.
    async fn list(&self, cluster: &str) -> Result<Vec<NodeGroup>>;

    /// Sets the group's target size. The gateway has checked it is within
    /// the group's bounds as last listed; the provider refuses one outside
    /// the bounds the cloud holds now (`InvalidArgument`).
    async fn set_target_size(&self, cluster: &str, group: &str, size: u32) -> Result<()>;

    /// Deletes the instances `provider_ids` (each one of the group's, as
    /// last listed) and lowers the target with them, as Cluster
    /// Autoscaler's AWS provider does: placeholders (instances not made
    /// yet) lower the target to the number of instances the group holds;
    /// an instance already being deleted is skipped (not deleted again,
    /// not counted); each other one is deleted with the target one lower.
    /// An instance of another group is `InvalidArgument` and nothing is
    /// deleted. The gateway refuses a group already at its minimum; past
    /// that the cloud refuses what it would refuse (on AWS, the instance
    /// that would take the group below its minimum, those before it
    /// deleted), and nothing the cloud would take is refused here.
    async fn delete_instances(
        &self,
        cluster: &str,
        group: &str,
        provider_ids: &[String],
    ) -> Result<()>;

    /// The Node label that marks nodes with GPUs and names their type (AWS:
    /// `k8s.amazonaws.com/accelerator`, as Cluster Autoscaler's own AWS
    /// provider names it). A local answer: no cloud call.
    fn gpu_label(&self) -> &'static str;

    /// The GPU types the cloud offers, as values of [`Self::gpu_label`].
    fn gpu_types(&self) -> Vec<String> {
        Vec::new()
    }
}

/// One node group.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGroup {
    /// Its id, stable for its life (AWS: the Auto Scaling group's name).
    pub id: String,
    pub min_size: u32,
    pub max_size: u32,
    /// The size the cloud is bringing the group to.
    pub target_size: u32,
    /// What the cloud holds of it now.
    pub instances: Vec<GroupInstance>,
    /// What a new node of the group looks like, for scaling from zero; or
    /// why the cloud could not tell. A group whose template cannot be read
    /// is still listed and scaled (as Cluster Autoscaler's AWS provider
    /// assumes it available): only its template answers the error.
    pub template: Result<NodeTemplate>,
    /// Options that differ from the autoscaler's defaults for this group;
    /// all `None` when it sets none of its own.
    pub options: GroupOptions,
}

/// One instance of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInstance {
    /// Its provider ID, as its Node's `spec.providerID`.
    pub provider_id: String,
    pub state: GroupInstanceState,
    /// Why it could not be made, when it could not.
    pub error: Option<InstanceError>,
}

/// Where an instance of a group is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupInstanceState {
    Running,
    Creating,
    Deleting,
}

/// Why an instance could not be made, as Cluster Autoscaler classes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceError {
    pub class: InstanceErrorClass,
    /// The cloud's own code (AWS: the scaling activity's status).
    pub code: String,
    pub message: String,
}

/// The error code of a placeholder whose launch the cloud could not
/// fulfil, as Cluster Autoscaler's AWS provider reports it (its
/// `placeholderUnfulfillableStatus`).
pub const UNFULFILLABLE: &str = "placeholder-cannot-be-fulfilled";

/// Cluster Autoscaler's `InstanceErrorClass`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceErrorClass {
    /// The cloud has no capacity (or quota) for it: try another group.
    OutOfResources,
    /// Anything else.
    Other,
}

/// What a new node of a group looks like.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeTemplate {
    /// The instance type (`node.kubernetes.io/instance-type`).
    pub instance_type: String,
    /// The zones new instances go to; the first is the template's.
    pub zones: Vec<String>,
    /// The region (`topology.kubernetes.io/region`).
    pub region: String,
    /// Capacity: `cpu`, `memory`, `pods`, `nvidia.com/gpu`, and others
    /// the cloud or its tags name, as Kubernetes quantities.
    pub capacity: BTreeMap<String, String>,
    /// Labels the group's nodes carry beyond the well-known ones.
    pub labels: BTreeMap<String, String>,
    /// Taints the group's nodes carry.
    pub taints: Vec<Taint>,
}

/// A Node taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// Per-group autoscaling options; `None` keeps the autoscaler's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupOptions {
    pub scale_down_utilization_threshold: Option<f64>,
    pub scale_down_gpu_utilization_threshold: Option<f64>,
    pub scale_down_unneeded_time: Option<std::time::Duration>,
    pub scale_down_unready_time: Option<std::time::Duration>,
    pub max_node_provision_time: Option<std::time::Duration>,
    pub ignore_daemonsets_utilization: Option<bool>,
    pub zero_or_max_node_scaling: Option<bool>,
}

/// The names of the options a group may set, as Cluster Autoscaler's AWS
/// provider reads them from the tags
/// `k8s.io/cluster-autoscaler/node-template/autoscaling-options/<name>`.
pub const OPTION_NAMES: &[&str] = &[
    "scaledownutilizationthreshold",
    "scaledowngpuutilizationthreshold",
    "scaledownunneededtime",
    "scaledownunreadytime",
    "maxnodeprovisiontime",
    "ignoredaemonsetsutilization",
    "zeroormaxnodescaling",
];

impl GroupOptions {
    /// Whether the group sets any option of its own.
    pub fn any(&self) -> bool {
        *self != Self::default()
    }

    /// Sets the option `name` (one of [`OPTION_NAMES`]) from its text as
    /// upstream writes it: a fraction from 0 to 1, a Go duration (`10m`,
    /// `1h30m`), or `true`/`false`. A name it does not know, or a value
    /// that does not parse, is the error and changes nothing.
    pub fn set(&mut self, name: &str, value: &str) -> std::result::Result<(), String> {
        let fraction = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f))
                .ok_or_else(|| format!("{value:?} is not a fraction from 0 to 1"))
        };
        let duration =
            || go_duration(value).ok_or_else(|| format!("{value:?} is not a duration such as 10m"));
        let flag = || {
            value
                .parse::<bool>()
                .map_err(|_| format!("{value:?} is not true or false"))
        };
        match name {
            "scaledownutilizationthreshold" => {
                self.scale_down_utilization_threshold = Some(fraction()?)
            }
            "scaledowngpuutilizationthreshold" => {
                self.scale_down_gpu_utilization_threshold = Some(fraction()?)
            }
            "scaledownunneededtime" => self.scale_down_unneeded_time = Some(duration()?),
            "scaledownunreadytime" => self.scale_down_unready_time = Some(duration()?),
            "maxnodeprovisiontime" => self.max_node_provision_time = Some(duration()?),
            "ignoredaemonsetsutilization" => self.ignore_daemonsets_utilization = Some(flag()?),
            "zeroormaxnodescaling" => self.zero_or_max_node_scaling = Some(flag()?),
            other => {
                return Err(format!(
                    "{other:?} is no option; the options are {}",
                    OPTION_NAMES.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// Whether `text` is a Kubernetes quantity (`resource.ParseQuantity`'s
/// grammar: a signed decimal number, then `Ki`…`Ei`, `m`, `k`, `M`…`E`, an
/// exponent `e3`/`E-2`, or nothing). The autoscaler cannot decode a
/// template whose capacity holds anything else.
pub fn is_quantity(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(end);
    let digits = number.chars().filter(char::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 {
        return false;
    }
    match suffix {
        "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => true,
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => true,
        _ => suffix
            .strip_prefix(['e', 'E'])
            .map(|exp| exp.strip_prefix(['+', '-']).unwrap_or(exp))
            .is_some_and(|exp| !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())),
    }
}

/// A Go duration (`10m`, `1h30m`, `90s`, `1.5h`, `250ms`), as the
/// autoscaler's options are written.
pub fn go_duration(text: &str) -> Option<std::time::Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    std::time::Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn go_durations_parse_as_the_autoscaler_writes_them() {
        for (text, secs) in [
            ("10m", 600.0),
            ("1h30m", 5400.0),
            ("90s", 90.0),
            ("1.5h", 5400.0),
            ("250ms", 0.25),
        ] {
            assert_eq!(
                go_duration(text),
                Some(Duration::from_secs_f64(secs)),
                "{text}"
            );
        }
        for bad in ["", "10", "ten minutes", "5d", "m"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn quantities_parse_as_kubernetes_parses_them() {
        for good in [
            "100Gi", "1", "0.5", "500m", "1.5e3", "2E-2", "+3k", "-1", ".5", "5.", "8192Mi",
        ] {
            assert!(is_quantity(good), "{good}");
        }
        for bad in [
            "", "lots", "100GB", "1.2.3", "Gi", "1e", "1 Gi", " 1", "1i", "--1", ".", "1e1.5",
        ] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn options_are_set_by_name_and_bad_values_change_nothing() {
        let mut o = GroupOptions::default();
        o.set("scaledownutilizationthreshold", "0.4").unwrap();
        o.set("scaledownunneededtime", "20m").unwrap();
        o.set("ignoredaemonsetsutilization", "true").unwrap();
        assert!(o.set("scaledowngpuutilizationthreshold", "1.7").is_err());
        assert!(o.set("maxnodeprovisiontime", "soon").is_err());
        assert!(
            o.set("colour", "blue")
                .unwrap_err()
                .contains("scaledownunneededtime")
        );
        assert_eq!(
            o,
            GroupOptions {
                scale_down_utilization_threshold: Some(0.4),
                scale_down_unneeded_time: Some(Duration::from_secs(1200)),
                ignore_daemonsets_utilization: Some(true),
                ..GroupOptions::default()
            }
        );
    }
}
