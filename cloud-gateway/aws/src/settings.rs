//! The AWS provider's settings, and the checks of each value an operator
//! gives, so the gateway's flags report every bad one at once.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::annotations::LbKind;

/// The AWS provider's settings. Credentials are not among them: they come
/// from the SDK's standard chain only.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AwsSettings {
    /// The region; `None` asks the SDK's chain.
    pub region: Option<String>,
    /// An endpoint for every AWS API in place of the public ones.
    pub endpoint_url: Option<String>,
    /// The cluster's VPC.
    pub vpc_id: Option<String>,
    /// Route tables to use (each must carry the cluster tag); empty means
    /// every route table with the cluster tag.
    pub route_table_ids: Vec<String>,
    /// A role to assume.
    pub role_arn: Option<String>,
    /// The external ID for assuming the role.
    pub external_id: Option<String>,
    /// The session name for assuming the role.
    pub role_session_name: String,
    /// Whether node InternalIPs include IPv4 and IPv6 addresses, and which
    /// family comes first.
    pub node_ip_families: Vec<IpFamily>,
    /// The longest one API request may take.
    pub request_timeout: Duration,
    /// The kind of load balancer of a Service without the type annotation.
    pub default_load_balancer_type: LbKind,
    /// Never change the nodes' security groups: the operator opens them
    /// to the load balancers (upstream's `DisableSecurityGroupIngress`).
    pub disable_security_group_ingress: bool,
    /// One security group every Classic ELB uses in place of one of its
    /// own, never changed (upstream's `ElbSecurityGroup`).
    pub elb_security_group: Option<String>,
    /// Whether a new NLB gets a security group of its own.
    pub nlb_security_groups: NlbGroups,
    /// kube-proxy's health endpoint, checked for Cluster-policy Services
    /// in place of the traffic port; `None` checks the traffic port.
    pub shared_health_probe: Option<SharedProbe>,
    /// Endpoints for single AWS APIs (`autoscaling`, `ec2`, `eks`,
    /// `elasticloadbalancing`, `sts`), ahead of [`Self::endpoint_url`].
    pub endpoints: BTreeMap<String, String>,
}

/// Whether new NLBs get a security group of their own (upstream's
/// `NLBSecurityGroupMode`). Existing NLBs keep what they have either way:
/// AWS cannot give one made without a group any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NlbGroups {
    /// A group of the NLB's own, admitting its source ranges, that the
    /// nodes admit (upstream's `Managed`): our default.
    #[default]
    Own,
    /// No group; the nodes admit the client and health check CIDRs
    /// (upstream's default).
    None,
}

/// kube-proxy's health endpoint for the shared health probe (upstream's
/// `ClusterServiceLoadBalancerHealthProbeMode: Shared`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedProbe {
    pub port: u16,
    pub path: String,
}

/// The APIs [`AwsSettings::endpoints`] may name.
pub const ENDPOINT_SERVICES: [&str; 5] =
    ["autoscaling", "ec2", "eks", "elasticloadbalancing", "sts"];

/// Reads `managed` or `none`.
pub fn nlb_groups(value: &str) -> Result<NlbGroups, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "managed" => Ok(NlbGroups::Own),
        "none" => Ok(NlbGroups::None),
        _ => Err(
            "is not managed (a group per NLB) or none (no group, as cloud-provider-aws's default)"
                .into(),
        ),
    }
}

/// Reads a health probe path: `/` and then printable ASCII.
pub fn probe_path(value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = value.starts_with('/')
        && value.len() <= 1024
        && value.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(value.to_owned())
    } else {
        Err(
            "is not a path such as /healthz (starting with /, no spaces, at most 1024 characters)"
                .into(),
        )
    }
}

/// Reads `service=URL` pairs separated by commas, each API once.
pub fn endpoints(value: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in list(value) {
        let Some((service, url)) = item.split_once('=') else {
            return Err(format!("{item:?} is not service=URL"));
        };
        let service = service.trim();
        if !ENDPOINT_SERVICES.contains(&service) {
            return Err(format!(
                "{service:?} is not one of {}",
                ENDPOINT_SERVICES.join(", ")
            ));
        }
        let url = endpoint_url(url).map_err(|e| format!("{service}'s URL {e}"))?;
        if out.insert(service.to_owned(), url).is_some() {
            return Err(format!("{service} is named twice"));
        }
    }
    Ok(out)
}

/// An address family of node addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Checks an AWS resource ID such as `vpc-0123abcd` with `prefix` `vpc-`.
pub fn id(prefix: &str, value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = value.strip_prefix(prefix).is_some_and(|hex| {
        (1..=32).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if ok {
        Ok(value.to_owned())
    } else {
        Err(format!("is not an ID of the form {prefix}0123abcd"))
    }
}

/// Checks a region name such as `eu-west-1`.
pub fn region(value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = (1..=32).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok {
        Ok(value.to_owned())
    } else {
        Err("is not a region name such as eu-west-1".into())
    }
}

/// Checks an endpoint URL (`http://` or `https://`, with a host).
pub fn endpoint_url(value: &str) -> Result<String, String> {
    let value = value.trim();
    let uri: http::Uri = value.parse().map_err(|_| "is not a URL".to_owned())?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(value.to_owned()),
        _ => Err("is not an http:// or https:// URL".into()),
    }
}

/// Checks an IAM role ARN.
pub fn role_arn(value: &str) -> Result<String, String> {
    let value = value.trim();
    let parts: Vec<&str> = value.splitn(6, ':').collect();
    let ok = parts.len() == 6
        && parts[0] == "arn"
        && parts[1].starts_with("aws")
        && parts[2] == "iam"
        && parts[4].len() == 12
        && parts[4].bytes().all(|b| b.is_ascii_digit())
        && parts[5]
            .strip_prefix("role/")
            .is_some_and(|r| !r.is_empty());
    if ok {
        Ok(value.to_owned())
    } else {
        Err("is not a role ARN such as arn:aws:iam::123456789012:role/cloud-gateway".into())
    }
}

/// Reads `ipv4`, `ipv6` or both, in order, each once.
pub fn ip_families(value: &str) -> Result<Vec<IpFamily>, String> {
    let mut out = Vec::new();
    for item in list(value) {
        let family = match item {
            "ipv4" => IpFamily::V4,
            "ipv6" => IpFamily::V6,
            other => return Err(format!("{other:?} is not ipv4 or ipv6")),
        };
        if out.contains(&family) {
            return Err(format!("{item} is named twice"));
        }
        out.push(family);
    }
    if out.is_empty() {
        return Err("needs ipv4, ipv6 or both".into());
    }
    Ok(out)
}

/// Checks a role session name: 2-64 of letters, digits and `=,.@-_`.
pub fn role_session_name(value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = (2..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"=,.@-_".contains(&b));
    if ok {
        Ok(value.to_owned())
    } else {
        Err("must be 2-64 of letters, digits and =,.@-_".into())
    }
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|v| !v.is_empty())
}
