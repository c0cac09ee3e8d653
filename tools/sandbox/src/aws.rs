//! AWS without an account: moto's server (`moto[server]` from PyPI, in
//! `tests/requirements.txt`) on a loopback port, an EC2 client for it,
//! seeding of what a cluster needs (a VPC, tagged subnets in two zones, a
//! tagged route table, instances), and a proxy in front of it that injects
//! the failures AWS produces (throttling, refused credentials, server
//! errors) and counts the API actions the gateway sends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::{
    AttributeBooleanValue, Filter, InstanceStateName, InstanceType, ResourceType, Tag,
    TagSpecification,
};
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use tokio::process::{Child, Command};

use crate::gateway::Started;
use crate::ports::free_port;

/// The region the tests and the sandbox use; moto serves any.
pub const REGION: &str = "eu-west-1";
/// The zones the seeded subnets are in.
pub const ZONES: [&str; 2] = ["eu-west-1a", "eu-west-1b"];
/// The dummy access key the gateway gets from its environment; moto takes
/// any. Tests look for it in logs.
pub const ACCESS_KEY_ID: &str = "AKIAMOTOEXAMPLE00001";

/// A secret access key nobody could guess, so a test can prove it never
/// appears in a log.
pub fn secret_access_key() -> String {
    format!("moto-secret-{}", uuid::Uuid::new_v4().simple())
}

/// The environment that gives a process dummy credentials and a region
/// through the SDK's standard chain, and nothing from this machine's own
/// AWS configuration.
pub fn credentials_env(secret: &str, dir: &Path) -> Vec<(String, String)> {
    [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", secret.to_owned()),
        ("AWS_REGION", REGION.to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        (
            "AWS_CONFIG_FILE",
            dir.join("no-aws-config").display().to_string(),
        ),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("no-aws-credentials").display().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A running moto server; stopped when dropped.
pub struct Moto {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    _child: Child,
}

impl Moto {
    /// Starts moto with its log in `dir/moto.log` and waits until it answers.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let python = std::env::var("MOTO_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut last = None;
        // A port picked free may be taken before moto binds it: try again.
        for _ in 0..3 {
            let port = free_port()?;
            let log = std::fs::File::create(dir.join("moto.log"))?;
            let mut child = Command::new(&python)
                .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("start {python} -m moto.server"))?;
            let endpoint = format!("http://127.0.0.1:{port}");
            match crate::gateway::until_listening(&mut child, port, Duration::from_secs(30)).await?
            {
                Started::Listening => {
                    return Ok(Self {
                        endpoint,
                        _child: child,
                    });
                }
                Started::Exited(status) => {
                    let log = std::fs::read_to_string(dir.join("moto.log")).unwrap_or_default();
                    last = Some(anyhow::anyhow!(
                        "moto exited ({status}); is it installed? pip install -r tests/requirements.txt\n{log}"
                    ));
                }
                Started::Silent => last = Some(anyhow::anyhow!("moto did not listen within 30 s")),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("moto did not start")))
    }

    /// An EC2 client for this server with dummy credentials.
    pub fn ec2(&self) -> aws_sdk_ec2::Client {
        ec2_client(&self.endpoint)
    }

    /// An ELBv2 client for this server with dummy credentials.
    pub fn elb(&self) -> aws_sdk_elasticloadbalancingv2::Client {
        elb_client(&self.endpoint)
    }
}

/// The SDK configuration for `endpoint` with dummy credentials, on rustls
/// with ring as everything here.
fn sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .http_client(http)
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(Credentials::new(
                ACCESS_KEY_ID,
                "seeding-secret",
                None,
                None,
                "moto",
            )),
        )
        .build()
}

/// An EC2 client for `endpoint`.
pub fn ec2_client(endpoint: &str) -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::new(&sdk_config(endpoint))
}

/// An ELBv2 client for `endpoint`.
pub fn elb_client(endpoint: &str) -> aws_sdk_elasticloadbalancingv2::Client {
    aws_sdk_elasticloadbalancingv2::Client::new(&sdk_config(endpoint))
}

/// A client of the Classic ELB API at `endpoint`.
pub fn classic_elb_client(endpoint: &str) -> aws_sdk_elasticloadbalancing::Client {
    aws_sdk_elasticloadbalancing::Client::new(&sdk_config(endpoint))
}

/// An Auto Scaling client for `endpoint`.
pub fn autoscaling_client(endpoint: &str) -> aws_sdk_autoscaling::Client {
    aws_sdk_autoscaling::Client::new(&sdk_config(endpoint))
}

/// The Auto Scaling groups [`seed_node_groups`] makes.
pub mod groups {
    /// Cluster Autoscaler's for the cluster: a launch template of
    /// `m5.large`, min 1, max 4, one instance, with template and option
    /// tags.
    pub const WORKERS: &str = "workers";
    /// Cluster Autoscaler's for the cluster: a launch configuration of
    /// `g4dn.xlarge` (one GPU), min 0, max 2, empty.
    pub const GPUS: &str = "gpus";
    /// Cluster Autoscaler's for another cluster, with one instance.
    pub const OTHER_CLUSTER: &str = "other-cluster";
    /// Nobody's: no discovery tags, one instance.
    pub const UNTAGGED: &str = "untagged";
}

/// The tags of the `workers` group that shape its template and options.
pub const WORKERS_TEMPLATE_TAGS: [(&str, &str); 5] = [
    (
        "k8s.io/cluster-autoscaler/node-template/label/pool",
        "workers",
    ),
    (
        "k8s.io/cluster-autoscaler/node-template/taint/dedicated",
        "workers:NoSchedule",
    ),
    (
        "k8s.io/cluster-autoscaler/node-template/resources/ephemeral-storage",
        "100Gi",
    ),
    (
        "k8s.io/cluster-autoscaler/node-template/autoscaling-options/scaledownutilizationthreshold",
        "0.3",
    ),
    (
        "k8s.io/cluster-autoscaler/node-template/autoscaling-options/scaledownunneededtime",
        "20m",
    ),
];

