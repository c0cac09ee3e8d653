//! Cluster Autoscaler's node groups as Auto Scaling groups, found by its
//! own discovery tags (`k8s.io/cluster-autoscaler/enabled` and
//! `k8s.io/cluster-autoscaler/<cluster>`). Only the desired capacity is
//! changed: `SetDesiredCapacity` to scale, and
//! `TerminateInstanceInAutoScalingGroup` with decrement to delete a named
//! instance of the group. A group short of its desired capacity shows the
//! missing instances as placeholders (`i-placeholder-<group>-<n>`, as
//! Cluster Autoscaler's AWS provider names them), with the error of the
//! group's latest scaling activity when that failed after our last change.
//! Templates come from the launch template's (or configuration's) instance
//! type and the `node-template/{label,taint,resources}` tags, options from
//! the `node-template/autoscaling-options` tags. Instance types and launch
//! configurations never change, so they are read once; a launch template's
//! version is read again after [`TEMPLATE_REFRESH`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use aws_sdk_autoscaling::types::{AutoScalingGroup, Filter, LifecycleState};
use ccm_provider::node_groups::{
    GroupInstance, GroupInstanceState, GroupOptions, InstanceError, InstanceErrorClass, NodeGroup,
    NodeGroups, NodeTemplate, OPTION_NAMES, Taint,
};
use ccm_provider::{CloudError, Result};

use crate::instances::{parse_provider_id, provider_id};
use crate::{AwsCloud, errors, every_page};

/// The tag every group Cluster Autoscaler may scale carries.
pub const ENABLED_TAG: &str = "k8s.io/cluster-autoscaler/enabled";
/// The prefix of the template's tags.
const TEMPLATE_PREFIX: &str = "k8s.io/cluster-autoscaler/node-template/";
/// The instance ID prefix of a placeholder for an instance not yet made.
const PLACEHOLDER_PREFIX: &str = "i-placeholder";
/// The error code of a placeholder whose launch failed for a reason
/// AWS's message does not name (Cluster Autoscaler's own).
const UNFULFILLABLE: &str = "placeholder-cannot-be-fulfilled";
/// How long a launch template version's instance type is kept.
const TEMPLATE_REFRESH: Duration = Duration::from_secs(300);
/// Pods a node of any type takes (Cluster Autoscaler's AWS default).
const PODS: u32 = 110;
/// The Node label that marks GPU nodes on AWS, as Cluster Autoscaler's
/// AWS provider names it.
pub const GPU_LABEL: &str = "k8s.amazonaws.com/accelerator";
/// The GPU types Cluster Autoscaler's AWS provider knows.
const GPU_TYPES: &[&str] = &[
    "nvidia-tesla-k80",
    "nvidia-tesla-p100",
    "nvidia-tesla-v100",
    "nvidia-tesla-t4",
    "nvidia-tesla-a100",
    "nvidia-a10g",
];
/// Error codes in a failed launch's message that say AWS has no room for
/// the instance (capacity or quota).
const CAPACITY_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "InsufficientFreeAddressesInSubnet",
    "Unsupported",
];

/// What the provider remembers between listings.
#[derive(Default)]
pub(super) struct GroupCache {
    /// CPUs, memory, GPUs and architecture of each instance type.
    types: HashMap<String, TypeInfo>,
    /// The instance type of a launch template version, and when read.
    templates: HashMap<String, (Option<String>, Instant)>,
    /// The instance type of each launch configuration.
    configurations: HashMap<String, Option<String>>,
    /// When this process last changed each group's size: a failed
    /// activity older than that says nothing of the group now.
    changed: HashMap<String, SystemTime>,
}

#[derive(Clone, Debug)]
struct TypeInfo {
    cpus: i32,
    memory_mib: i64,
    gpus: i32,
    arch: Option<String>,
}

fn invalid(field: &str, problem: String) -> CloudError {
    CloudError::InvalidArgument(vec![(field.to_owned(), problem)])
}

