//! What a new node of an Auto Scaling group looks like, built as Cluster
//! Autoscaler's AWS provider builds it (`buildNodeFromTemplate`):
//!
//! - **Instance type**: the launch configuration's; the first
//!   mixed-instances override's; or the launch template's, where a template
//!   (or the group's one override) that chooses types by attributes
//!   (`InstanceRequirements`) gets the first type EC2 names for them
//!   (`GetInstanceTypesFromInstanceRequirements`, for the architecture and
//!   virtualization of the template's image, `DescribeImages`).
//! - **Capacity**: that type's CPUs, memory and GPUs (`DescribeInstanceTypes`)
//!   and 110 pods; in a mixed-instances group choosing by attributes, the
//!   requirements' minimum CPUs, memory and (NVIDIA GPU accelerators)
//!   GPUs instead; then the `node-template/resources/<name>` tags, a value
//!   that is no Kubernetes quantity skipped with a warning.
//! - **Labels**: `kubernetes.io/arch` (`arm64`, else `amd64`, as upstream
//!   reads EC2's first architecture: `i386` is `amd64`),
//!   `topology.ebs.csi.aws.com/zone` (the EBS CSI driver's zone label, so
//!   a Pod with an EBS volume can scale a group up from zero); the gateway
//!   adds the other well-known ones. Then `node-template/label/<name>` and
//!   `eks:<name>` tags, which win over those.
//! - **Taints**: the `node-template/taint/<key>` tags (`value:Effect`).
//! - **EKS managed node groups** (both `nodegroup-name` and `cluster-name`
//!   labels, from EKS's `eks:` tags): EKS's labels win over all the above,
//!   its taints are added, its `resources/*` tags win over the group's
//!   (`eks.rs`).
//!
//! Instance types, images and launch configurations never change, so they
//! are read once; a launch template version named `$Latest` or
//! `$Default`, and the type chosen for a set of requirements, are read
//! again after [`TEMPLATE_REFRESH`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_autoscaling::types::{
    AutoScalingGroup, InstanceRequirements as GroupRequirements, LaunchTemplateSpecification,
};
use aws_sdk_ec2::types::{
    self as ec2, AcceleratorManufacturer, AcceleratorType, ArchitectureType, InstanceRequirements,
    InstanceRequirementsRequest, VirtualizationType,
};
use ccm_provider::node_groups::{NodeTemplate, Taint, is_quantity};
use ccm_provider::{CloudError, Result};

use super::eks::ManagedGroup;
use crate::{AwsCloud, errors};

/// The prefix of the template's tags.
pub(super) const TEMPLATE_PREFIX: &str = "k8s.io/cluster-autoscaler/node-template/";
/// The prefix of the tags EKS puts on the groups of its managed node
/// groups (`eks:cluster-name`, `eks:nodegroup-name`), read as labels.
const EKS_PREFIX: &str = "eks:";
/// How long a launch template version's data, or the type chosen for a
/// set of requirements, is kept.
const TEMPLATE_REFRESH: Duration = Duration::from_secs(300);
/// Pods a node of any type takes (Cluster Autoscaler's AWS default).
const PODS: u32 = 110;
/// The label of a node's CPU architecture.
const ARCH_LABEL: &str = "kubernetes.io/arch";
/// The EBS CSI driver's zone label, which upstream's template carries.
pub(super) const EBS_ZONE_LABEL: &str = "topology.ebs.csi.aws.com/zone";
/// The extended resource of NVIDIA GPUs.
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// What the provider remembers of templates between listings.
#[derive(Default)]
pub(super) struct Cache {
    /// CPUs, memory, GPUs and architecture of each instance type.
    types: HashMap<String, TypeInfo>,
    /// What a launch template version holds, and when read.
    templates: HashMap<String, (TemplateData, Instant)>,
    /// The instance type of each launch configuration.
    configurations: HashMap<String, Option<String>>,
    /// The architecture and virtualization of each image.
    images: HashMap<String, (ArchitectureType, VirtualizationType)>,
    /// The first type EC2 names for an image and a set of requirements,
    /// and when read.
    chosen: HashMap<String, (String, Instant)>,
}

/// What an instance type offers.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct TypeInfo {
    pub cpus: i32,
    pub memory_mib: i64,
    pub gpus: i32,
    /// `amd64` or `arm64`.
    pub arch: &'static str,
}