/// Makes the Auto Scaling groups of [`groups`] in the first subnet of
/// `seeded`, their instances tagged for `cluster` as the cluster's nodes.
pub async fn seed_node_groups(
    endpoint: &str,
    seeded: &Seeded,
    cluster: &str,
) -> anyhow::Result<()> {
    use aws_sdk_autoscaling::types::{LaunchTemplateSpecification, Tag as GroupTag};
    let ec2 = ec2_client(endpoint);
    let asg = autoscaling_client(endpoint);
    ec2.create_launch_template()
        .launch_template_name("workers-template")
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id("ami-12c6146b")
                .instance_type(InstanceType::M5Large)
                .build(),
        )
        .send()
        .await
        .context("create the launch template")?;
    asg.create_launch_configuration()
        .launch_configuration_name("gpus-config")
        .image_id("ami-12c6146b")
        .instance_type("g4dn.xlarge")
        .send()
        .await
        .context("create the launch configuration")?;
    let tag = |key: &str, value: &str, propagate: bool| {
        GroupTag::builder()
            .key(key)
            .value(value)
            .propagate_at_launch(propagate)
            .build()
    };
    let discovery = |owner: &str| {
        vec![
            tag("k8s.io/cluster-autoscaler/enabled", "true", false),
            tag(
                &format!("k8s.io/cluster-autoscaler/{owner}"),
                "owned",
                false,
            ),
        ]
    };
    let own = seeded.tag.of(cluster);
    let node_tag = tag(
        own.key().unwrap_or_default(),
        own.value().unwrap_or_default(),
        true,
    );
    let subnet = &seeded.subnets[0].1;
    let template = LaunchTemplateSpecification::builder()
        .launch_template_name("workers-template")
        .version("$Latest")
        .build();
    let mut workers = discovery(cluster);
    workers.extend(WORKERS_TEMPLATE_TAGS.iter().map(|(k, v)| tag(k, v, false)));
    let plans: [(&str, u32, u32, u32, Vec<GroupTag>); 4] = [
        (groups::WORKERS, 1, 4, 1, workers),
        (groups::GPUS, 0, 2, 0, discovery(cluster)),
        (groups::OTHER_CLUSTER, 0, 2, 1, discovery("other")),
        (groups::UNTAGGED, 0, 2, 1, Vec::new()),
    ];
    for (name, min, max, desired, mut tags) in plans {
        tags.push(node_tag.clone());
        let mut create = asg
            .create_auto_scaling_group()
            .auto_scaling_group_name(name)
            .min_size(min as i32)
            .max_size(max as i32)
            .desired_capacity(desired as i32)
            .vpc_zone_identifier(subnet)
            .set_tags(Some(tags));
        create = if name == groups::GPUS {
            create.launch_configuration_name("gpus-config")
        } else {
            create.launch_template(template.clone())
        };
        create
            .send()
            .await
            .with_context(|| format!("create Auto Scaling group {name}"))?;
    }
    Ok(())
}

/// The Auto Scaling groups [`seed_template_groups`] makes, each at zero,
/// for the cluster: their templates are all Cluster Autoscaler has to go
/// by.
pub mod template_groups {
    /// A launch configuration of `t2.medium` (2 vCPUs, 4 GiB, `i386`
    /// first among its architectures), with two `resources/*` tags:
    /// `ephemeral-storage` `20Gi`, and `hugepages-2Mi` `lots` (no
    /// quantity).
    pub const SMALL: &str = "small";
    /// A mixed-instances policy whose one override chooses types by
    /// attributes (4 to 8 vCPUs, at least 16 GiB) over a launch template
    /// of an `arm64` image and no type.
    pub const BY_ATTRIBUTES: &str = "by-attributes";
    /// The Auto Scaling group of the EKS managed node group
    /// [`EKS_NODEGROUP`] of the cluster (EKS's `eks:cluster-name` and
    /// `eks:nodegroup-name` tags), on the workers' launch template.
    pub const EKS: &str = "eks-managed";
    /// The EKS managed node group: label `team=ml`, taint
    /// `dedicated=ml:NoSchedule`, tag `resources/ephemeral-storage` `50Gi`,
    /// spot capacity.
    pub const EKS_NODEGROUP: &str = "ng-1";
    /// The `arm64` image of [`BY_ATTRIBUTES`]' launch template (one of
    /// moto's).
    pub const ARM_IMAGE: &str = "ami-0e9271c829888680e";
}

