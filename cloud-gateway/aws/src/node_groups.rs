//! Cluster Autoscaler's node groups as Auto Scaling groups, found by its
//! own discovery tags (`k8s.io/cluster-autoscaler/enabled` and
//! `k8s.io/cluster-autoscaler/<cluster>`), answered as Cluster
//! Autoscaler's own AWS provider (`cloudprovider/aws`) answers. Only the
//! desired capacity is changed: `SetDesiredCapacity` to scale, and
//! `TerminateInstanceInAutoScalingGroup` with decrement to delete a named
//! instance of the group.
//!
//! - **Listing**: one `DescribeAutoScalingGroups` (its failure fails the
//!   listing). A group with fewer instances (all of them, terminating ones
//!   included) than its desired capacity shows the missing ones as
//!   placeholders (`i-placeholder-<group>-<n>`); when a scaling activity
//!   since this process last set the group's size failed, they carry
//!   upstream's out-of-resources error `placeholder-cannot-be-fulfilled`.
//!   One group's trouble is its own: a scaling activity that cannot be
//!   read leaves its placeholders without an error (upstream assumes the
//!   group available), and a template that cannot be read is that group's
//!   template's error alone (`template.rs`, `eks.rs`).
//! - **Options** from the `node-template/autoscaling-options` tags.
//! - **Deleting**: placeholders lower the desired capacity to the number of
//!   instances the group holds; an instance already terminating is
//!   skipped; every other is terminated with the desired capacity one
//!   lower. AWS refuses what would take the group below its minimum; the
//!   gateway refuses a group already at it; nothing else is refused here.
//!
//! Where this differs from upstream's provider, on purpose:
//! - A group whose launch template, requirements or image cannot be read
//!   is listed (its template answers the error); upstream fails its whole
//!   refresh when a mixed-instances group's launch template cannot be read.
//! - A failed launch's error message is upstream's sentence followed by
//!   AWS's own reason (the scaling activity's status message).
//! - Requirements are asked of EC2 with every bound the group sets
//!   (upstream leaves out `AllowedInstanceTypes` and
//!   `NetworkBandwidthGbps`, so its first type may be one the group never
//!   launches), and one page of the answer is read (its first type is the
//!   same).
//! - Labels come from tags whose key starts with `eks:` (upstream takes
//!   whatever follows `eks:` anywhere in a key); an EKS taint without a
//!   value is kept (upstream drops it); a template taint tag may be the
//!   effect alone (`NoSchedule`, upstream needs `value:NoSchedule`).

mod eks;
mod template;

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use async_trait::async_trait;
use aws_sdk_autoscaling::types::{
    Activity, AutoScalingGroup, Filter, LifecycleState, ScalingActivityStatusCode,
};
use ccm_provider::node_groups::{
    GroupInstance, GroupInstanceState, GroupOptions, InstanceError, InstanceErrorClass, NodeGroup,
    NodeGroups, OPTION_NAMES, UNFULFILLABLE,
};
use ccm_provider::{CloudError, Result};

use crate::instances::{parse_provider_id, provider_id};
use crate::{AwsCloud, errors, every_page};

/// The tag every group Cluster Autoscaler may scale carries.
pub const ENABLED_TAG: &str = "k8s.io/cluster-autoscaler/enabled";
/// The instance ID prefix of a placeholder for an instance not yet made.
const PLACEHOLDER_PREFIX: &str = "i-placeholder";
/// The start of a placeholder's error message, as upstream writes it.
const UNFULFILLABLE_MESSAGE: &str = "AWS cannot provision any more instances for this node group";
/// The Node label that marks GPU nodes on AWS, as Cluster Autoscaler's
/// AWS provider names it.
pub const GPU_LABEL: &str = "k8s.amazonaws.com/accelerator";
/// The GPU types Cluster Autoscaler's AWS provider knows (its
/// `availableGPUTypes`).
const GPU_TYPES: &[&str] = &[
    "nvidia-tesla-k80",
    "nvidia-tesla-p100",
    "nvidia-tesla-v100",
    "nvidia-tesla-t4",
    "nvidia-tesla-a100",
    "nvidia-a10g",
    "nvidia-l4",
    "nvidia-l40s",
];