/// What of a launch template version the template needs.
#[derive(Clone, Debug, Default)]
struct TemplateData {
    instance_type: Option<String>,
    image_id: Option<String>,
    requirements: Option<InstanceRequirements>,
}

/// How a group chooses the type of a new instance.
#[derive(Debug, PartialEq)]
enum Launch<'a> {
    /// A launch configuration's type.
    Configuration(&'a str),
    /// The first instance type a mixed-instances policy overrides with.
    Type(&'a str),
    /// A launch template's type or requirements; `mixed` where it is a
    /// mixed-instances policy's, whose requirements' minimums then set
    /// the capacity.
    Template {
        spec: &'a LaunchTemplateSpecification,
        mixed: bool,
    },
    /// A mixed-instances policy's one override by attributes, over its
    /// launch template's image.
    Requirements {
        spec: &'a LaunchTemplateSpecification,
        requirements: &'a GroupRequirements,
    },
}

/// The type of a new instance and, for types chosen by attributes in a
/// mixed-instances group, the requirements' minimums.
#[derive(Clone, Debug, PartialEq)]
struct LaunchSpec {
    instance_type: String,
    minimums: Option<Minimums>,
}

/// The least a type chosen by attributes offers.
#[derive(Clone, Debug, Default, PartialEq)]
struct Minimums {
    cpus: Option<i32>,
    memory_mib: Option<i32>,
    /// Only where the requirements ask for NVIDIA GPUs.
    gpus: Option<i32>,
}

/// The labels, taints and resources a group's tags give its template.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct TagTemplate {
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Valid Kubernetes quantities only.
    pub resources: BTreeMap<String, String>,
}

/// The `kubernetes.io/arch` of EC2's architecture name, as upstream reads
/// it: `arm64`, and `amd64` for everything else (`x86_64`, and `i386`,
/// which t2 types name first).
pub(super) fn architecture(name: &str) -> &'static str {
    if name == "arm64" { "arm64" } else { "amd64" }
}

/// How `group` chooses the type of a new instance, in upstream's order.
fn launch_of(group: &AutoScalingGroup) -> Option<Launch<'_>> {
    if let Some(name) = group.launch_configuration_name().filter(|n| !n.is_empty()) {
        return Some(Launch::Configuration(name));
    }
    if let Some(spec) = group.launch_template() {
        return Some(Launch::Template { spec, mixed: false });
    }
    let mixed = group.mixed_instances_policy()?.launch_template()?;
    let overrides = mixed.overrides();
    if let Some(t) = overrides.iter().find_map(|o| o.instance_type()) {
        return Some(Launch::Type(t));
    }
    let spec = mixed.launch_template_specification()?;
    if let [only] = overrides
        && let Some(requirements) = only.instance_requirements()
    {
        return Some(Launch::Requirements { spec, requirements });
    }
    Some(Launch::Template { spec, mixed: true })
}

/// The minimums of `r` that set a template's capacity (upstream's
/// `updateCapacityWithRequirementsOverrides`).
fn minimums(r: &InstanceRequirements) -> Minimums {
    let nvidia = r
        .accelerator_manufacturers()
        .contains(&AcceleratorManufacturer::Nvidia)
        && r.accelerator_types().contains(&AcceleratorType::Gpu);
    Minimums {
        cpus: r.v_cpu_count().and_then(|c| c.min()),
        memory_mib: r.memory_mib().and_then(|m| m.min()),
        gpus: if nvidia {
            r.accelerator_count().and_then(|c| c.min())
        } else {
            None
        },
    }
}

/// A range of type `$to` with the bounds of `$from` (an `Option<&range>`).
macro_rules! range {
    ($to:ty, $from:expr) => {
        $from.map(|r| <$to>::builder().set_min(r.min).set_max(r.max).build())
    };
}

/// A list of the enum `$to` with the values of `$from` (an
/// `Option<Vec<enum>>` of another crate).
macro_rules! values {
    ($to:ty, $from:expr) => {
        $from
            .as_ref()
            .map(|v| v.iter().map(|e| <$to>::from(e.as_str())).collect())
    };
}