/// Makes the groups of [`template_groups`] for `cluster` in the first
/// subnet of `seeded` (after [`seed_node_groups`], whose launch template
/// the EKS group uses), and the EKS cluster and node group (through
/// boto3: there is no EKS client in Rust here).
pub async fn seed_template_groups(
    endpoint: &str,
    seeded: &Seeded,
    cluster: &str,
) -> anyhow::Result<()> {
    use aws_sdk_autoscaling::types::{
        InstanceRequirements, LaunchTemplate, LaunchTemplateOverrides, LaunchTemplateSpecification,
        MemoryMiBRequest, MixedInstancesPolicy, Tag as GroupTag, VCpuCountRequest,
    };
    let ec2 = ec2_client(endpoint);
    let asg = autoscaling_client(endpoint);
    let subnet = &seeded.subnets[0].1;
    let python = std::env::var("MOTO_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import boto3, sys\n\
        eks = boto3.client('eks', endpoint_url=sys.argv[1], region_name=sys.argv[2],\n\
            aws_access_key_id='a', aws_secret_access_key='b')\n\
        eks.create_cluster(name=sys.argv[3], roleArn='arn:aws:iam::123456789012:role/eks',\n\
            resourcesVpcConfig={'subnetIds': [sys.argv[5]]})\n\
        eks.create_nodegroup(clusterName=sys.argv[3], nodegroupName=sys.argv[4],\n\
            nodeRole='arn:aws:iam::123456789012:role/node', subnets=[sys.argv[5]],\n\
            labels={'team': 'ml'}, capacityType='SPOT',\n\
            taints=[{'key': 'dedicated', 'value': 'ml', 'effect': 'NO_SCHEDULE'}],\n\
            tags={'k8s.io/cluster-autoscaler/node-template/resources/ephemeral-storage': '50Gi'})\n";
    let out = Command::new(&python)
        .args(["-c", script, endpoint, REGION, cluster])
        .args([template_groups::EKS_NODEGROUP, subnet.as_str()])
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "create the EKS node group: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ec2.create_launch_template()
        .launch_template_name("attributes-template")
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id(template_groups::ARM_IMAGE)
                .build(),
        )
        .send()
        .await
        .context("create the attributes' launch template")?;
    asg.create_launch_configuration()
        .launch_configuration_name("small-config")
        .image_id("ami-12c6146b")
        .instance_type("t2.medium")
        .send()
        .await
        .context("create the small launch configuration")?;
    let tag = |key: &str, value: &str| {
        GroupTag::builder()
            .key(key)
            .value(value)
            .propagate_at_launch(false)
            .build()
    };
    let discovery = || {
        vec![
            tag("k8s.io/cluster-autoscaler/enabled", "true"),
            tag(&format!("k8s.io/cluster-autoscaler/{cluster}"), "owned"),
        ]
    };
    let resource = |name: &str, value: &str| {
        tag(
            &format!("k8s.io/cluster-autoscaler/node-template/resources/{name}"),
            value,
        )
    };
    let create = |name: &str, tags: Vec<GroupTag>| {
        asg.create_auto_scaling_group()
            .auto_scaling_group_name(name)
            .min_size(0)
            .max_size(2)
            .desired_capacity(0)
            .vpc_zone_identifier(subnet)
            .set_tags(Some(tags))
    };
    let mut small = discovery();
    small.extend([
        resource("ephemeral-storage", "20Gi"),
        resource("hugepages-2Mi", "lots"),
    ]);
    create(template_groups::SMALL, small)
        .launch_configuration_name("small-config")
        .send()
        .await
        .context("create the small group")?;
    let requirements = InstanceRequirements::builder()
        .v_cpu_count(VCpuCountRequest::builder().min(4).max(8).build())
        .memory_mib(MemoryMiBRequest::builder().min(16384).build())
        .build();
    let spec = |name: &str| {
        LaunchTemplateSpecification::builder()
            .launch_template_name(name)
            .version("$Latest")
            .build()
    };
    create(template_groups::BY_ATTRIBUTES, discovery())
        .mixed_instances_policy(
            MixedInstancesPolicy::builder()
                .launch_template(
                    LaunchTemplate::builder()
                        .launch_template_specification(spec("attributes-template"))
                        .overrides(
                            LaunchTemplateOverrides::builder()
                                .instance_requirements(requirements)
                                .build(),
                        )
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .context("create the group by attributes")?;
    let mut eks = discovery();
    eks.extend([
        tag("eks:cluster-name", cluster),
        tag("eks:nodegroup-name", template_groups::EKS_NODEGROUP),
    ]);
    create(template_groups::EKS, eks)
        .launch_template(spec("workers-template"))
        .send()
        .await
        .context("create the EKS node group's Auto Scaling group")?;
    Ok(())
}

/// Requests an ACM certificate for `domain` from moto (through boto3, which
/// moto brings) and returns its ARN: there is no ACM client in Rust here.
pub async fn request_certificate(endpoint: &str, domain: &str) -> anyhow::Result<String> {
    let python = std::env::var("MOTO_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import boto3, sys\n\
        acm = boto3.client('acm', endpoint_url=sys.argv[1], region_name=sys.argv[2],\n\
            aws_access_key_id='a', aws_secret_access_key='b')\n\
        print(acm.request_certificate(DomainName=sys.argv[3])['CertificateArn'])\n";
    let out = Command::new(&python)
        .args(["-c", script, endpoint, REGION, domain])
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "request a certificate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// One seeded instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeededInstance {
    pub id: String,
    /// Its private DNS name: the name its kubelet registers the Node with.
    pub name: String,
    pub zone: String,
    pub private_ip: String,
}

impl SeededInstance {
    /// Its provider ID as the gateway writes it.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.zone, self.id)
    }
}

/// What [`seed`] made for one cluster.
#[derive(Clone, Debug)]
pub struct Seeded {
    pub vpc: String,
    /// `(zone, subnet ID)`.
    pub subnets: Vec<(String, String)>,
    pub route_table: String,
    /// The nodes' security group, tagged for the cluster.
    pub node_group: String,
    pub instances: Vec<SeededInstance>,
    /// How the cluster's resources are tagged.
    pub tag: ClusterTag,
}

fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

fn filter(name: &str, values: &[&str]) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.iter().map(|v| v.to_string()).collect()))
        .build()
}

/// The cluster tag's key.
pub fn cluster_tag(cluster: &str) -> String {
    format!("kubernetes.io/cluster/{cluster}")
}

/// How seeded resources say they are the cluster's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClusterTag {
    /// `kubernetes.io/cluster/<cluster>=owned`.
    #[default]
    Current,
    /// `KubernetesCluster=<cluster>` only, as before Kubernetes 1.6.
    Legacy,
}

impl ClusterTag {
    fn of(self, cluster: &str) -> Tag {
        match self {
            ClusterTag::Current => tag(&cluster_tag(cluster), "owned"),
            ClusterTag::Legacy => tag("KubernetesCluster", cluster),
        }
    }
}

/// Makes a VPC (10.0.0.0/16 plus an IPv6 block) with one subnet per zone
/// tagged for `cluster` and for public load balancers, an internet gateway
/// that makes them public, a route table tagged
/// `owned` by `cluster`, and `instances` running instances spread over the
/// zones, tagged for the cluster, with IPv6 addresses.
pub async fn seed(
    ec2: &aws_sdk_ec2::Client,
    cluster: &str,
    instances: usize,
) -> anyhow::Result<Seeded> {
    seed_tagged(ec2, cluster, instances, ClusterTag::Current).await
}

/// [`seed`], with the cluster's resources tagged the way `by` says.
pub async fn seed_tagged(
    ec2: &aws_sdk_ec2::Client,
    cluster: &str,
    instances: usize,
    by: ClusterTag,
) -> anyhow::Result<Seeded> {
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await?
        .vpc
        .context("no VPC")?;
    let vpc_id = vpc.vpc_id().context("no VPC ID")?.to_owned();
    let v6_block = vpc
        .ipv6_cidr_block_association_set()
        .first()
        .and_then(|a| a.ipv6_cidr_block())
        .and_then(|b| b.parse::<ipnet::Ipv6Net>().ok());
    let mut subnets = Vec::new();
    for (i, zone) in ZONES.iter().enumerate() {
        let v6 = v6_block.and_then(|b| b.subnets(64).ok()?.nth(i));
        let subnet = ec2
            .create_subnet()
            .vpc_id(&vpc_id)
            .cidr_block(format!("10.0.{}.0/24", i + 1))
            .set_ipv6_cidr_block(v6.map(|n| n.to_string()))
            .availability_zone(*zone)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Subnet)
                    .tags(by.of(cluster))
                    .tags(tag("kubernetes.io/role/elb", "1"))
                    .build(),
            )
            .send()
            .await?
            .subnet
            .context("no subnet")?;
        subnets.push((
            zone.to_string(),
            subnet.subnet_id().context("no subnet ID")?.to_owned(),
        ));
    }
    internet_gateway(ec2, &vpc_id).await?;
    let route_table = tagged_route_table(ec2, &vpc_id, Some(by.of(cluster))).await?;
    let node_group = ec2
        .create_security_group()
        .group_name(format!("{cluster}-nodes"))
        .description("the cluster's nodes")
        .vpc_id(&vpc_id)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .tags(by.of(cluster))
                .build(),
        )
        .send()
        .await?
        .group_id
        .context("no group ID")?;
    let mut seeded = Seeded {
        vpc: vpc_id,
        subnets,
        route_table,
        node_group,
        instances: Vec::new(),
        tag: by,
    };
    for i in 0..instances {
        seeded
            .instances
            .push(run_instance(ec2, &seeded, cluster, i).await?);
    }
    Ok(seeded)
}