fn discovery_filters(cluster: &str) -> Vec<Filter> {
    [ENABLED_TAG.to_owned(), cluster_tag(cluster)]
        .into_iter()
        .map(|key| Filter::builder().name("tag-key").values(key).build())
        .collect()
}

fn cluster_tag(cluster: &str) -> String {
    format!("k8s.io/cluster-autoscaler/{cluster}")
}

fn tags(group: &AutoScalingGroup) -> BTreeMap<&str, &str> {
    group
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?, t.value().unwrap_or_default())))
        .collect()
}

fn manages(group: &AutoScalingGroup, cluster: &str) -> bool {
    let tags = tags(group);
    tags.contains_key(ENABLED_TAG) && tags.contains_key(cluster_tag(cluster).as_str())
}

fn count(n: Option<i32>) -> u32 {
    u32::try_from(n.unwrap_or(0)).unwrap_or(0)
}

/// Where an instance is, from its Auto Scaling lifecycle state.
fn state_of(state: Option<&LifecycleState>) -> GroupInstanceState {
    match state.map(LifecycleState::as_str).unwrap_or_default() {
        s if s.starts_with("Pending") => GroupInstanceState::Creating,
        s if s.starts_with("Terminat") || s.starts_with("Detach") => GroupInstanceState::Deleting,
        _ => GroupInstanceState::Running,
    }
}

fn placeholder_id(group: &str, n: u32) -> String {
    format!("{PLACEHOLDER_PREFIX}-{group}-{n}")
}

/// The error of a failed launch, from its scaling activity's message:
/// always out of resources, as Cluster Autoscaler's AWS provider classes
/// it, with AWS's code where the message names one.
fn launch_error(message: &str) -> InstanceError {
    let code = CAPACITY_CODES
        .iter()
        .find(|code| message.contains(*code))
        .map_or(UNFULFILLABLE, |code| code);
    InstanceError {
        class: InstanceErrorClass::OutOfResources,
        code: code.to_owned(),
        message: if message.is_empty() {
            "AWS cannot launch more instances for this node group".to_owned()
        } else {
            message.to_owned()
        },
    }
}

/// The options the group's tags set; a value that does not parse is
/// left at the autoscaler's default, with a warning.
fn options(group: &str, tags: &BTreeMap<&str, &str>) -> GroupOptions {
    let mut out = GroupOptions::default();
    let prefix = format!("{TEMPLATE_PREFIX}autoscaling-options/");
    for (key, value) in tags {
        let Some(name) = key.strip_prefix(prefix.as_str()) else {
            continue;
        };
        // Upstream ignores options it does not know.
        if !OPTION_NAMES.contains(&name) {
            continue;
        }
        if let Err(problem) = out.set(name, value) {
            tracing::warn!(
                group,
                tag = key,
                problem,
                "autoscaling option ignored: its value does not parse"
            );
        }
    }
    out
}

/// The labels, taints and resources the group's template tags name.
fn template_tags(
    group: &str,
    tags: &BTreeMap<&str, &str>,
) -> (
    BTreeMap<String, String>,
    Vec<Taint>,
    BTreeMap<String, String>,
) {
    let (mut labels, mut taints, mut resources) = (BTreeMap::new(), Vec::new(), BTreeMap::new());
    for (key, value) in tags {
        let Some(rest) = key.strip_prefix(TEMPLATE_PREFIX) else {
            continue;
        };
        if let Some(name) = rest.strip_prefix("label/") {
            labels.insert(name.to_owned(), (*value).to_owned());
        } else if let Some(name) = rest.strip_prefix("taint/") {
            // `value:Effect`, or `Effect` alone.
            let (value, effect) = value.rsplit_once(':').unwrap_or(("", value));
            if ["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                taints.push(Taint {
                    key: name.to_owned(),
                    value: value.to_owned(),
                    effect: effect.to_owned(),
                });
            } else {
                tracing::warn!(
                    group,
                    tag = key,
                    "template taint ignored: its effect is not NoSchedule, PreferNoSchedule or NoExecute"
                );
            }
        } else if let Some(name) = rest.strip_prefix("resources/") {
            resources.insert(name.to_owned(), (*value).to_owned());
        }
    }
    (labels, taints, resources)
}

