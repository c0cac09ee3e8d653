//! The Classic ELB itself (ELB API): found by name and checked by tag,
//! made with its listeners, subnets, groups and tags, then kept to what
//! the Service asks (listeners, subnets, groups, tags, health check,
//! attributes, policies, instances by difference), listed and deleted.
//! Names, tags, policies and defaults are cloud-provider-aws's, so a
//! Classic ELB it made is found and kept as it is (see `classic_config`).

use std::collections::{BTreeSet, HashMap};

use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing,
    HealthCheck as Check, Instance, Listener, LoadBalancerAttributes,
    LoadBalancerDescription as Elb, PolicyAttribute, Tag,
};
use ccm_provider::{CloudError, Ingress, LoadBalancer, LoadBalancerStatus, Result};

use super::classic_config::{
    Attributes, ClassicListener, PROXY_POLICY, PROXY_POLICY_ATTRIBUTE, PROXY_POLICY_TYPE,
    SSL_POLICY_ATTRIBUTE, SSL_POLICY_TYPE, ssl_policy_name,
};
use super::health_check::HealthCheck;
use crate::annotations::{self, LbOptions};
use crate::tags::{self, TAG_SERVICE_NAME, TAG_SERVICE_UID};
use crate::{AwsCloud, errors};

/// How many names one `DescribeTags` takes.
const TAGS_PER_CALL: usize = 20;

fn built<T>(what: Result<T, impl std::fmt::Display>) -> Result<T> {
    what.map_err(|e| CloudError::Internal(format!("building an ELB request: {e}")))
}

/// `pairs` as ELB tags.
fn classic_tags_of(pairs: &[(String, String)]) -> Result<Vec<Tag>> {
    pairs
        .iter()
        .map(|(k, v)| built(Tag::builder().key(k).value(v).build()))
        .collect()
}

/// The value of the tag `key`, if any.
pub(super) fn classic_tag_value<'a>(tags: &'a [Tag], key: &str) -> Option<&'a str> {
    tags.iter().find(|t| t.key() == key).and_then(|t| t.value())
}

/// Whether `tags` mark a Classic ELB as `cluster`'s
/// ([`tags::marks_cluster`]).
fn classic_belongs(tags: &[Tag], cluster: &str) -> bool {
    tags::marks_cluster(tags.iter().map(|t| (Some(t.key()), t.value())), cluster)
}

/// The status of a Classic ELB: its DNS name (it has no provisioning
/// state; the name answers once it exists).
pub(super) fn classic_status(elb: &Elb) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: elb
            .dns_name()
            .map(|dns| Ingress {
                hostname: dns.to_owned(),
                ..Default::default()
            })
            .into_iter()
            .collect(),
        adopted: None,
        no_effect: Vec::new(),
    }
}

/// What an ensure says of `elb` with the tags `t` when it takes it over:
/// one without our UID tag was made by cloud-provider-aws.
pub(super) fn classic_adoption(elb: &Elb, t: &[Tag]) -> Option<String> {
    classic_tag_value(t, TAG_SERVICE_UID).is_none().then(|| {
        format!(
            "adopted the Classic ELB {} ({}) in place, with its security groups and instances",
            elb.load_balancer_name().unwrap_or_default(),
            elb.dns_name().unwrap_or_default(),
        )
    })
}

/// `elb` as listed, its Service read from its tags `t`. One made by
/// cloud-provider-aws carries no UID until our first ensure tags it.
pub(super) fn classic_listed(elb: &Elb, t: &[Tag]) -> LoadBalancer {
    LoadBalancer {
        name: elb.load_balancer_name().unwrap_or_default().to_owned(),
        service: tags::service_of(
            classic_tag_value(t, TAG_SERVICE_NAME),
            classic_tag_value(t, TAG_SERVICE_UID),
        ),
        status: classic_status(elb),
        hosts: Vec::new(),
    }
}

/// Refuses a change of scheme, which a Classic ELB cannot make.
pub(super) fn check_classic_immutable(elb: &Elb, o: &LbOptions) -> Result<()> {
    let internal = elb.scheme() == Some("internal");
    if internal == o.internal {
        return Ok(());
    }
    Err(CloudError::invalid(
        annotations::field(annotations::INTERNAL),
        format!(
            "the Classic ELB was made {}; the scheme cannot change after creation: delete the Service (or change its type away from LoadBalancer and back) to make a new one",
            if internal {
                "internal"
            } else {
                "internet-facing"
            }
        ),
    ))
}