/// Attaches an internet gateway to `vpc` and routes the main route table's
/// default route to it, so the VPC's subnets are public, as AWS's default
/// VPC's are.
pub async fn internet_gateway(ec2: &aws_sdk_ec2::Client, vpc: &str) -> anyhow::Result<String> {
    let igw = ec2
        .create_internet_gateway()
        .send()
        .await?
        .internet_gateway
        .and_then(|g| g.internet_gateway_id)
        .context("no internet gateway")?;
    ec2.attach_internet_gateway()
        .internet_gateway_id(&igw)
        .vpc_id(vpc)
        .send()
        .await?;
    let main = ec2
        .describe_route_tables()
        .filters(filter("vpc-id", &[vpc]))
        .filters(filter("association.main", &["true"]))
        .send()
        .await?
        .route_tables
        .unwrap_or_default()
        .into_iter()
        .find_map(|t| t.route_table_id)
        .context("no main route table")?;
    ec2.create_route()
        .route_table_id(main)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await?;
    Ok(igw)
}

/// Makes a route table in `vpc`, tagged `owned` by `cluster` when given.
pub async fn route_table(
    ec2: &aws_sdk_ec2::Client,
    vpc: &str,
    cluster: Option<&str>,
) -> anyhow::Result<String> {
    tagged_route_table(ec2, vpc, cluster.map(|c| ClusterTag::Current.of(c))).await
}

/// Makes a route table in `vpc`, with the tag `cluster` when given.
async fn tagged_route_table(
    ec2: &aws_sdk_ec2::Client,
    vpc: &str,
    cluster: Option<Tag>,
) -> anyhow::Result<String> {
    let mut request = ec2.create_route_table().vpc_id(vpc);
    if let Some(cluster) = cluster {
        request = request.tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::RouteTable)
                .tags(cluster)
                .build(),
        );
    }
    let table = request
        .send()
        .await?
        .route_table
        .context("no route table")?;
    Ok(table
        .route_table_id()
        .context("no route table ID")?
        .to_owned())
}

/// The tags of instance `id`, as `key=value`, sorted.
pub async fn instance_tags(ec2: &aws_sdk_ec2::Client, id: &str) -> anyhow::Result<Vec<String>> {
    let answer = ec2.describe_instances().instance_ids(id).send().await?;
    let instance = answer
        .reservations()
        .first()
        .and_then(|r| r.instances().first())
        .context("no such instance")?;
    let mut tags: Vec<String> = instance
        .tags()
        .iter()
        .map(|t| {
            format!(
                "{}={}",
                t.key().unwrap_or_default(),
                t.value().unwrap_or_default()
            )
        })
        .collect();
    tags.sort();
    Ok(tags)
}

/// Launches one more instance of `cluster`, in the zone `index` picks.
pub async fn run_instance(
    ec2: &aws_sdk_ec2::Client,
    seeded: &Seeded,
    cluster: &str,
    index: usize,
) -> anyhow::Result<SeededInstance> {
    let (zone, subnet) = &seeded.subnets[index % seeded.subnets.len()];
    let answer = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(subnet)
        .security_group_ids(&seeded.node_group)
        .ipv6_address_count(1)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(seeded.tag.of(cluster))
                .build(),
        )
        .send()
        .await?;
    let instance = answer.instances().first().context("no instance")?;
    Ok(SeededInstance {
        id: instance.instance_id().context("no ID")?.to_owned(),
        name: instance
            .private_dns_name()
            .context("no private DNS name")?
            .to_owned(),
        zone: zone.clone(),
        private_ip: instance.private_ip_address().unwrap_or_default().to_owned(),
    })
}

/// Instance states by private DNS name, terminated ones included.
pub async fn instance_states(
    ec2: &aws_sdk_ec2::Client,
    vpc: &str,
) -> anyhow::Result<BTreeMap<String, InstanceStateName>> {
    let answer = ec2
        .describe_instances()
        .filters(filter("vpc-id", &[vpc]))
        .send()
        .await?;
    let mut out = BTreeMap::new();
    for instance in answer.reservations().iter().flat_map(|r| r.instances()) {
        if let (Some(name), Some(state)) = (
            instance.private_dns_name(),
            instance.state().and_then(|s| s.name()),
        ) {
            // A live instance wins over a terminated one with its address.
            if state != &InstanceStateName::Terminated || !out.contains_key(name) {
                out.insert(name.to_owned(), state.clone());
            }
        }
    }
    Ok(out)
}

/// The routes of a route table: `(destination, instance ID)`.
pub async fn routes(
    ec2: &aws_sdk_ec2::Client,
    table: &str,
) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let answer = ec2
        .describe_route_tables()
        .route_table_ids(table)
        .send()
        .await?;
    Ok(answer
        .route_tables()
        .iter()
        .flat_map(|t| t.routes())
        .filter(|r| r.gateway_id() != Some("local"))
        .map(|r| {
            (
                r.destination_cidr_block()
                    .or(r.destination_ipv6_cidr_block())
                    .unwrap_or_default()
                    .to_owned(),
                r.instance_id().map(str::to_owned),
            )
        })
        .collect())
}

/// Whether the instance's source/destination check is on.
pub async fn source_dest_check(ec2: &aws_sdk_ec2::Client, id: &str) -> anyhow::Result<bool> {
    let answer = ec2.describe_instances().instance_ids(id).send().await?;
    Ok(answer
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .next()
        .and_then(|i| i.source_dest_check())
        .unwrap_or(true))
}

/// Turns an instance's source/destination check back on.
pub async fn enable_source_dest_check(ec2: &aws_sdk_ec2::Client, id: &str) -> anyhow::Result<()> {
    ec2.modify_instance_attribute()
        .instance_id(id)
        .source_dest_check(AttributeBooleanValue::builder().value(true).build())
        .send()
        .await?;
    Ok(())
}

/// A failure the proxy answers with instead of forwarding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 503 `RequestLimitExceeded`, EC2's throttling answer.
    Throttle,
    /// 403 `UnauthorizedOperation`: the credentials may not do this.
    Unauthorized,
    /// 401 `AuthFailure`: the credentials are not valid.
    AuthFailure,
    /// 500 `InternalError`.
    ServerError,
    /// 400 `DependencyViolation`: e.g. a security group still in use,
    /// which moto never answers.
    DependencyViolation,
    /// 400 `TooManyTargets`, the load balancer APIs' answer to targets past
    /// the account's quota (moto has no quotas).
    TooManyTargets,
}