/// An Auto Scaling group's requirements as EC2 writes them.
fn ec2_requirements(r: &GroupRequirements) -> InstanceRequirements {
    InstanceRequirements::builder()
        .set_v_cpu_count(range!(ec2::VCpuCountRange, r.v_cpu_count.as_ref()))
        .set_memory_mib(range!(ec2::MemoryMiB, r.memory_mib.as_ref()))
        .set_cpu_manufacturers(values!(ec2::CpuManufacturer, r.cpu_manufacturers))
        .set_memory_gib_per_v_cpu(range!(
            ec2::MemoryGiBPerVCpu,
            r.memory_gib_per_v_cpu.as_ref()
        ))
        .set_excluded_instance_types(r.excluded_instance_types.clone())
        .set_allowed_instance_types(r.allowed_instance_types.clone())
        .set_instance_generations(values!(ec2::InstanceGeneration, r.instance_generations))
        .set_spot_max_price_percentage_over_lowest_price(
            r.spot_max_price_percentage_over_lowest_price,
        )
        .set_max_spot_price_as_percentage_of_optimal_on_demand_price(
            r.max_spot_price_as_percentage_of_optimal_on_demand_price,
        )
        .set_on_demand_max_price_percentage_over_lowest_price(
            r.on_demand_max_price_percentage_over_lowest_price,
        )
        .set_bare_metal(r.bare_metal.as_ref().map(|b| b.as_str().into()))
        .set_burstable_performance(r.burstable_performance.as_ref().map(|b| b.as_str().into()))
        .set_require_hibernate_support(r.require_hibernate_support)
        .set_network_interface_count(range!(
            ec2::NetworkInterfaceCount,
            r.network_interface_count.as_ref()
        ))
        .set_local_storage(r.local_storage.as_ref().map(|l| l.as_str().into()))
        .set_local_storage_types(values!(ec2::LocalStorageType, r.local_storage_types))
        .set_total_local_storage_gb(range!(
            ec2::TotalLocalStorageGb,
            r.total_local_storage_gb.as_ref()
        ))
        .set_baseline_ebs_bandwidth_mbps(range!(
            ec2::BaselineEbsBandwidthMbps,
            r.baseline_ebs_bandwidth_mbps.as_ref()
        ))
        .set_accelerator_types(values!(ec2::AcceleratorType, r.accelerator_types))
        .set_accelerator_count(range!(ec2::AcceleratorCount, r.accelerator_count.as_ref()))
        .set_accelerator_manufacturers(values!(
            ec2::AcceleratorManufacturer,
            r.accelerator_manufacturers
        ))
        .set_accelerator_names(values!(ec2::AcceleratorName, r.accelerator_names))
        .set_accelerator_total_memory_mib(range!(
            ec2::AcceleratorTotalMemoryMiB,
            r.accelerator_total_memory_mib.as_ref()
        ))
        .set_network_bandwidth_gbps(range!(
            ec2::NetworkBandwidthGbps,
            r.network_bandwidth_gbps.as_ref()
        ))
        .build()
}