/// What AWS calls a listener like `l`.
fn listener(l: &ClassicListener) -> Result<Listener> {
    built(
        Listener::builder()
            .protocol(l.protocol)
            .load_balancer_port(l.port)
            .instance_protocol(l.instance_protocol)
            .instance_port(l.instance_port)
            .set_ssl_certificate_id(l.certificate.clone())
            .build(),
    )
}

/// Where a Classic ELB goes and what it is made with.
pub(super) struct ClassicShape<'a> {
    pub(super) listeners: &'a [ClassicListener],
    pub(super) subnets: &'a [String],
    pub(super) groups: &'a [String],
    pub(super) tags: &'a [(String, String)],
    pub(super) internal: bool,
}

impl AwsCloud {
    /// The Classic ELB named `name`, if any.
    pub(super) async fn find_classic(&self, name: &str) -> Result<Option<Elb>> {
        match self
            .classic
            .describe_load_balancers()
            .load_balancer_names(name)
            .send()
            .await
        {
            Ok(answer) => Ok(answer.load_balancer_descriptions().first().cloned()),
            Err(e) if errors::code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(errors::cloud_error("DescribeLoadBalancers", e)),
        }
    }

    /// Tags of each named Classic ELB.
    async fn classic_tags(&self, names: &[String]) -> Result<HashMap<String, Vec<Tag>>> {
        let mut out = HashMap::new();
        for chunk in names.chunks(TAGS_PER_CALL) {
            let answer = self
                .classic
                .describe_tags()
                .set_load_balancer_names(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeTags", e))?;
            for d in answer.tag_descriptions() {
                if let Some(name) = d.load_balancer_name() {
                    out.insert(name.to_owned(), d.tags().to_vec());
                }
            }
        }
        Ok(out)
    }

    /// The Service's Classic ELB when it is this cluster's, with its tags.
    /// `Err(Conflict)` when one of that name is someone else's.
    pub(super) async fn owned_classic(
        &self,
        cluster: &str,
        name: &str,
    ) -> Result<Option<(Elb, Vec<Tag>)>> {
        let Some(elb) = self.find_classic(name).await? else {
            return Ok(None);
        };
        let tags = self
            .classic_tags(&[name.to_owned()])
            .await?
            .remove(name)
            .unwrap_or_default();
        if classic_belongs(&tags, cluster) {
            Ok(Some((elb, tags)))
        } else {
            Err(CloudError::Conflict(format!(
                "a Classic ELB named {name} exists without the tag {}=owned; it is not this cluster's and is left alone",
                tags::cluster_key(cluster)
            )))
        }
    }

    /// Every Classic ELB of the cluster, each with its tags.
    pub(super) async fn owned_classics(&self, cluster: &str) -> Result<Vec<(Elb, Vec<Tag>)>> {
        let all: Vec<Elb> = self
            .classic
            .describe_load_balancers()
            .page_size(400)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| errors::cloud_error("DescribeLoadBalancers", e))?;
        let names: Vec<String> = all
            .iter()
            .filter_map(|e| e.load_balancer_name().map(str::to_owned))
            .collect();
        let mut tags = self.classic_tags(&names).await?;
        Ok(all
            .into_iter()
            .filter_map(|e| {
                let t = tags.remove(e.load_balancer_name()?)?;
                classic_belongs(&t, cluster).then_some((e, t))
            })
            .collect())
    }

    /// A new Classic ELB named `name`, as read back.
    pub(super) async fn create_classic(&self, name: &str, shape: &ClassicShape<'_>) -> Result<Elb> {
        let listeners: Vec<Listener> = shape
            .listeners
            .iter()
            .map(listener)
            .collect::<Result<_>>()?;
        let mut create = self
            .classic
            .create_load_balancer()
            .load_balancer_name(name)
            .set_listeners(Some(listeners))
            .set_subnets(Some(shape.subnets.to_vec()))
            .set_security_groups(Some(shape.groups.to_vec()))
            .set_tags(Some(classic_tags_of(shape.tags)?));
        if shape.internal {
            create = create.scheme("internal");
        }
        create
            .send()
            .await
            .map_err(|e| errors::cloud_error("CreateLoadBalancer", e))?;
        self.find_classic(name)
            .await?
            .ok_or_else(|| CloudError::Unavailable(format!("Classic ELB {name} not visible yet")))
    }