impl AwsCloud {
    fn group_cache(&self) -> std::sync::MutexGuard<'_, GroupCache> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The groups `filters` select, or those named, every page.
    async fn describe_groups(
        &self,
        filters: Vec<Filter>,
        names: Vec<String>,
    ) -> Result<Vec<AutoScalingGroup>> {
        let (filters, names) = (&filters, &names);
        every_page(|token| async move {
            let page = self
                .autoscaling
                .describe_auto_scaling_groups()
                .set_filters((!filters.is_empty()).then(|| filters.clone()))
                .set_auto_scaling_group_names((!names.is_empty()).then(|| names.clone()))
                .max_records(100)
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeAutoScalingGroups", e))?;
            Ok((
                page.auto_scaling_groups().to_vec(),
                page.next_token().map(str::to_owned),
            ))
        })
        .await
    }

    /// The one group `cluster` may scale named `name`.
    async fn managed_group(&self, cluster: &str, name: &str) -> Result<AutoScalingGroup> {
        self.describe_groups(Vec::new(), vec![name.to_owned()])
            .await?
            .into_iter()
            .find(|g| manages(g, cluster))
            .ok_or_else(|| {
                CloudError::NotFound(format!(
                    "no Auto Scaling group {name:?} tagged {ENABLED_TAG} and {}",
                    cluster_tag(cluster)
                ))
            })
    }

    /// The instance type new instances of `group` get.
    async fn group_instance_type(&self, group: &AutoScalingGroup) -> Result<Option<String>> {
        let mixed = group
            .mixed_instances_policy()
            .and_then(|p| p.launch_template());
        if let Some(t) = mixed
            .and_then(|t| t.overrides().first())
            .and_then(|o| o.instance_type())
        {
            return Ok(Some(t.to_owned()));
        }
        let spec = group
            .launch_template()
            .or_else(|| mixed.and_then(|t| t.launch_template_specification()));
        if let Some(spec) = spec {
            let version = spec.version().unwrap_or("$Default").to_owned();
            let key = format!(
                "{}/{}/{version}",
                spec.launch_template_id().unwrap_or_default(),
                spec.launch_template_name().unwrap_or_default()
            );
            if let Some((t, at)) = self.group_cache().templates.get(&key)
                && (at.elapsed() < TEMPLATE_REFRESH || !version.starts_with('$'))
            {
                return Ok(t.clone());
            }
            let answer = self
                .ec2
                .describe_launch_template_versions()
                .set_launch_template_id(spec.launch_template_id().map(str::to_owned))
                .set_launch_template_name(spec.launch_template_name().map(str::to_owned))
                .versions(version)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeLaunchTemplateVersions", e))?;
            let t = answer
                .launch_template_versions()
                .first()
                .and_then(|v| v.launch_template_data())
                .and_then(|d| d.instance_type())
                .map(|t| t.as_str().to_owned());
            self.group_cache()
                .templates
                .insert(key, (t.clone(), Instant::now()));
            return Ok(t);
        }
        let Some(name) = group.launch_configuration_name() else {
            return Ok(None);
        };
        if let Some(t) = self.group_cache().configurations.get(name) {
            return Ok(t.clone());
        }
        let answer = self
            .autoscaling
            .describe_launch_configurations()
            .launch_configuration_names(name)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeLaunchConfigurations", e))?;
        let t = answer
            .launch_configurations()
            .first()
            .and_then(|c| c.instance_type())
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        self.group_cache()
            .configurations
            .insert(name.to_owned(), t.clone());
        Ok(t)
    }

