//! The AWS provider's settings, and the checks of each value an operator
//! gives, so the gateway's flags report every bad one at once.

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