    /// Brings an existing Classic ELB's listeners, subnets (when the
    /// Service names them), groups and tags to `shape`. A changed listener
    /// is deleted, then made again (a Classic ELB cannot change one).
    /// Whether any listener was made (the ELB is then worth reading again).
    pub(super) async fn sync_classic(
        &self,
        elb: &Elb,
        have_tags: &[Tag],
        shape: &ClassicShape<'_>,
    ) -> Result<bool> {
        let name = elb.load_balancer_name().unwrap_or_default();
        let have: Vec<&Listener> = elb
            .listener_descriptions()
            .iter()
            .filter_map(|d| d.listener())
            .collect();
        let stale: Vec<i32> = have
            .iter()
            .filter(|h| !shape.listeners.iter().any(|l| l.is(h)))
            .map(|h| h.load_balancer_port())
            .collect();
        // One port a call: moto (the tests' AWS) deletes nothing when
        // given several, and a changed listener is rare.
        for port in stale {
            self.classic
                .delete_load_balancer_listeners()
                .load_balancer_name(name)
                .load_balancer_ports(port)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DeleteLoadBalancerListeners", e))?;
        }
        let missing: Vec<Listener> = shape
            .listeners
            .iter()
            .filter(|l| !have.iter().any(|h| l.is(h)))
            .map(listener)
            .collect::<Result<_>>()?;
        let listeners_made = !missing.is_empty();
        if listeners_made {
            self.classic
                .create_load_balancer_listeners()
                .load_balancer_name(name)
                .set_listeners(Some(missing))
                .send()
                .await
                .map_err(|e| errors::cloud_error("CreateLoadBalancerListeners", e))?;
        }
        self.sync_classic_subnets(elb, shape.subnets).await?;
        let groups: BTreeSet<&str> = elb.security_groups().iter().map(String::as_str).collect();
        let want: BTreeSet<&str> = shape.groups.iter().map(String::as_str).collect();
        if groups != want {
            self.classic
                .apply_security_groups_to_load_balancer()
                .load_balancer_name(name)
                .set_security_groups(Some(shape.groups.to_vec()))
                .send()
                .await
                .map_err(|e| errors::cloud_error("ApplySecurityGroupsToLoadBalancer", e))?;
        }
        // Tags are only added: one made by cloud-provider-aws gets the
        // Service's UID (and any additional tag) and keeps its own. The
        // cluster tag goes along, as the IAM policy asks of every AddTags.
        let lacking = shape
            .tags
            .iter()
            .any(|(k, v)| classic_tag_value(have_tags, k) != Some(v.as_str()));
        if lacking {
            self.classic
                .add_tags()
                .load_balancer_names(name)
                .set_tags(Some(classic_tags_of(shape.tags)?))
                .send()
                .await
                .map_err(|e| errors::cloud_error("AddTags", e))?;
        }
        Ok(listeners_made)
    }

    /// Attaches the subnets the Service names and the ELB lacks, then
    /// detaches those it no longer names; none named: left as they are.
    async fn sync_classic_subnets(&self, elb: &Elb, want: &[String]) -> Result<()> {
        if want.is_empty() {
            return Ok(());
        }
        let name = elb.load_balancer_name().unwrap_or_default();
        let have: BTreeSet<&String> = elb.subnets().iter().collect();
        let want_set: BTreeSet<&String> = want.iter().collect();
        let attach: Vec<String> = want_set.difference(&have).map(|s| (*s).clone()).collect();
        let detach: Vec<String> = have.difference(&want_set).map(|s| (*s).clone()).collect();
        if !attach.is_empty() {
            self.classic
                .attach_load_balancer_to_subnets()
                .load_balancer_name(name)
                .set_subnets(Some(attach))
                .send()
                .await
                .map_err(|e| errors::cloud_error("AttachLoadBalancerToSubnets", e))?;
        }
        if !detach.is_empty() {
            self.classic
                .detach_load_balancer_from_subnets()
                .load_balancer_name(name)
                .set_subnets(Some(detach))
                .send()
                .await
                .map_err(|e| errors::cloud_error("DetachLoadBalancerFromSubnets", e))?;
        }
        Ok(())
    }