impl Fault {
    fn response(self) -> Response {
        let (status, code) = match self {
            Fault::Throttle => (StatusCode::SERVICE_UNAVAILABLE, "RequestLimitExceeded"),
            Fault::Unauthorized => (StatusCode::FORBIDDEN, "UnauthorizedOperation"),
            Fault::AuthFailure => (StatusCode::UNAUTHORIZED, "AuthFailure"),
            Fault::ServerError => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
            Fault::DependencyViolation => (StatusCode::BAD_REQUEST, "DependencyViolation"),
            Fault::TooManyTargets => {
                // The load balancer APIs' own error form.
                let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ErrorResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/\"><Error><Type>Sender</Type><Code>TooManyTargets</Code><Message>You've reached the limit on the number of targets (injected by the test proxy)</Message></Error><RequestId>test-proxy</RequestId></ErrorResponse>";
                return (
                    StatusCode::BAD_REQUEST,
                    [("content-type", "text/xml")],
                    body,
                )
                    .into_response();
            }
        };
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error></Errors><RequestID>test-proxy</RequestID></Response>"
        );
        (status, [("content-type", "text/xml")], body).into_response()
    }
}

#[derive(Default)]
struct ProxyState {
    /// `(action or None for any, fault, remaining answers)`.
    faults: Vec<(Option<String>, Fault, usize)>,
    /// `(fault, fraction of requests)` answered at random.
    rates: Vec<(Fault, f64)>,
    /// Every action asked for, in order (the first [`MAX_RECORDED`]).
    actions: Vec<String>,
    /// The bodies of the last [`MAX_BODIES`] requests, with their actions.
    bodies: std::collections::VecDeque<(String, String)>,
    /// Network nodes by instance ID, for `DescribeInstanceTopology`, which
    /// moto does not implement: the proxy answers it as AWS does.
    topologies: BTreeMap<String, Vec<String>>,
    /// Auto Scaling groups whose zones have no capacity: each one's
    /// desired capacity as last set (none yet), and when.
    no_capacity: BTreeMap<String, Option<(String, String)>>,
    /// The account's load balancer limits a test set, by quota name, over
    /// AWS's published defaults ([`FaultProxy::set_account_limit`]).
    account_limits: BTreeMap<String, u32>,
    /// The instance types `GetInstanceTypesFromInstanceRequirements`
    /// names, which moto does not implement
    /// ([`FaultProxy::set_types_for_requirements`]).
    requirement_types: Vec<String>,
    /// Instances the Auto Scaling API shows as terminating
    /// ([`FaultProxy::show_terminating`]).
    terminating: BTreeSet<String>,
}

/// AWS's published defaults of the load balancer quotas the gateway reads,
/// by API version: moto answers ELBv2's with numbers of its own and lacks
/// the Classic ELB API's, so the proxy answers both as AWS would.
const ACCOUNT_LIMITS: &[(&str, &str, u32)] = &[
    ("2015-12-01", "network-load-balancers", 50),
    ("2015-12-01", "targets-per-network-load-balancer", 3000),
    (
        "2015-12-01",
        "targets-per-availability-zone-per-network-load-balancer",
        500,
    ),
    ("2015-12-01", "targets-per-target-group", 1000),
    ("2015-12-01", "target-groups", 3000),
    ("2012-06-01", "classic-load-balancers", 20),
    ("2012-06-01", "classic-listeners", 100),
    ("2012-06-01", "classic-registered-instances", 1000),
];

/// `DescribeAccountLimits`' answer for the load balancer API `version`.
fn account_limits_answer(version: &str, set: &BTreeMap<String, u32>) -> Response {
    let members: String = ACCOUNT_LIMITS
        .iter()
        .filter(|(v, ..)| *v == version)
        .map(|(_, name, max)| {
            let max = set.get(*name).unwrap_or(max);
            format!("<member><Name>{name}</Name><Max>{max}</Max></member>")
        })
        .collect();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeAccountLimitsResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/{version}/\"><DescribeAccountLimitsResult><Limits>{members}</Limits></DescribeAccountLimitsResult><ResponseMetadata><RequestId>test-proxy</RequestId></ResponseMetadata></DescribeAccountLimitsResponse>"
    );
    (StatusCode::OK, [("content-type", "text/xml")], body).into_response()
}

/// The value of the form parameter `name` in `body`.
fn param<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    body.split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// An answer of the Auto Scaling API: `action`'s response with `result`.
fn autoscaling_answer(action: &str, result: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<{action}Response xmlns=\"http://autoscaling.amazonaws.com/doc/2011-01-01/\">{result}<ResponseMetadata><RequestId>test-proxy</RequestId></ResponseMetadata></{action}Response>"
    );
    (StatusCode::OK, [("content-type", "text/xml")], body).into_response()
}

/// `DescribeAutoScalingGroups`' answer `body` with each held group's
/// desired capacity as it was set.
fn with_held_capacity(body: &str, held: &BTreeMap<String, Option<(String, String)>>) -> String {
    let mut body = body.to_owned();
    for (group, set) in held {
        let Some((desired, _)) = set else { continue };
        let name = format!("<AutoScalingGroupName>{group}</AutoScalingGroupName>");
        let Some(at) = body.find(&name) else { continue };
        let Some(open) = body[at..].find("<DesiredCapacity>").map(|i| at + i + 17) else {
            continue;
        };
        let Some(close) = body[open..].find('<').map(|i| open + i) else {
            continue;
        };
        body.replace_range(open..close, desired);
    }
    body
}

/// `DescribeAutoScalingGroups`' answer `body` with each of `terminating`
/// in the lifecycle state AWS shows while a lifecycle hook holds a
/// terminating instance.
fn with_terminating(body: &str, terminating: &BTreeSet<String>) -> String {
    let mut body = body.to_owned();
    for id in terminating {
        let Some(at) = body.find(&format!("<InstanceId>{id}</InstanceId>")) else {
            continue;
        };
        let Some(open) = body[at..].find("<LifecycleState>").map(|i| at + i + 16) else {
            continue;
        };
        let Some(close) = body[open..].find('<').map(|i| open + i) else {
            continue;
        };
        body.replace_range(open..close, "Terminating:Wait");
    }
    body
}

/// The text of the first `<tag>` element of `xml`.
fn xml_text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find('<')? + start;
    Some(&xml[start..end])
}

