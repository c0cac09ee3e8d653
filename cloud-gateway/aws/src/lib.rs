//! `aws`: Amazon Web Services through the official SDK. Instances are EC2
//! instances, or an EKS Fargate pod's network interface (`instances.rs`),
//! with network topology labels (`topology.rs`); routes are VPC routes in the route tables
//! tagged for the cluster (`routes.rs`), load balancers are Classic ELBs
//! or Network Load Balancers (`load_balancers/`) configured by the
//! upstream annotations (`annotations.rs`), and Cluster Autoscaler's node
//! groups are Auto Scaling groups (`node_groups.rs`); volumes are EBS
//! volumes and snapshots, as the upstream EBS CSI controller makes them
//! (`volumes.rs`).
//! Credentials come from the SDK's standard chain only (`client.rs`) and
//! never leave this module. Every AWS error is mapped in `errors.rs`;
//! ownership follows the `kubernetes.io/cluster/<name>` tag (`tags.rs`).
//! Nothing outside this crate names an AWS type.

pub mod annotations;
mod client;
mod errors;
mod instances;
mod load_balancers;
mod modifications;
mod node_groups;
mod routes;
pub mod settings;
mod tags;
mod topology;
mod volumes;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, Instance as Ec2Instance};

use ccm_provider::{
    CloudError, Instances, LoadBalancers, NodeGroups, Provider, Result, Routes, Volumes,
};

pub use crate::load_balancers::preflight::{Action, Verdict};
pub use crate::settings::AwsSettings;

/// The provider's name and provider-ID scheme. Never change it: it is in
/// every Node's `spec.providerID`.
pub const NAME: &str = "aws";

/// How often at most the zone list is read again for a zone not seen yet.
const ZONE_REFRESH: Duration = Duration::from_secs(60);

/// Zone names to zone IDs and zone types (`availability-zone`,
/// `local-zone`, `wavelength-zone`), read with `DescribeAvailabilityZones`.
#[derive(Default)]
struct Zones {
    ids: HashMap<String, String>,
    types: HashMap<String, String>,
    read_at: Option<Instant>,
}