/// `r` as `GetInstanceTypesFromInstanceRequirements` asks for it.
fn request(r: &InstanceRequirements) -> InstanceRequirementsRequest {
    InstanceRequirementsRequest::builder()
        .set_v_cpu_count(range!(ec2::VCpuCountRangeRequest, r.v_cpu_count.as_ref()))
        .set_memory_mib(range!(ec2::MemoryMiBRequest, r.memory_mib.as_ref()))
        .set_cpu_manufacturers(r.cpu_manufacturers.clone())
        .set_memory_gib_per_v_cpu(range!(
            ec2::MemoryGiBPerVCpuRequest,
            r.memory_gib_per_v_cpu.as_ref()
        ))
        .set_excluded_instance_types(r.excluded_instance_types.clone())
        .set_allowed_instance_types(r.allowed_instance_types.clone())
        .set_instance_generations(r.instance_generations.clone())
        .set_spot_max_price_percentage_over_lowest_price(
            r.spot_max_price_percentage_over_lowest_price,
        )
        .set_max_spot_price_as_percentage_of_optimal_on_demand_price(
            r.max_spot_price_as_percentage_of_optimal_on_demand_price,
        )
        .set_on_demand_max_price_percentage_over_lowest_price(
            r.on_demand_max_price_percentage_over_lowest_price,
        )
        .set_bare_metal(r.bare_metal.clone())
        .set_burstable_performance(r.burstable_performance.clone())
        .set_require_hibernate_support(r.require_hibernate_support)
        .set_network_interface_count(range!(
            ec2::NetworkInterfaceCountRequest,
            r.network_interface_count.as_ref()
        ))
        .set_local_storage(r.local_storage.clone())
        .set_local_storage_types(r.local_storage_types.clone())
        .set_total_local_storage_gb(range!(
            ec2::TotalLocalStorageGbRequest,
            r.total_local_storage_gb.as_ref()
        ))
        .set_baseline_ebs_bandwidth_mbps(range!(
            ec2::BaselineEbsBandwidthMbpsRequest,
            r.baseline_ebs_bandwidth_mbps.as_ref()
        ))
        .set_accelerator_types(r.accelerator_types.clone())
        .set_accelerator_count(range!(
            ec2::AcceleratorCountRequest,
            r.accelerator_count.as_ref()
        ))
        .set_accelerator_manufacturers(r.accelerator_manufacturers.clone())
        .set_accelerator_names(r.accelerator_names.clone())
        .set_accelerator_total_memory_mib(range!(
            ec2::AcceleratorTotalMemoryMiBRequest,
            r.accelerator_total_memory_mib.as_ref()
        ))
        .set_network_bandwidth_gbps(range!(
            ec2::NetworkBandwidthGbpsRequest,
            r.network_bandwidth_gbps.as_ref()
        ))
        .build()
}

/// The resources among `tags` (`resources/<name>` keys under `prefix`)
/// whose value is a Kubernetes quantity; any other is skipped with a
/// warning, as upstream skips it.
fn resources<'a>(
    group: &str,
    prefix: &str,
    tags: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, value) in tags {
        let Some(name) = key
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("resources/"))
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        if is_quantity(value) {
            out.insert(name.to_owned(), value.to_owned());
        } else {
            tracing::warn!(
                group,
                tag = key,
                value,
                "template resource ignored: its value is not a Kubernetes quantity"
            );
        }
    }
    out
}

/// The labels, taints and resources the group's tags name.
pub(super) fn from_tags(group: &str, tags: &BTreeMap<&str, &str>) -> TagTemplate {
    let mut out = TagTemplate {
        resources: resources(group, TEMPLATE_PREFIX, tags.iter().map(|(k, v)| (*k, *v))),
        ..TagTemplate::default()
    };
    for (key, value) in tags {
        if let Some(name) = key.strip_prefix(EKS_PREFIX).filter(|n| !n.is_empty()) {
            out.labels.insert(name.to_owned(), (*value).to_owned());
            continue;
        }
        let Some(rest) = key.strip_prefix(TEMPLATE_PREFIX) else {
            continue;
        };
        if let Some(name) = rest.strip_prefix("label/").filter(|n| !n.is_empty()) {
            out.labels.insert(name.to_owned(), (*value).to_owned());
        } else if let Some(name) = rest.strip_prefix("taint/") {
            // `value:Effect`, or `Effect` alone.
            let (value, effect) = value.rsplit_once(':').unwrap_or(("", value));
            if ["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                out.taints.push(Taint {
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
        }
    }
    out
}

/// The template of a group launching `spec`'s instances of `info` into
/// `zones`, shaped by its tags and, for an EKS managed node group, by
/// what EKS says of it.
fn build(
    group: &str,
    spec: &LaunchSpec,
    info: &TypeInfo,
    zones: &[String],
    region: &str,
    tags: TagTemplate,
    managed: Option<ManagedGroup>,
) -> NodeTemplate {
    let mut capacity = BTreeMap::from([
        ("pods".to_owned(), PODS.to_string()),
        ("cpu".to_owned(), info.cpus.to_string()),
        ("memory".to_owned(), format!("{}Mi", info.memory_mib)),
    ]);
    if info.gpus > 0 {
        capacity.insert(GPU_RESOURCE.to_owned(), info.gpus.to_string());
    }
    if let Some(least) = &spec.minimums {
        let mut set = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                capacity.insert(name.to_owned(), value);
            }
        };
        set("cpu", least.cpus.map(|c| c.to_string()));
        set("memory", least.memory_mib.map(|m| format!("{m}Mi")));
        set(GPU_RESOURCE, least.gpus.map(|g| g.to_string()));
    }
    capacity.extend(tags.resources);
    let mut labels = BTreeMap::from([(ARCH_LABEL.to_owned(), info.arch.to_owned())]);
    if let Some(zone) = zones.first() {
        labels.insert(EBS_ZONE_LABEL.to_owned(), zone.clone());
    }
    labels.extend(tags.labels);
    let mut taints = tags.taints;
    if let Some(managed) = managed {
        labels.extend(managed.labels);
        taints.extend(managed.taints);
        capacity.extend(resources(
            group,
            TEMPLATE_PREFIX,
            managed.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        ));
    }
    NodeTemplate {
        instance_type: spec.instance_type.clone(),
        zones: zones.to_vec(),
        region: region.to_owned(),
        capacity,
        labels,
        taints,
    }
}