    /// What an instance type offers, read once.
    async fn type_info(&self, instance_type: &str) -> Result<Option<TypeInfo>> {
        if let Some(info) = self.group_cache().types.get(instance_type) {
            return Ok(Some(info.clone()));
        }
        let answer = self
            .ec2
            .describe_instance_types()
            .instance_types(instance_type.into())
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeInstanceTypes", e))?;
        let Some(t) = answer.instance_types().first() else {
            return Ok(None);
        };
        let info = TypeInfo {
            cpus: t.v_cpu_info().and_then(|v| v.default_v_cpus()).unwrap_or(0),
            memory_mib: t.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0),
            gpus: t
                .gpu_info()
                .map(|g| g.gpus().iter().filter_map(|d| d.count()).sum())
                .unwrap_or(0),
            arch: t
                .processor_info()
                .and_then(|p| p.supported_architectures().first())
                .map(|a| match a.as_str() {
                    "x86_64" | "x86_64_mac" => "amd64".to_owned(),
                    other => other.to_owned(),
                }),
        };
        self.group_cache()
            .types
            .insert(instance_type.to_owned(), info.clone());
        Ok(Some(info))
    }

    /// The template of `group`.
    async fn template(&self, name: &str, group: &AutoScalingGroup) -> Result<NodeTemplate> {
        let tags = tags(group);
        let (mut labels, taints, resources) = template_tags(name, &tags);
        let instance_type = self.group_instance_type(group).await?.unwrap_or_default();
        let mut capacity = BTreeMap::from([("pods".to_owned(), PODS.to_string())]);
        if !instance_type.is_empty()
            && let Some(info) = self.type_info(&instance_type).await?
        {
            capacity.insert("cpu".to_owned(), info.cpus.to_string());
            capacity.insert("memory".to_owned(), format!("{}Mi", info.memory_mib));
            if info.gpus > 0 {
                capacity.insert("nvidia.com/gpu".to_owned(), info.gpus.to_string());
            }
            if let Some(arch) = info.arch {
                labels
                    .entry("kubernetes.io/arch".to_owned())
                    .or_insert(arch);
            }
        }
        capacity.extend(resources);
        Ok(NodeTemplate {
            instance_type,
            zones: group.availability_zones().to_vec(),
            region: self.region.clone(),
            capacity,
            labels,
            taints,
        })
    }

    /// The error of the group's latest scaling activity, when it failed
    /// after this process last changed the group's size.
    async fn launch_failure(&self, name: &str) -> Result<Option<InstanceError>> {
        let answer = self
            .autoscaling
            .describe_scaling_activities()
            .auto_scaling_group_name(name)
            .max_records(1)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeScalingActivities", e))?;
        let Some(activity) = answer.activities().first() else {
            return Ok(None);
        };
        let failed = activity
            .status_code()
            .is_some_and(|s| s.as_str() == "Failed");
        let started = activity
            .start_time()
            .and_then(|t| SystemTime::try_from(*t).ok());
        let changed = self.group_cache().changed.get(name).copied();
        let stale = matches!((started, changed), (Some(s), Some(c)) if s < c);
        Ok((failed && !stale).then(|| launch_error(activity.status_message().unwrap_or_default())))
    }

    async fn to_group(&self, group: &AutoScalingGroup) -> Result<NodeGroup> {
        let name = group.auto_scaling_group_name().unwrap_or_default();
        let target = count(group.desired_capacity());
        let mut instances: Vec<GroupInstance> = group
            .instances()
            .iter()
            .filter_map(|i| {
                Some(GroupInstance {
                    provider_id: provider_id(
                        i.availability_zone().unwrap_or_default(),
                        i.instance_id()?,
                    ),
                    state: state_of(i.lifecycle_state()),
                    error: None,
                })
            })
            .collect();
        let live = u32::try_from(
            instances
                .iter()
                .filter(|i| i.state != GroupInstanceState::Deleting)
                .count(),
        )
        .unwrap_or(u32::MAX);
        if target > live {
            let error = self.launch_failure(name).await?;
            let zone = group
                .availability_zones()
                .first()
                .map_or("", String::as_str);
            instances.extend((live..target).map(|n| GroupInstance {
                provider_id: provider_id(zone, &placeholder_id(name, n)),
                state: GroupInstanceState::Creating,
                error: error.clone(),
            }));
        }
        Ok(NodeGroup {
            id: name.to_owned(),
            min_size: count(group.min_size()),
            max_size: count(group.max_size()),
            target_size: target,
            instances,
            template: self.template(name, group).await,
            options: options(name, &tags(group)),
        })
    }

    async fn set_desired(&self, group: &str, size: u32) -> Result<()> {
        let size =
            i32::try_from(size).map_err(|_| invalid("size", format!("{size} is too large")))?;
        self.group_cache()
            .changed
            .insert(group.to_owned(), SystemTime::now());
        self.autoscaling
            .set_desired_capacity()
            .auto_scaling_group_name(group)
            .desired_capacity(size)
            .honor_cooldown(false)
            .send()
            .await
            .map_err(|e| errors::cloud_error("SetDesiredCapacity", e))?;
        Ok(())
    }
}