/// AWS's answer to `GetInstanceTypesFromInstanceRequirements`: `types`.
fn requirement_types_answer(types: &[String]) -> Response {
    let items: String = types
        .iter()
        .map(|t| format!("<item><instanceType>{t}</instanceType></item>"))
        .collect();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<GetInstanceTypesFromInstanceRequirementsResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>test-proxy</requestId><instanceTypeSet>{items}</instanceTypeSet></GetInstanceTypesFromInstanceRequirementsResponse>"
    );
    (StatusCode::OK, [("content-type", "text/xml")], body).into_response()
}

/// AWS's refusal to terminate an instance with the desired capacity
/// lowered when that is at the group's minimum (moto lowers it anyway).
fn below_minimum_answer(min: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ErrorResponse xmlns=\"http://autoscaling.amazonaws.com/doc/2011-01-01/\"><Error><Type>Sender</Type><Code>ValidationError</Code><Message>Currently, desiredSize equals minSize ({min}). Terminating instance without replacement will violate group's min size constraint. Either set shouldDecrementDesiredCapacity flag to false or lower group's min size.</Message></Error><RequestId>test-proxy</RequestId></ErrorResponse>"
    );
    (
        StatusCode::BAD_REQUEST,
        [("content-type", "text/xml")],
        body,
    )
        .into_response()
}

/// AWS's answer to `DescribeScalingActivities` for a group whose zones
/// have no capacity: its latest activity, a launch that failed.
fn failed_launch(group: &str, at: &str) -> Response {
    let result = format!(
        "<DescribeScalingActivitiesResult><Activities><member><ActivityId>test-proxy-{group}</ActivityId><AutoScalingGroupName>{group}</AutoScalingGroupName><Description>Launching a new EC2 instance.  Status Reason: Could not launch On-Demand Instances.</Description><Cause>At {at} an instance was started in response to a difference between desired and actual capacity.</Cause><StartTime>{at}</StartTime><StatusCode>Failed</StatusCode><StatusMessage>Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have sufficient m5.large capacity in the Availability Zone you requested.</StatusMessage><Progress>100</Progress></member></Activities></DescribeScalingActivitiesResult>"
    );
    autoscaling_answer("DescribeScalingActivities", &result)
}

/// AWS's answer to `DescribeInstanceTopology` for the `InstanceId.N`
/// parameters of `body`: those instances with a topology in `known`.
fn topology_answer(body: &str, known: &BTreeMap<String, Vec<String>>) -> Response {
    let mut items = String::new();
    for (key, value) in body.split('&').filter_map(|kv| kv.split_once('=')) {
        let Some(nodes) = key
            .starts_with("InstanceId.")
            .then(|| known.get(value))
            .flatten()
        else {
            continue;
        };
        let nodes: String = nodes.iter().map(|n| format!("<item>{n}</item>")).collect();
        items.push_str(&format!(
            "<item><instanceId>{value}</instanceId><networkNodeSet>{nodes}</networkNodeSet></item>"
        ));
    }
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstanceTopologyResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>test-proxy</requestId><instanceSet>{items}</instanceSet></DescribeInstanceTopologyResponse>"
    );
    (StatusCode::OK, [("content-type", "text/xml")], body).into_response()
}

/// How many request bodies the proxy keeps.
const MAX_BODIES: usize = 1000;

/// The most actions the proxy remembers between two `take_actions`, so a
/// long-running sandbox stays bounded.
const MAX_RECORDED: usize = 100_000;

/// An HTTP proxy in front of moto that can answer with AWS errors, and
/// answers the actions the gateway sends that moto lacks or answers
/// otherwise than AWS (`DescribeInstanceTopology`, both load balancer
/// APIs' `DescribeAccountLimits`, `GetInstanceTypesFromInstanceRequirements`,
/// a `TerminateInstanceInAutoScalingGroup` that would take a group below
/// its minimum) as AWS would, and the Auto Scaling groups a test runs out
/// of capacity ([`FaultProxy::no_capacity_for`]) or holds instances of on
/// their way out ([`FaultProxy::show_terminating`]).
#[derive(Clone)]
pub struct FaultProxy {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    state: Arc<Mutex<ProxyState>>,
}

struct Forward {
    upstream: String,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Body,
    >,
    state: Arc<Mutex<ProxyState>>,
}

/// The action of a REST request of `service` (EKS's), from its method
/// and path, as IAM names it.
fn rest_action(service: &str, method: &http::Method, path: &str) -> Option<&'static str> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (service, method.as_str(), parts.as_slice()) {
        ("eks", "GET", ["clusters", _, "node-groups", _]) => Some("DescribeNodegroup"),
        ("eks", "GET", ["clusters", _]) => Some("DescribeCluster"),
        _ => None,
    }
}

/// The action of a request: a query's (`Action=DescribeInstances&...`)
/// or a REST API's (EKS's), bare for EC2 and as `<service>:<Action>`
/// (IAM's form) for other services, whose name is in the signature's
/// credential scope.
fn action(parts: &http::request::Parts, body: &[u8]) -> String {
    let service = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split("Credential=").nth(1))
        .and_then(|c| c.split('/').nth(3))
        .unwrap_or("ec2");
    let name = String::from_utf8_lossy(body)
        .split('&')
        .find_map(|kv| kv.strip_prefix("Action="))
        .map(str::to_owned)
        .or_else(|| rest_action(service, &parts.method, parts.uri.path()).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    if service == "ec2" {
        name
    } else {
        format!("{service}:{name}")
    }
}