/// Every item of a paginated read: `page` asks for the page after the
/// token it is given and answers its items and the next token (none, or
/// an empty one, after the last page).
async fn every_page<T, E, F, Fut>(mut page: F) -> std::result::Result<Vec<T>, E>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<(Vec<T>, Option<String>), E>>,
{
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let (items, next) = page(token).await?;
        out.extend(items);
        token = next.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// The AWS cloud.
pub struct AwsCloud {
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancingv2::Client,
    classic: aws_sdk_elasticloadbalancing::Client,
    autoscaling: aws_sdk_autoscaling::Client,
    eks: aws_sdk_eks::Client,
    region: String,
    settings: AwsSettings,
    zones: Mutex<Zones>,
    groups: Mutex<node_groups::GroupCache>,
    topologies: topology::Topologies,
    modifications: modifications::Modifications,
}

impl std::fmt::Debug for AwsCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCloud")
            .field("region", &self.region)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl AwsCloud {
    /// Builds the client from `settings` and the SDK's credential chain.
    /// Nothing is asked of EC2 until the first call or [`Provider::check`].
    pub async fn connect(settings: AwsSettings) -> anyhow::Result<Self> {
        let client::Clients {
            ec2,
            elb,
            classic,
            autoscaling,
            eks,
            region,
        } = client::clients(&settings).await?;
        tracing::info!(
            region = %region,
            endpoint = settings.endpoint_url.as_deref().unwrap_or("default"),
            vpc = settings.vpc_id.as_deref().unwrap_or("any"),
            role = settings.role_arn.as_deref().unwrap_or("none"),
            "AWS provider configured; credentials come from the SDK's chain"
        );
        Ok(Self {
            ec2,
            elb,
            classic,
            autoscaling,
            eks,
            region,
            settings,
            zones: Mutex::new(Zones::default()),
            groups: Mutex::new(node_groups::GroupCache::default()),
            topologies: topology::Topologies::default(),
            modifications: modifications::Modifications::default(),
        })
    }

    /// The region in use.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// Every instance matching `filters`, every page.
    async fn describe_instances(&self, filters: Vec<Filter>) -> Result<Vec<Ec2Instance>> {
        let filters = &filters;
        every_page(|token| async move {
            let page = self
                .ec2
                .describe_instances()
                .set_filters(Some(filters.clone()))
                .max_results(1000)
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeInstances", e))?;
            let instances = page
                .reservations()
                .iter()
                .flat_map(|r| r.instances().iter().cloned())
                .collect();
            Ok((instances, page.next_token().map(str::to_owned)))
        })
        .await
    }

    /// Reads the region's zones and their IDs.
    async fn read_zones(&self) -> Result<HashMap<String, String>> {
        let answer = self
            .ec2
            .describe_availability_zones()
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeAvailabilityZones", e))?;
        let ids: HashMap<String, String> = answer
            .availability_zones()
            .iter()
            .filter_map(|z| Some((z.zone_name()?.to_owned(), z.zone_id()?.to_owned())))
            .collect();
        let types = answer
            .availability_zones()
            .iter()
            .filter_map(|z| Some((z.zone_name()?.to_owned(), z.zone_type()?.to_owned())))
            .collect();
        let mut zones = self.zones.lock().unwrap_or_else(|e| e.into_inner());
        zones.ids = ids.clone();
        zones.types = types;
        zones.read_at = Some(Instant::now());
        Ok(ids)
    }

    /// The zone type of each of `wanted` known to the region, read as
    /// [`Self::zone_ids`] reads IDs; a zone missing from the answer is
    /// left out.
    async fn zone_types(&self, wanted: &BTreeSet<&str>) -> Result<HashMap<String, String>> {
        let missing = {
            let zones = self.zones.lock().unwrap_or_else(|e| e.into_inner());
            let stale = zones.read_at.is_none_or(|at| at.elapsed() > ZONE_REFRESH);
            wanted.iter().any(|z| !zones.types.contains_key(*z)) && stale
        };
        if missing {
            self.read_zones().await?;
        }
        let zones = self.zones.lock().unwrap_or_else(|e| e.into_inner());
        Ok(zones.types.clone())
    }

    /// Zone IDs for `wanted` zones; reads the zone list again (at most once
    /// a minute) when one is unknown. A failed read only leaves the zone-ID
    /// label off: it never fails a lookup.
    async fn zone_ids(&self, wanted: &BTreeSet<&str>) -> HashMap<String, String> {
        let (ids, stale) = {
            let zones = self.zones.lock().unwrap_or_else(|e| e.into_inner());
            let missing = wanted.iter().any(|z| !zones.ids.contains_key(*z));
            let stale = zones.read_at.is_none_or(|at| at.elapsed() > ZONE_REFRESH);
            (zones.ids.clone(), missing && stale)
        };
        if !stale {
            return ids;
        }
        match self.read_zones().await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the region's zones; zone ID labels wait");
                ids
            }
        }
    }
}

#[async_trait]
impl Provider for AwsCloud {
    fn name(&self) -> &str {
        NAME
    }

    fn instances(&self) -> Option<&dyn Instances> {
        Some(self)
    }

    fn load_balancers(&self) -> Option<&dyn LoadBalancers> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }

    fn node_groups(&self) -> Option<&dyn NodeGroups> {
        Some(self)
    }

    fn volumes(&self) -> Option<&dyn Volumes> {
        Some(self)
    }

    /// Ready once EC2 answers with these credentials in this region.
    async fn check(&self) -> Result<()> {
        let zones = self.read_zones().await?;
        if zones.is_empty() {
            return Err(CloudError::NotConfigured(format!(
                "region {} has no availability zones",
                self.region
            )));
        }
        Ok(())
    }
}