#[async_trait]
impl NodeGroups for AwsCloud {
    async fn list(&self, cluster: &str) -> Result<Vec<NodeGroup>> {
        let groups = self
            .describe_groups(discovery_filters(cluster), Vec::new())
            .await?;
        let mut out = Vec::with_capacity(groups.len());
        for group in groups.iter().filter(|g| manages(g, cluster)) {
            out.push(self.to_group(group).await?);
        }
        Ok(out)
    }

    async fn set_target_size(&self, cluster: &str, group: &str, size: u32) -> Result<()> {
        // The bounds AWS holds now are AWS's to enforce: it refuses a size
        // outside them (`ValidationError`, an invalid argument).
        let _ = cluster;
        self.set_desired(group, size).await
    }

    async fn delete_instances(
        &self,
        cluster: &str,
        group: &str,
        provider_ids: &[String],
    ) -> Result<()> {
        let now = self.managed_group(cluster, group).await?;
        let members: HashMap<&str, GroupInstanceState> = now
            .instances()
            .iter()
            .filter_map(|i| Some((i.instance_id()?, state_of(i.lifecycle_state()))))
            .collect();
        let own_placeholder = format!("{PLACEHOLDER_PREFIX}-{group}-");
        let (mut doomed, mut placeholders) = (Vec::new(), 0u32);
        for id in provider_ids {
            if id
                .rsplit('/')
                .next()
                .is_some_and(|i| i.starts_with(&own_placeholder))
            {
                placeholders += 1;
                continue;
            }
            let instance = parse_provider_id(id).map_err(|e| invalid("provider_ids", e))?;
            match members.get(instance.as_str()) {
                // Already on its way out: nothing more to do.
                Some(GroupInstanceState::Deleting) => {}
                Some(_) => doomed.push(instance),
                None => {
                    return Err(invalid(
                        "provider_ids",
                        format!("{id:?} is not an instance of node group {group:?}"),
                    ));
                }
            }
        }
        let desired = count(now.desired_capacity());
        let min = count(now.min_size());
        let removing = placeholders + u32::try_from(doomed.len()).unwrap_or(u32::MAX);
        if desired.saturating_sub(removing) < min || removing > desired {
            return Err(invalid(
                "provider_ids",
                format!(
                    "deleting {removing} would take node group {group:?} below its minimum {min}"
                ),
            ));
        }
        // Placeholders are instances not made yet: a lower target is all
        // that deleting them takes.
        if placeholders > 0 {
            self.set_desired(group, desired - placeholders).await?;
        }
        for instance in doomed {
            self.group_cache()
                .changed
                .insert(group.to_owned(), SystemTime::now());
            self.autoscaling
                .terminate_instance_in_auto_scaling_group()
                .instance_id(instance)
                .should_decrement_desired_capacity(true)
                .send()
                .await
                .map_err(|e| errors::cloud_error("TerminateInstanceInAutoScalingGroup", e))?;
        }
        Ok(())
    }