/// What the provider remembers between listings.
#[derive(Default)]
pub(super) struct GroupCache {
    /// Instance types, launch templates and configurations, images.
    template: template::Cache,
    /// EKS managed node groups.
    managed: eks::Cache,
    /// When this process last set each group's size: a failed activity
    /// older than that says nothing of the group now.
    changed: HashMap<String, SystemTime>,
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

/// The error of a launch AWS could not fulfil: upstream's code and class,
/// and AWS's reason after upstream's message.
fn launch_error(reason: &str) -> InstanceError {
    InstanceError {
        class: InstanceErrorClass::OutOfResources,
        code: UNFULFILLABLE.to_owned(),
        message: if reason.is_empty() {
            UNFULFILLABLE_MESSAGE.to_owned()
        } else {
            format!("{UNFULFILLABLE_MESSAGE}: {reason}")
        },
    }
}

/// The error of the group's launches, as upstream's
/// `isNodeGroupAvailable` reads its scaling activities (newest first):
/// any that failed since `changed`, when this process last set the
/// group's size (all of them when it never did).
fn launch_failure(activities: &[Activity], changed: Option<SystemTime>) -> Option<InstanceError> {
    for activity in activities {
        let started = activity
            .start_time()
            .and_then(|t| SystemTime::try_from(*t).ok());
        if let (Some(started), Some(changed)) = (started, changed)
            && started < changed
        {
            break;
        }
        if activity.status_code() == Some(&ScalingActivityStatusCode::Failed) {
            return Some(launch_error(activity.status_message().unwrap_or_default()));
        }
    }
    None
}

/// The options the group's tags set; a value that does not parse is
/// left at the autoscaler's default, with a warning.
fn options(group: &str, tags: &BTreeMap<&str, &str>) -> GroupOptions {
    let mut out = GroupOptions::default();
    let prefix = format!("{}autoscaling-options/", template::TEMPLATE_PREFIX);
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

/// What deleting some of a group's instances takes.
#[derive(Debug, Default, PartialEq)]
struct Deletion {
    /// The desired capacity placeholders bring the group to: the number of
    /// instances it holds.
    lower_to: Option<u32>,
    /// The instances to terminate, each with the desired capacity one
    /// lower.
    terminate: Vec<String>,
}

/// What deleting `provider_ids` from `group`, whose instances are
/// `members` (ID and state), takes, as upstream's `DeleteInstances`
/// decides it: an instance already terminating is skipped, and one that
/// is not the group's is refused before anything is done.
fn plan_deletion(
    group: &str,
    members: &[(&str, GroupInstanceState)],
    provider_ids: &[String],
) -> Result<Deletion> {
    let own_placeholder = format!("{PLACEHOLDER_PREFIX}-{group}-");
    let mut plan = Deletion::default();
    for id in provider_ids {
        if id
            .rsplit('/')
            .next()
            .is_some_and(|i| i.starts_with(&own_placeholder))
        {
            plan.lower_to = Some(u32::try_from(members.len()).unwrap_or(u32::MAX));
            continue;
        }
        let instance = parse_provider_id(id).map_err(|e| invalid("provider_ids", e))?;
        match members.iter().find(|(m, _)| *m == instance) {
            // Already on its way out: terminating it again would lower
            // the desired capacity twice.
            Some((_, GroupInstanceState::Deleting)) => {}
            Some(_) => {
                if !plan.terminate.contains(&instance) {
                    plan.terminate.push(instance);
                }
            }
            None => {
                return Err(invalid(
                    "provider_ids",
                    format!("{id:?} is not an instance of node group {group:?}"),
                ));
            }
        }
    }
    Ok(plan)
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

    /// Why the group's launches fail, if they do. Activities that cannot
    /// be read say nothing: the group is taken as available, with a
    /// warning, as upstream takes it.
    async fn group_launch_failure(&self, name: &str) -> Option<InstanceError> {
        let answer = self
            .autoscaling
            .describe_scaling_activities()
            .auto_scaling_group_name(name)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeScalingActivities", e));
        match answer {
            Ok(answer) => {
                let changed = self.group_cache().changed.get(name).copied();
                launch_failure(answer.activities(), changed)
            }
            Err(error) => {
                tracing::warn!(
                    group = name,
                    %error,
                    "scaling activities not read; the group's missing instances are taken as coming"
                );
                None
            }
        }
    }

    async fn to_group(&self, group: &AutoScalingGroup) -> NodeGroup {
        let name = group.auto_scaling_group_name().unwrap_or_default();
        let tags = tags(group);
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
        // Every instance counts against the desired capacity, terminating
        // ones too, as upstream counts them.
        let held = u32::try_from(group.instances().len()).unwrap_or(u32::MAX);
        if target > held {
            let error = self.group_launch_failure(name).await;
            let zone = group
                .availability_zones()
                .first()
                .map_or("", String::as_str);
            instances.extend((held..target).map(|n| GroupInstance {
                provider_id: provider_id(zone, &placeholder_id(name, n)),
                state: GroupInstanceState::Creating,
                error: error.clone(),
            }));
        }
        NodeGroup {
            id: name.to_owned(),
            min_size: count(group.min_size()),
            max_size: count(group.max_size()),
            target_size: target,
            instances,
            template: self.template(name, group, &tags).await,
            options: options(name, &tags),
        }
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
            out.push(self.to_group(group).await);
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
        let members: Vec<(&str, GroupInstanceState)> = now
            .instances()
            .iter()
            .filter_map(|i| Some((i.instance_id()?, state_of(i.lifecycle_state()))))
            .collect();
        let plan = plan_deletion(group, &members, provider_ids)?;
        // Placeholders are instances not made yet: a lower desired
        // capacity is all that deleting them takes. AWS refuses one below
        // the group's minimum.
        if let Some(size) = plan.lower_to {
            self.set_desired(group, size).await?;
        }
        // One at a time, as upstream: AWS refuses the one that would take
        // the group below its minimum, and those before it are gone.
        for instance in plan.terminate {
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
    use std::time::Duration;

    use aws_sdk_autoscaling::primitives::DateTime;

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

    fn activity(status: ScalingActivityStatusCode, at: SystemTime, why: &str) -> Activity {
        Activity::builder()
            .activity_id("a")
            .auto_scaling_group_name("g")
            .cause("c")
            .start_time(DateTime::from(at))
            .status_code(status)
            .status_message(why)
            .build()
    }

    #[test]
    fn any_launch_failed_since_the_last_change_is_upstreams_unfulfillable_error() {
        use ScalingActivityStatusCode::{Failed, Successful};
        let now = SystemTime::now();
        let ago = |s| now - Duration::from_secs(s);
        let why =
            "Could not launch On-Demand Instances. InsufficientInstanceCapacity - no m5.large.";
        // Newest first, as AWS lists them: a failure behind a success
        // still counts while it is newer than the last change.
        let activities = [
            activity(Successful, ago(10), ""),
            activity(Failed, ago(20), why),
            activity(Failed, ago(100), "old"),
        ];
        let error = launch_failure(&activities, Some(ago(30))).unwrap();
        assert_eq!(
            (error.class, error.code.as_str()),
            (InstanceErrorClass::OutOfResources, UNFULFILLABLE)
        );
        assert_eq!(error.message, format!("{UNFULFILLABLE_MESSAGE}: {why}"));
        // Older than the last change: nothing to say about the group now.
        assert_eq!(launch_failure(&activities, Some(ago(15))), None);
        assert_eq!(launch_failure(&activities[..1], None), None);
        // Never changed here: every activity counts, as upstream counts them.
        assert_eq!(
            launch_failure(&activities[2..], None).map(|e| e.message),
            Some(format!("{UNFULFILLABLE_MESSAGE}: old"))
        );
    }

    #[test]
    fn deleting_skips_terminating_instances_and_placeholders_lower_to_what_the_group_holds() {
        use GroupInstanceState::{Creating, Deleting, Running};
        let members = [("i-1", Running), ("i-2", Deleting), ("i-3", Creating)];
        let id = |i: &str| format!("aws:///eu-west-1a/{i}");
        let ids = |list: &[&str]| list.iter().map(|i| id(i)).collect::<Vec<_>>();
        let plan = plan_deletion("g", &members, &ids(&["i-1", "i-2", "i-3", "i-1"])).unwrap();
        assert_eq!(
            plan,
            Deletion {
                lower_to: None,
                terminate: vec!["i-1".into(), "i-3".into()]
            }
        );
        // Placeholders: the desired capacity comes down to every instance
        // the group holds, the terminating one included.
        let plan = plan_deletion(
            "g",
            &members,
            &ids(&["i-placeholder-g-3", "i-placeholder-g-4", "i-2"]),
        )
        .unwrap();
        assert_eq!(
            plan,
            Deletion {
                lower_to: Some(3),
                terminate: Vec::new()
            }
        );
        // Not the group's: refused, whatever else was asked.
        for foreign in ["i-9", "i-placeholder-other-1"] {
            let err = plan_deletion("g", &members, &ids(&["i-1", foreign])).unwrap_err();
            assert!(matches!(err, CloudError::InvalidArgument(_)), "{err}");
        }
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