    /// The health check `hc` with the target `target`, when it differs.
    pub(super) async fn sync_classic_health_check(
        &self,
        elb: &Elb,
        target: &str,
        hc: &HealthCheck,
    ) -> Result<()> {
        let same = elb.health_check().is_some_and(|h| {
            h.target() == target
                && h.interval() == hc.interval
                && h.timeout() == hc.timeout
                && h.healthy_threshold() == hc.healthy
                && h.unhealthy_threshold() == hc.unhealthy
        });
        if same {
            return Ok(());
        }
        let check = built(
            Check::builder()
                .target(target)
                .interval(hc.interval)
                .timeout(hc.timeout)
                .healthy_threshold(hc.healthy)
                .unhealthy_threshold(hc.unhealthy)
                .build(),
        )?;
        self.classic
            .configure_health_check()
            .load_balancer_name(elb.load_balancer_name().unwrap_or_default())
            .health_check(check)
            .send()
            .await
            .map_err(|e| errors::cloud_error("ConfigureHealthCheck", e))?;
        Ok(())
    }

    /// The attributes `want`, when those the ELB has differ.
    pub(super) async fn sync_classic_attributes(
        &self,
        name: &str,
        want: &Attributes,
    ) -> Result<()> {
        let have = self
            .classic
            .describe_load_balancer_attributes()
            .load_balancer_name(name)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeLoadBalancerAttributes", e))?;
        if have.load_balancer_attributes().is_some_and(|a| want.are(a)) {
            return Ok(());
        }
        let log = &want.access_log;
        let attributes = LoadBalancerAttributes::builder()
            .cross_zone_load_balancing(
                CrossZoneLoadBalancing::builder()
                    .enabled(want.cross_zone)
                    .build(),
            )
            .connection_draining(
                ConnectionDraining::builder()
                    .enabled(want.draining)
                    .set_timeout(want.draining_timeout)
                    .build(),
            )
            .connection_settings(built(
                ConnectionSettings::builder()
                    .idle_timeout(want.idle_timeout)
                    .build(),
            )?)
            .access_log(
                AccessLog::builder()
                    .enabled(log.enabled)
                    .set_s3_bucket_name(log.bucket.clone().filter(|_| log.enabled))
                    .set_emit_interval(log.interval.filter(|_| log.enabled))
                    .set_s3_bucket_prefix(log.prefix.clone().filter(|_| log.enabled))
                    .build(),
            )
            .build();
        self.classic
            .modify_load_balancer_attributes()
            .load_balancer_name(name)
            .load_balancer_attributes(attributes)
            .send()
            .await
            .map_err(|e| errors::cloud_error("ModifyLoadBalancerAttributes", e))?;
        Ok(())
    }