    fn gpu_label(&self) -> &'static str {
        GPU_LABEL
    }

    fn gpu_types(&self) -> Vec<String> {
        GPU_TYPES.iter().map(|t| (*t).to_owned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_tags_set_options_and_bad_values_keep_the_default() {
        let p = "k8s.io/cluster-autoscaler/node-template/autoscaling-options/";
        let keys: Vec<String> = [
            "scaledownutilizationthreshold",
            "scaledowngpuutilizationthreshold",
            "scaledownunneededtime",
            "ignoredaemonsetsutilization",
            "maxnodeprovisiontime",
        ]
        .iter()
        .map(|k| format!("{p}{k}"))
        .collect();
        let tags = BTreeMap::from([
            (keys[0].as_str(), "0.4"),
            (keys[1].as_str(), "1.7"),
            (keys[2].as_str(), "20m"),
            (keys[3].as_str(), "true"),
            (keys[4].as_str(), "soon"),
        ]);
        let o = options("g", &tags);
        assert_eq!(o.scale_down_utilization_threshold, Some(0.4));
        assert_eq!(o.scale_down_gpu_utilization_threshold, None);
        assert_eq!(o.scale_down_unneeded_time, Some(Duration::from_secs(1200)));
        assert_eq!(o.ignore_daemonsets_utilization, Some(true));
        assert_eq!(o.max_node_provision_time, None);
    }

    #[test]
    fn template_tags_give_labels_taints_and_resources() {
        let p = TEMPLATE_PREFIX;
        let (l, t, r) = (
            format!("{p}label/team"),
            format!("{p}taint/gpu"),
            format!("{p}resources/ephemeral-storage"),
        );
        let bad = format!("{p}taint/odd");
        let tags = BTreeMap::from([
            (l.as_str(), "ml"),
            (t.as_str(), "true:NoSchedule"),
            (r.as_str(), "100Gi"),
            (bad.as_str(), "x:Sometimes"),
            ("Name", "worker"),
        ]);
        let (labels, taints, resources) = template_tags("g", &tags);
        assert_eq!(
            labels,
            BTreeMap::from([("team".to_owned(), "ml".to_owned())])
        );
        assert_eq!(
            taints,
            vec![Taint {
                key: "gpu".into(),
                value: "true".into(),
                effect: "NoSchedule".into()
            }]
        );
        assert_eq!(
            resources,
            BTreeMap::from([("ephemeral-storage".to_owned(), "100Gi".to_owned())])
        );
    }

    #[test]
    fn a_failed_launch_is_out_of_resources_with_awss_code_where_named() {
        let e = launch_error(
            "Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have sufficient m5.large capacity.",
        );
        assert_eq!(
            (e.class, e.code.as_str()),
            (
                InstanceErrorClass::OutOfResources,
                "InsufficientInstanceCapacity"
            )
        );
        let e = launch_error("The requested configuration is currently not supported.");
        assert_eq!(
            (e.class, e.code.as_str()),
            (InstanceErrorClass::OutOfResources, UNFULFILLABLE)
        );
    }

    #[test]
    fn lifecycle_states_map_to_the_autoscalers_states() {
        for (s, want) in [
            ("Pending", GroupInstanceState::Creating),
            ("Pending:Wait", GroupInstanceState::Creating),
            ("InService", GroupInstanceState::Running),
            ("Standby", GroupInstanceState::Running),
            ("Terminating:Wait", GroupInstanceState::Deleting),
            ("Detaching", GroupInstanceState::Deleting),
        ] {
            assert_eq!(state_of(Some(&LifecycleState::from(s))), want, "{s}");
        }
    }
}