/// Asks moto the Auto Scaling query `body`, signed as `headers` sign the
/// request being answered (moto reads the service from the signature and
/// checks no more): its answer's text.
async fn ask_upstream(f: &Forward, headers: &http::HeaderMap, body: String) -> Option<String> {
    let mut request = http::Request::post(format!("{}/", f.upstream))
        .body(Body::from(body))
        .ok()?;
    for name in [http::header::AUTHORIZATION, http::header::CONTENT_TYPE] {
        if let Some(value) = headers.get(&name) {
            request.headers_mut().insert(name, value.clone());
        }
    }
    let answer = f.client.request(request).await.ok()?;
    let bytes = axum::body::to_bytes(Body::new(answer.into_body()), 64 << 20)
        .await
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// AWS's refusal of `TerminateInstanceInAutoScalingGroup` with the desired
/// capacity lowered for `instance`, when its group is at its minimum: the
/// group and its sizes asked of moto, the desired capacity the proxy
/// holds for a group out of capacity winning.
async fn refuse_below_minimum(
    f: &Forward,
    headers: &http::HeaderMap,
    instance: &str,
) -> Option<Response> {
    let found = ask_upstream(
        f,
        headers,
        format!(
            "Action=DescribeAutoScalingInstances&Version=2011-01-01&InstanceIds.member.1={instance}"
        ),
    )
    .await?;
    let group = xml_text(&found, "AutoScalingGroupName")?.to_owned();
    let described = ask_upstream(
        f,
        headers,
        format!(
            "Action=DescribeAutoScalingGroups&Version=2011-01-01&AutoScalingGroupNames.member.1={group}"
        ),
    )
    .await?;
    let min: u32 = xml_text(&described, "MinSize")?.parse().ok()?;
    let held = {
        let state = f.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .no_capacity
            .get(&group)
            .cloned()
            .flatten()
            .map(|(desired, _)| desired)
    };
    let desired: u32 = match held {
        Some(desired) => desired.parse().ok()?,
        None => xml_text(&described, "DesiredCapacity")?.parse().ok()?,
    };
    (desired <= min).then(|| below_minimum_answer(&min.to_string()))
}

async fn forward(State(f): State<Arc<Forward>>, request: http::Request<Body>) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 << 20).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let action = action(&parts, &bytes);
    let fault = {
        let mut state = f.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.actions.len() < MAX_RECORDED {
            state.actions.push(action.clone());
        }
        if state.bodies.len() == MAX_BODIES {
            state.bodies.pop_front();
        }
        let body = String::from_utf8_lossy(&bytes).into_owned();
        state.bodies.push_back((action.clone(), body));
        let hit = state
            .faults
            .iter_mut()
            .find(|(a, _, left)| *left > 0 && a.as_deref().is_none_or(|a| a == action));
        hit.map(|(_, fault, left)| {
            *left -= 1;
            *fault
        })
        .or_else(|| {
            state
                .rates
                .iter()
                .find(|(_, rate)| fastrand::f64() < *rate)
                .map(|(fault, _)| *fault)
        })
    };
    if let Some(fault) = fault {
        return fault.response();
    }
    if action == "DescribeInstanceTopology" {
        let state = f.state.lock().unwrap_or_else(|e| e.into_inner());
        return topology_answer(&String::from_utf8_lossy(&bytes), &state.topologies);
    }
    if action == "elasticloadbalancing:DescribeAccountLimits" {
        let state = f.state.lock().unwrap_or_else(|e| e.into_inner());
        let text = String::from_utf8_lossy(&bytes);
        let version = param(&text, "Version").unwrap_or("2015-12-01");
        return account_limits_answer(version, &state.account_limits);
    }
    if action == "GetInstanceTypesFromInstanceRequirements" {
        let state = f.state.lock().unwrap_or_else(|e| e.into_inner());
        return requirement_types_answer(&state.requirement_types);
    }
    if action == "autoscaling:TerminateInstanceInAutoScalingGroup" {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if param(&text, "ShouldDecrementDesiredCapacity") == Some("true")
            && let Some(instance) = param(&text, "InstanceId")
            && let Some(refused) = refuse_below_minimum(&f, &parts.headers, instance).await
        {
            return refused;
        }
    }
    let held = {
        let mut state = f.state.lock().unwrap_or_else(|e| e.into_inner());
        let text = String::from_utf8_lossy(&bytes);
        let group = param(&text, "AutoScalingGroupName").unwrap_or_default();
        match (action.as_str(), state.no_capacity.get_mut(group)) {
            ("autoscaling:SetDesiredCapacity", Some(set)) => {
                let desired = param(&text, "DesiredCapacity").unwrap_or("0").to_owned();
                let at = now_rfc3339();
                *set = Some((desired, at));
                return autoscaling_answer("SetDesiredCapacity", "");
            }
            ("autoscaling:DescribeScalingActivities", Some(Some((_, at)))) => {
                return failed_launch(group, at);
            }
            _ => (action == "autoscaling:DescribeAutoScalingGroups"
                && !(state.no_capacity.is_empty() && state.terminating.is_empty()))
            .then(|| (state.no_capacity.clone(), state.terminating.clone())),
        }
    };
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let Ok(uri) = format!("{}{path}", f.upstream).parse() else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    parts.uri = uri;
    match f
        .client
        .request(http::Request::from_parts(parts, Body::from(bytes)))
        .await
    {
        Ok(answer) => {
            let (mut parts, body) = answer.into_parts();
            let Some((held, terminating)) = held else {
                return Response::from_parts(parts, Body::new(body));
            };
            let Ok(bytes) = axum::body::to_bytes(Body::new(body), 64 << 20).await else {
                return StatusCode::BAD_GATEWAY.into_response();
            };
            let body = with_held_capacity(&String::from_utf8_lossy(&bytes), &held);
            let body = with_terminating(&body, &terminating);
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(body))
        }
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free loopback port.
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let forward_state = Arc::new(Forward {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: hyper_util::client::legacy::Client::builder(
                hyper_util::rt::TokioExecutor::new(),
            )
            .build_http(),
            state: state.clone(),
        });
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(forward_state);
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { endpoint, state })
    }

    /// Answers the next `times` requests for `action` (any when `None`)
    /// with `fault`.
    pub fn fail(&self, action: Option<&str>, fault: Fault, times: usize) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .faults
            .push((action.map(str::to_owned), fault, times));
    }

    /// Answers a `rate` fraction (0 to 1) of all requests with `fault`,
    /// at random, until [`FaultProxy::heal`].
    pub fn fail_at_rate(&self, fault: Fault, rate: f64) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rates
            .push((fault, rate));
    }

    /// Gives instance `id` the network nodes `nodes` (nearest the spine
    /// first) in `DescribeInstanceTopology`'s answers.
    pub fn set_topology(&self, id: &str, nodes: &[&str]) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .topologies
            .insert(id.to_owned(), nodes.iter().map(|n| n.to_string()).collect());
    }

    /// Makes Auto Scaling group `group`'s zones run out of capacity, as
    /// AWS does: a new desired capacity is accepted (and held here, never
    /// reaching moto), no instance is launched, and the group's latest
    /// scaling activity is a launch that failed for capacity.
    pub fn no_capacity_for(&self, group: &str) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .no_capacity
            .insert(group.to_owned(), None);
    }

    /// Makes the account's load balancer quota `name` (as
    /// `DescribeAccountLimits` names it, e.g.
    /// `targets-per-availability-zone-per-network-load-balancer`) `max`.
    pub fn set_account_limit(&self, name: &str, max: u32) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .account_limits
            .insert(name.to_owned(), max);
    }

    /// Makes `GetInstanceTypesFromInstanceRequirements` name `types`, in
    /// that order, whatever the requirements (none until set).
    pub fn set_types_for_requirements(&self, types: &[&str]) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .requirement_types = types.iter().map(|t| t.to_string()).collect();
    }

    /// Shows instance `id` as AWS shows one a lifecycle hook holds on its
    /// way out (`Terminating:Wait`) in `DescribeAutoScalingGroups`'
    /// answers.
    pub fn show_terminating(&self, id: &str) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .terminating
            .insert(id.to_owned());
    }

    /// Clears every fault.
    pub fn heal(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.faults.clear();
        state.rates.clear();
    }

    /// The (form-encoded) bodies of the recent requests for `action`.
    pub fn bodies(&self, action: &str) -> Vec<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bodies
            .iter()
            .filter(|(a, _)| a == action)
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// How often each action was asked for since the last call.
    pub fn take_actions(&self) -> BTreeMap<String, usize> {
        let actions =
            std::mem::take(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()).actions);
        let mut out = BTreeMap::new();
        for action in actions {
            *out.entry(action).or_default() += 1;
        }
        out
    }
}