fn not_configured(group: &str, problem: impl std::fmt::Display) -> CloudError {
    CloudError::NotConfigured(format!("Auto Scaling group {group:?}: {problem}"))
}

impl AwsCloud {
    /// The template of `group` (named `name`, tagged `tags`).
    pub(super) async fn template(
        &self,
        name: &str,
        group: &AutoScalingGroup,
        tags: &BTreeMap<&str, &str>,
    ) -> Result<NodeTemplate> {
        let zones = group.availability_zones();
        if zones.is_empty() {
            return Err(not_configured(name, "no availability zone"));
        }
        let spec = self.launch_spec(name, group).await?;
        let info = self.type_info(&spec.instance_type).await?.ok_or_else(|| {
            not_configured(
                name,
                format!(
                    "EC2 does not know its instance type {:?}",
                    spec.instance_type
                ),
            )
        })?;
        let tags = from_tags(name, tags);
        let managed = match (
            tags.labels.get("cluster-name"),
            tags.labels.get("nodegroup-name"),
        ) {
            (Some(cluster), Some(nodegroup)) if !cluster.is_empty() && !nodegroup.is_empty() => {
                self.managed_node_group(cluster, nodegroup).await
            }
            _ => None,
        };
        Ok(build(
            name,
            &spec,
            &info,
            zones,
            &self.region,
            tags,
            managed,
        ))
    }

    /// The instance type new instances of `group` get.
    async fn launch_spec(&self, name: &str, group: &AutoScalingGroup) -> Result<LaunchSpec> {
        let unknown = || not_configured(name, "could not find its instance type");
        let plain = |instance_type: String| LaunchSpec {
            instance_type,
            minimums: None,
        };
        match launch_of(group).ok_or_else(unknown)? {
            Launch::Configuration(c) => Ok(plain(
                self.configuration_type(c).await?.ok_or_else(unknown)?,
            )),
            Launch::Type(t) => Ok(plain(t.to_owned())),
            Launch::Template { spec, mixed } => {
                let data = self.template_data(spec).await?;
                let instance_type = match (&data.instance_type, &data.requirements, &data.image_id)
                {
                    (Some(t), ..) => t.clone(),
                    (None, Some(r), Some(image)) => self.first_type(name, image, r).await?,
                    _ => return Err(unknown()),
                };
                Ok(LaunchSpec {
                    instance_type,
                    minimums: data.requirements.as_ref().filter(|_| mixed).map(minimums),
                })
            }
            Launch::Requirements { spec, requirements } => {
                let data = self.template_data(spec).await?;
                let image = data
                    .image_id
                    .as_deref()
                    .ok_or_else(|| not_configured(name, "its launch template names no image"))?;
                let requirements = ec2_requirements(requirements);
                Ok(LaunchSpec {
                    instance_type: self.first_type(name, image, &requirements).await?,
                    minimums: Some(minimums(&requirements)),
                })
            }
        }
    }