    /// Proxy protocol on every listener's instance port (or on none), and
    /// the SSL negotiation policy on the SSL and HTTPS listeners.
    pub(super) async fn sync_classic_policies(
        &self,
        elb: &Elb,
        listeners: &[ClassicListener],
        o: &LbOptions,
    ) -> Result<()> {
        let name = elb.load_balancer_name().unwrap_or_default();
        let existing: BTreeSet<&str> = elb
            .policies()
            .map(|p| p.other_policies().iter().map(String::as_str).collect())
            .unwrap_or_default();
        if o.proxy_protocol {
            self.ensure_policy(
                name,
                &existing,
                PROXY_POLICY,
                PROXY_POLICY_TYPE,
                (PROXY_POLICY_ATTRIBUTE, "true"),
            )
            .await?;
        }
        let ports: BTreeSet<i32> = listeners.iter().map(|l| l.instance_port).collect();
        let backends: HashMap<i32, bool> = elb
            .backend_server_descriptions()
            .iter()
            .filter_map(|b| {
                Some((
                    b.instance_port()?,
                    b.policy_names().iter().any(|p| p == PROXY_POLICY),
                ))
            })
            .collect();
        let mut changes: Vec<(i32, bool)> = ports
            .iter()
            .filter(|p| backends.get(p).copied().unwrap_or(false) != o.proxy_protocol)
            .map(|p| (*p, o.proxy_protocol))
            .collect();
        changes.extend(
            backends
                .iter()
                .filter(|(port, on)| **on && !ports.contains(port))
                .map(|(port, _)| (*port, false)),
        );
        for (port, on) in changes {
            self.classic
                .set_load_balancer_policies_for_backend_server()
                .load_balancer_name(name)
                .instance_port(port)
                .set_policy_names(Some(if on {
                    vec![PROXY_POLICY.to_owned()]
                } else {
                    Vec::new()
                }))
                .send()
                .await
                .map_err(|e| errors::cloud_error("SetLoadBalancerPoliciesForBackendServer", e))?;
        }
        let Some(policy) = o.tls.as_ref().and_then(|t| t.policy.as_deref()) else {
            return Ok(());
        };
        let policy_name = ssl_policy_name(policy);
        self.ensure_policy(
            name,
            &existing,
            &policy_name,
            SSL_POLICY_TYPE,
            (SSL_POLICY_ATTRIBUTE, policy),
        )
        .await?;
        for l in listeners.iter().filter(|l| l.is_tls()) {
            let set = elb.listener_descriptions().iter().any(|d| {
                d.listener().map(Listener::load_balancer_port) == Some(l.port)
                    && d.policy_names().contains(&policy_name)
            });
            if set {
                continue;
            }
            self.classic
                .set_load_balancer_policies_of_listener()
                .load_balancer_name(name)
                .load_balancer_port(l.port)
                .policy_names(&policy_name)
                .send()
                .await
                .map_err(|e| errors::cloud_error("SetLoadBalancerPoliciesOfListener", e))?;
        }
        Ok(())
    }

    /// Makes the policy `policy` of `kind` with one attribute on the ELB
    /// `name`, unless `existing` has it.
    async fn ensure_policy(
        &self,
        name: &str,
        existing: &BTreeSet<&str>,
        policy: &str,
        kind: &str,
        (attribute, value): (&str, &str),
    ) -> Result<()> {
        if existing.contains(policy) {
            return Ok(());
        }
        match self
            .classic
            .create_load_balancer_policy()
            .load_balancer_name(name)
            .policy_name(policy)
            .policy_type_name(kind)
            .policy_attributes(
                PolicyAttribute::builder()
                    .attribute_name(attribute)
                    .attribute_value(value)
                    .build(),
            )
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if errors::code(&e) == Some("DuplicatePolicyName") => Ok(()),
            Err(e) => Err(errors::cloud_error("CreateLoadBalancerPolicy", e)),
        }
    }

    /// Registers the instances `want` lacks from the ELB and deregisters
    /// those it no longer wants: only the difference.
    pub(super) async fn sync_classic_instances(
        &self,
        elb: &Elb,
        want: &BTreeSet<String>,
    ) -> Result<()> {
        let name = elb.load_balancer_name().unwrap_or_default();
        let have: BTreeSet<String> = elb
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_owned))
            .collect();
        let of = |ids: Vec<&String>| -> Vec<Instance> {
            ids.into_iter()
                .map(|id| Instance::builder().instance_id(id).build())
                .collect()
        };
        let add = of(want.difference(&have).collect());
        let remove = of(have.difference(want).collect());
        if !add.is_empty() {
            self.classic
                .register_instances_with_load_balancer()
                .load_balancer_name(name)
                .set_instances(Some(add))
                .send()
                .await
                .map_err(|e| errors::cloud_error("RegisterInstancesWithLoadBalancer", e))?;
        }
        if !remove.is_empty() {
            self.classic
                .deregister_instances_from_load_balancer()
                .load_balancer_name(name)
                .set_instances(Some(remove))
                .send()
                .await
                .map_err(|e| errors::cloud_error("DeregisterInstancesFromLoadBalancer", e))?;
        }
        Ok(())
    }

    /// Deletes the Classic ELB `name`; one already gone is fine.
    pub(super) async fn delete_classic(&self, name: &str) -> Result<()> {
        match self
            .classic
            .delete_load_balancer()
            .load_balancer_name(name)
            .send()
            .await
        {
            Ok(_) => tracing::info!(elb = %name, "deleted Classic ELB"),
            Err(e) if errors::code(&e) == Some("LoadBalancerNotFound") => {}
            Err(e) => return Err(errors::cloud_error("DeleteLoadBalancer", e)),
        }
        Ok(())
    }
}