/// A Service's load balancer as cloud-provider-aws named it.
pub struct UpstreamService<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// `a` and the Service's UID without dashes, cut to 32 characters.
    pub lb_name: &'a str,
    pub node_port: i32,
}

/// A rule from `cidr` with the description `d` (none when empty), as
/// cloud-provider-aws writes the nodes' rules for an NLB.
pub fn described_rule(
    proto: &str,
    from: i32,
    to: i32,
    cidr: &str,
    d: &str,
) -> aws_sdk_ec2::types::IpPermission {
    aws_sdk_ec2::types::IpPermission::builder()
        .ip_protocol(proto)
        .from_port(from)
        .to_port(to)
        .ip_ranges(
            aws_sdk_ec2::types::IpRange::builder()
                .cidr_ip(cidr)
                .set_description((!d.is_empty()).then(|| d.to_owned()))
                .build(),
        )
        .build()
}

/// What cloud-provider-aws leaves for the NLB of `svc` (port 80 on its
/// node port) in `cluster`, made with the SDK as it makes them: a target
/// group named its way (`k8s-<ns>-<name>-<hash>`, health check TCP every
/// 30 s, 3/3) with the first instance registered, the NLB in the seeded
/// subnets with the security groups `groups` (none: upstream's default),
/// its listener, and the nodes' CIDR rules for its clients (everyone)
/// described as upstream describes them. Returns the NLB and the target
/// group's name.
pub async fn upstream_nlb(
    ec2: &aws_sdk_ec2::Client,
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    seeded: &Seeded,
    cluster: &str,
    svc: &UpstreamService<'_>,
    groups: &[String],
) -> anyhow::Result<(aws_sdk_elasticloadbalancingv2::types::LoadBalancer, String)> {
    use aws_sdk_elasticloadbalancingv2::types as elbv2;
    let node_port = svc.node_port;
    let eight = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect()
    };
    let tag = |k: &str, v: &str| elbv2::Tag::builder().key(k).value(v).build();
    let tags = vec![
        tag(
            "kubernetes.io/service-name",
            &format!("{}/{}", svc.namespace, svc.name),
        ),
        tag(&format!("kubernetes.io/cluster/{cluster}"), "owned"),
    ];
    let tg_name = format!(
        "k8s-{}-{}-0123abcdef",
        eight(svc.namespace),
        eight(svc.name)
    );
    let tg = elb
        .create_target_group()
        .name(&tg_name)
        .protocol(elbv2::ProtocolEnum::Tcp)
        .port(node_port)
        .vpc_id(&seeded.vpc)
        .target_type(elbv2::TargetTypeEnum::Instance)
        .health_check_protocol(elbv2::ProtocolEnum::Tcp)
        .health_check_port("traffic-port")
        .health_check_interval_seconds(30)
        .healthy_threshold_count(3)
        .unhealthy_threshold_count(3)
        .set_tags(Some(tags.clone()))
        .send()
        .await?;
    let tg_arn = tg
        .target_groups()
        .first()
        .and_then(|g| g.target_group_arn())
        .context("CreateTargetGroup answered no group")?
        .to_owned();
    elb.register_targets()
        .target_group_arn(&tg_arn)
        .targets(
            elbv2::TargetDescription::builder()
                .id(&seeded.instances[0].id)
                .port(node_port)
                .build(),
        )
        .send()
        .await?;
    let subnets: Vec<String> = seeded.subnets.iter().map(|(_, s)| s.clone()).collect();
    let made = elb
        .create_load_balancer()
        .name(svc.lb_name)
        .r#type(elbv2::LoadBalancerTypeEnum::Network)
        .scheme(elbv2::LoadBalancerSchemeEnum::InternetFacing)
        .set_subnets(Some(subnets))
        .set_security_groups((!groups.is_empty()).then(|| groups.to_vec()))
        .set_tags(Some(tags.clone()))
        .send()
        .await?
        .load_balancers()
        .first()
        .cloned()
        .context("CreateLoadBalancer answered no load balancer")?;
    elb.create_listener()
        .load_balancer_arn(made.load_balancer_arn().unwrap_or_default())
        .protocol(elbv2::ProtocolEnum::Tcp)
        .port(80)
        .default_actions(
            elbv2::Action::builder()
                .r#type(elbv2::ActionTypeEnum::Forward)
                .target_group_arn(&tg_arn)
                .build(),
        )
        .send()
        .await?;
    let node = &seeded.node_group;
    ec2.authorize_security_group_ingress()
        .group_id(node)
        .ip_permissions(described_rule(
            "tcp",
            node_port,
            node_port,
            "0.0.0.0/0",
            &format!("kubernetes.io/rule/nlb/client={}", svc.lb_name),
        ))
        .send()
        .await?;
    // One MTU rule per CIDR, whichever NLBs it serves: there may be one.
    let _ = ec2
        .authorize_security_group_ingress()
        .group_id(node)
        .ip_permissions(described_rule(
            "icmp",
            3,
            4,
            "0.0.0.0/0",
            "kubernetes.io/rule/nlb/mtu",
        ))
        .send()
        .await;
    Ok((made, tg_name))
}

/// Now, as AWS writes times (`2026-11-27T10:00:00Z`).
fn now_rfc3339() -> String {
    use aws_sdk_ec2::primitives::{DateTime, DateTimeFormat};
    DateTime::from(std::time::SystemTime::now())
        .fmt(DateTimeFormat::DateTime)
        .unwrap_or_default()
}