    /// The instance type of a launch configuration, read once.
    async fn configuration_type(&self, name: &str) -> Result<Option<String>> {
        if let Some(t) = self.group_cache().template.configurations.get(name) {
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
            .template
            .configurations
            .insert(name.to_owned(), t.clone());
        Ok(t)
    }

    /// What the launch template version `spec` names holds.
    async fn template_data(&self, spec: &LaunchTemplateSpecification) -> Result<TemplateData> {
        let version = spec.version().unwrap_or("$Default").to_owned();
        let key = format!(
            "{}/{}/{version}",
            spec.launch_template_id().unwrap_or_default(),
            spec.launch_template_name().unwrap_or_default()
        );
        if let Some((data, at)) = self.group_cache().template.templates.get(&key)
            && (at.elapsed() < TEMPLATE_REFRESH || !version.starts_with('$'))
        {
            return Ok(data.clone());
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
        let data = answer
            .launch_template_versions()
            .first()
            .and_then(|v| v.launch_template_data())
            .map(|d| TemplateData {
                instance_type: d.instance_type().map(|t| t.as_str().to_owned()),
                image_id: d.image_id().map(str::to_owned),
                requirements: d.instance_requirements().cloned(),
            })
            .unwrap_or_default();
        self.group_cache()
            .template
            .templates
            .insert(key, (data.clone(), Instant::now()));
        Ok(data)
    }

    /// The first instance type EC2 names for `requirements` on `image`'s
    /// architecture and virtualization, as upstream picks it.
    async fn first_type(
        &self,
        group: &str,
        image: &str,
        requirements: &InstanceRequirements,
    ) -> Result<String> {
        let request = request(requirements);
        let key = format!("{image} {request:?}");
        if let Some((t, at)) = self.group_cache().template.chosen.get(&key)
            && at.elapsed() < TEMPLATE_REFRESH
        {
            return Ok(t.clone());
        }
        let (arch, virtualization) = self.image(group, image).await?;
        // One page: its first type is the first of all of them.
        let answer = self
            .ec2
            .get_instance_types_from_instance_requirements()
            .architecture_types(arch)
            .virtualization_types(virtualization)
            .instance_requirements(request)
            .send()
            .await
            .map_err(|e| errors::cloud_error("GetInstanceTypesFromInstanceRequirements", e))?;
        let t = answer
            .instance_types()
            .iter()
            .find_map(|t| t.instance_type())
            .map(str::to_owned)
            .ok_or_else(|| not_configured(group, "no instance type meets its requirements"))?;
        self.group_cache()
            .template
            .chosen
            .insert(key, (t.clone(), Instant::now()));
        Ok(t)
    }

    /// The architecture and virtualization of `image`, read once.
    async fn image(
        &self,
        group: &str,
        image: &str,
    ) -> Result<(ArchitectureType, VirtualizationType)> {
        if let Some(known) = self.group_cache().template.images.get(image) {
            return Ok(known.clone());
        }
        let answer = self
            .ec2
            .describe_images()
            .image_ids(image)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeImages", e))?;
        let known = answer
            .images()
            .first()
            .and_then(|i| {
                Some((
                    ArchitectureType::from(i.architecture()?.as_str()),
                    i.virtualization_type()?.clone(),
                ))
            })
            .ok_or_else(|| {
                not_configured(
                    group,
                    format!("its launch template's image {image} is not found"),
                )
            })?;
        self.group_cache()
            .template
            .images
            .insert(image.to_owned(), known.clone());
        Ok(known)
    }

    /// What an instance type offers, read once.
    async fn type_info(&self, instance_type: &str) -> Result<Option<TypeInfo>> {
        if let Some(info) = self.group_cache().template.types.get(instance_type) {
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
            arch: architecture(
                t.processor_info()
                    .and_then(|p| p.supported_architectures().first())
                    .map_or("", |a| a.as_str()),
            ),
        };
        self.group_cache()
            .template
            .types
            .insert(instance_type.to_owned(), info.clone());
        Ok(Some(info))
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_autoscaling::types::{
        LaunchTemplate, LaunchTemplateOverrides, MemoryMiBRequest, MixedInstancesPolicy,
        VCpuCountRequest,
    };

    use super::*;

    fn spec() -> LaunchTemplateSpecification {
        LaunchTemplateSpecification::builder()
            .launch_template_name("lt")
            .version("$Latest")
            .build()
    }

    fn group_requirements() -> GroupRequirements {
        GroupRequirements::builder()
            .v_cpu_count(VCpuCountRequest::builder().min(4).max(8).build())
            .memory_mib(MemoryMiBRequest::builder().min(16384).build())
            .accelerator_manufacturers(aws_sdk_autoscaling::types::AcceleratorManufacturer::Nvidia)
            .accelerator_types(aws_sdk_autoscaling::types::AcceleratorType::Gpu)
            .accelerator_count(
                aws_sdk_autoscaling::types::AcceleratorCountRequest::builder()
                    .min(1)
                    .build(),
            )
            .allowed_instance_types("g5.*")
            .build()
    }

    fn mixed(overrides: Vec<LaunchTemplateOverrides>) -> AutoScalingGroup {
        AutoScalingGroup::builder()
            .mixed_instances_policy(
                MixedInstancesPolicy::builder()
                    .launch_template(
                        LaunchTemplate::builder()
                            .launch_template_specification(spec())
                            .set_overrides(Some(overrides))
                            .build(),
                    )
                    .build(),
            )
            .build()
    }

    #[test]
    fn a_group_chooses_its_type_as_upstream_reads_it() {
        let configured = AutoScalingGroup::builder()
            .launch_configuration_name("lc")
            .build();
        assert_eq!(launch_of(&configured), Some(Launch::Configuration("lc")));
        let templated = AutoScalingGroup::builder().launch_template(spec()).build();
        assert_eq!(
            launch_of(&templated),
            Some(Launch::Template {
                spec: &spec(),
                mixed: false
            })
        );
        let typed = mixed(vec![
            LaunchTemplateOverrides::builder().build(),
            LaunchTemplateOverrides::builder()
                .instance_type("m5.large")
                .build(),
        ]);
        assert_eq!(launch_of(&typed), Some(Launch::Type("m5.large")));
        let attributes = mixed(vec![
            LaunchTemplateOverrides::builder()
                .instance_requirements(group_requirements())
                .build(),
        ]);
        assert_eq!(
            launch_of(&attributes),
            Some(Launch::Requirements {
                spec: &spec(),
                requirements: &group_requirements()
            })
        );
        let bare = mixed(Vec::new());
        assert_eq!(
            launch_of(&bare),
            Some(Launch::Template {
                spec: &spec(),
                mixed: true
            })
        );
        assert_eq!(launch_of(&AutoScalingGroup::builder().build()), None);
    }

    #[test]
    fn requirements_keep_their_bounds_and_give_their_minimums() {
        let r = ec2_requirements(&group_requirements());
        assert_eq!(
            minimums(&r),
            Minimums {
                cpus: Some(4),
                memory_mib: Some(16384),
                gpus: Some(1),
            }
        );
        let asked = request(&r);
        assert_eq!(asked.v_cpu_count().and_then(|c| c.max()), Some(8));
        assert_eq!(asked.memory_mib().and_then(|m| m.min()), Some(16384));
        assert_eq!(asked.allowed_instance_types(), ["g5.*"]);
        assert_eq!(asked.accelerator_types(), [AcceleratorType::Gpu]);
        // GPUs count only where the requirements ask for NVIDIA GPUs.
        let inference = InstanceRequirements::builder()
            .accelerator_types(AcceleratorType::Inference)
            .accelerator_count(ec2::AcceleratorCount::builder().min(2).build())
            .build();
        assert_eq!(minimums(&inference).gpus, None);
    }

    #[test]
    fn ec2_architectures_map_as_upstream_maps_them() {
        for (ec2, want) in [
            ("arm64", "arm64"),
            ("x86_64", "amd64"),
            ("i386", "amd64"),
            ("x86_64_mac", "amd64"),
            ("", "amd64"),
        ] {
            assert_eq!(architecture(ec2), want, "{ec2}");
        }
    }

    #[test]
    fn tags_give_labels_taints_and_resources_and_bad_quantities_are_skipped() {
        let p = TEMPLATE_PREFIX;
        let (l, t, r, bad_r) = (
            format!("{p}label/team"),
            format!("{p}taint/gpu"),
            format!("{p}resources/ephemeral-storage"),
            format!("{p}resources/hugepages-2Mi"),
        );
        let bad_t = format!("{p}taint/odd");
        let tags = BTreeMap::from([
            (l.as_str(), "ml"),
            (t.as_str(), "true:NoSchedule"),
            (r.as_str(), "100Gi"),
            (bad_r.as_str(), "lots"),
            (bad_t.as_str(), "x:Sometimes"),
            ("eks:nodegroup-name", "ng-1"),
            ("Name", "worker"),
        ]);
        let got = from_tags("g", &tags);
        assert_eq!(
            got.labels,
            BTreeMap::from([
                ("nodegroup-name".to_owned(), "ng-1".to_owned()),
                ("team".to_owned(), "ml".to_owned()),
            ])
        );
        assert_eq!(
            got.taints,
            vec![Taint {
                key: "gpu".into(),
                value: "true".into(),
                effect: "NoSchedule".into()
            }]
        );
        assert_eq!(
            got.resources,
            BTreeMap::from([("ephemeral-storage".to_owned(), "100Gi".to_owned())])
        );
    }

    fn info(arch: &'static str) -> TypeInfo {
        TypeInfo {
            cpus: 2,
            memory_mib: 8192,
            gpus: 0,
            arch,
        }
    }

    #[test]
    fn the_template_has_the_types_shape_the_zone_labels_and_the_tags_over_them() {
        let zones = vec!["eu-west-1b".to_owned(), "eu-west-1a".to_owned()];
        let mut tags = TagTemplate::default();
        tags.labels.insert(ARCH_LABEL.into(), "arm64".into());
        tags.resources.insert("cpu".into(), "3".into());
        let spec = LaunchSpec {
            instance_type: "t2.medium".into(),
            minimums: None,
        };
        let t = build("g", &spec, &info("amd64"), &zones, "eu-west-1", tags, None);
        assert_eq!(t.labels[EBS_ZONE_LABEL], "eu-west-1b");
        // The group's own label wins over the type's architecture.
        assert_eq!(t.labels[ARCH_LABEL], "arm64");
        assert_eq!(t.capacity["cpu"], "3");
        assert_eq!(t.capacity["memory"], "8192Mi");
        assert_eq!(t.capacity["pods"], "110");
        assert!(!t.capacity.contains_key(GPU_RESOURCE));
    }

    #[test]
    fn types_chosen_by_attributes_get_the_requirements_minimums() {
        let spec = LaunchSpec {
            instance_type: "g5.2xlarge".into(),
            minimums: Some(Minimums {
                cpus: Some(4),
                memory_mib: Some(16384),
                gpus: Some(1),
            }),
        };
        let t = build(
            "g",
            &spec,
            &info("amd64"),
            &["eu-west-1a".to_owned()],
            "eu-west-1",
            TagTemplate::default(),
            None,
        );
        assert_eq!(t.capacity["cpu"], "4");
        assert_eq!(t.capacity["memory"], "16384Mi");
        assert_eq!(t.capacity[GPU_RESOURCE], "1");
        assert_eq!(t.instance_type, "g5.2xlarge");
    }

    #[test]
    fn an_eks_node_groups_labels_win_and_its_taints_and_resources_are_added() {
        let mut tags = TagTemplate::default();
        tags.labels.insert("team".into(), "from-tag".into());
        tags.labels.insert("pool".into(), "a".into());
        tags.taints.push(Taint {
            key: "a".into(),
            value: String::new(),
            effect: "NoSchedule".into(),
        });
        tags.resources
            .insert("ephemeral-storage".into(), "20Gi".into());
        let managed = ManagedGroup {
            labels: BTreeMap::from([("team".to_owned(), "from-eks".to_owned())]),
            taints: vec![Taint {
                key: "b".into(),
                value: "x".into(),
                effect: "NoExecute".into(),
            }],
            tags: BTreeMap::from([
                (
                    format!("{TEMPLATE_PREFIX}resources/ephemeral-storage"),
                    "50Gi".to_owned(),
                ),
                (format!("{TEMPLATE_PREFIX}resources/bad"), "x y".to_owned()),
            ]),
        };
        let spec = LaunchSpec {
            instance_type: "m5.large".into(),
            minimums: None,
        };
        let t = build(
            "g",
            &spec,
            &info("amd64"),
            &["eu-west-1a".to_owned()],
            "eu-west-1",
            tags,
            Some(managed),
        );
        assert_eq!(t.labels["team"], "from-eks");
        assert_eq!(t.labels["pool"], "a");
        let keys: Vec<&str> = t.taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(t.capacity["ephemeral-storage"], "50Gi");
        assert!(!t.capacity.contains_key("bad"));
    }
}
