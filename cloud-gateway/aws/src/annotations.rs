//! The Service annotations the AWS provider reads: the upstream AWS cloud
//! provider's names (`service.beta.kubernetes.io/aws-load-balancer-*`).
//! They pick the kind of load balancer (`aws-load-balancer-type`: none
//! for the gateway's default, Classic ELB as upstream unless the operator
//! chose `nlb`; `nlb` or `classic` by name) and configure it. Each value
//! is checked strictly; every problem is reported at once, naming the
//! annotation and what it accepts. An annotation under the prefix that
//! means nothing for the chosen kind is refused too, with why, so a
//! manifest never silently loses a setting.
//!
//! `helm/aws/README.md` documents the same table; a test keeps the two in
//! step.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use ccm_provider::{CloudError, quote};

/// The prefix of every annotation this module reads.
pub const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

pub const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
/// Ours: `"true"` lets a change of [`TYPE`] after creation replace the
/// load balancer (deleted, then made anew of the other kind, with a new
/// address) where it is otherwise refused, as upstream refuses it.
pub const ALLOW_REPLACEMENT: &str = "cloudgateway.io/allow-load-balancer-replacement";
pub const INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
pub const CROSS_ZONE: &str =
    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
pub const PROXY_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
pub const ADDITIONAL_TAGS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
pub const SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
pub const EIP_ALLOCATIONS: &str = "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
pub const PRIVATE_IPV4: &str =
    "service.beta.kubernetes.io/aws-load-balancer-private-ipv4-addresses";
pub const HC_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol";
pub const HC_PORT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port";
pub const HC_PATH: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path";
pub const HC_INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
pub const HC_TIMEOUT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout";
pub const HC_HEALTHY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold";
pub const HC_UNHEALTHY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-unhealthy-threshold";
pub const TARGET_NODE_LABELS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
pub const SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
pub const SSL_PORTS: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-ports";
pub const SSL_POLICY: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy";
pub const IP_ADDRESS_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-ip-address-type";
pub const BACKEND_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-backend-protocol";
pub const DRAINING: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-enabled";
pub const DRAINING_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-timeout";
pub const IDLE_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";
pub const ACCESS_LOG: &str = "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled";
pub const ACCESS_LOG_INTERVAL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-emit-interval";
pub const ACCESS_LOG_BUCKET: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name";
pub const ACCESS_LOG_PREFIX: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix";
pub const SECURITY_GROUPS: &str = "service.beta.kubernetes.io/aws-load-balancer-security-groups";
pub const EXTRA_SECURITY_GROUPS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups";

/// Every annotation read here.
pub const KNOWN: [&str; 31] = [
    TYPE,
    INTERNAL,
    CROSS_ZONE,
    PROXY_PROTOCOL,
    ADDITIONAL_TAGS,
    SUBNETS,
    EIP_ALLOCATIONS,
    PRIVATE_IPV4,
    HC_PROTOCOL,
    HC_PORT,
    HC_PATH,
    HC_INTERVAL,
    HC_TIMEOUT,
    HC_HEALTHY,
    HC_UNHEALTHY,
    TARGET_NODE_LABELS,
    SSL_CERT,
    SSL_PORTS,
    SSL_POLICY,
    IP_ADDRESS_TYPE,
    BACKEND_PROTOCOL,
    DRAINING,
    DRAINING_TIMEOUT,
    IDLE_TIMEOUT,
    ACCESS_LOG,
    ACCESS_LOG_INTERVAL,
    ACCESS_LOG_BUCKET,
    ACCESS_LOG_PREFIX,
    SECURITY_GROUPS,
    EXTRA_SECURITY_GROUPS,
    TARGET_GROUP_ATTRIBUTES,
];

/// The annotation upstream knows for NLBs only (target groups).
pub const TARGET_GROUP_ATTRIBUTES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";

/// The annotation a Classic ELB reads that an NLB refuses, as upstream
/// refuses it, with why.
pub const CLASSIC_ONLY: [(&str, &str); 1] = [(
    EXTRA_SECURITY_GROUPS,
    "cloud-provider-aws refuses it on NLBs too; name every group in aws-load-balancer-security-groups",
)];

/// The annotation an NLB reads that a Classic ELB refuses, as upstream
/// refuses it, with why.
pub const NLB_ONLY: [(&str, &str); 1] = [(
    TARGET_GROUP_ATTRIBUTES,
    "a Classic ELB has no target groups (cloud-provider-aws refuses it too); its proxy protocol is aws-load-balancer-proxy-protocol",
)];

/// Annotations an NLB accepts (their values still checked) that change
/// nothing on it, as upstream ignores them there: each is reported in
/// the ensure's answer with why and what would.
pub const NO_EFFECT_ON_NLB: [(&str, &str); 5] = [
    (
        DRAINING,
        "an NLB's target groups drain deregistered targets for their deregistration delay (300 s)",
    ),
    (
        DRAINING_TIMEOUT,
        "an NLB's target groups drain deregistered targets for their deregistration delay (300 s)",
    ),
    (
        IDLE_TIMEOUT,
        "an NLB's TCP idle timeout is fixed (350 s); a Classic ELB's can be set",
    ),
    (
        PROXY_PROTOCOL,
        "an NLB sends PROXY v2 headers when its target groups ask: aws-load-balancer-target-group-attributes: proxy_protocol_v2.enabled=true",
    ),
    (
        ACCESS_LOG_INTERVAL,
        "an NLB writes its access logs every 5 minutes",
    ),
];

/// Annotations a Classic ELB accepts (their values still checked) that
/// change nothing on it, as upstream ignores them there, with why and
/// what would.
pub const NO_EFFECT_ON_CLASSIC: [(&str, &str); 3] = [
    (
        EIP_ALLOCATIONS,
        "a Classic ELB has no fixed addresses; an NLB (aws-load-balancer-type: nlb) takes Elastic IPs",
    ),
    (
        PRIVATE_IPV4,
        "a Classic ELB has no fixed addresses; an internal NLB (aws-load-balancer-type: nlb) takes private addresses",
    ),
    (
        IP_ADDRESS_TYPE,
        "a Classic ELB in a VPC is IPv4 only; an NLB (aws-load-balancer-type: nlb) can be dualstack",
    ),
];

/// Annotations of the AWS Load Balancer Controller that cloud-provider-aws
/// ignores: accepted here too, each reported as having no effect. A key
/// ending in `.` names a family (`listener-attributes.TCP-80`).
pub const CONTROLLER_ONLY: [&str; 17] = [
    "name",
    "nlb-target-type",
    "scheme",
    "alpn-policy",
    "attributes",
    "listener-attributes.",
    "ipv6-addresses",
    "healthcheck-success-codes",
    "manage-backend-security-group-rules",
    "inbound-sg-rules-on-private-link-traffic",
    "customer-owned-ipv4-pool",
    "security-group-prefix-lists",
    "multi-cluster-target-group",
    "enable-prefix-for-ipv6-source-nat",
    "source-nat-ipv6-prefixes",
    "minimum-load-balancer-capacity",
    "enable-icmp-for-path-mtu-discovery",
];

/// Why a key of the AWS Load Balancer Controller has no effect.
const CONTROLLER_KEY: &str = "a setting of the AWS Load Balancer Controller, which cloud-provider-aws ignores too; aws-load-balancer-type: external hands the Service to that controller";

/// Why an unknown key under the prefix has no effect.
const UNKNOWN_KEY: &str = "not an annotation of cloud-provider-aws or the AWS Load Balancer Controller (check its spelling); cloud-provider-aws ignores it too";

/// The kind of load balancer a Service gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LbKind {
    /// A Classic ELB (ELB API), upstream's default.
    #[default]
    Classic,
    /// A Network Load Balancer (ELBv2 API).
    Nlb,
}

impl LbKind {
    /// The kind as the type annotation and the gateway's setting name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Nlb => "nlb",
        }
    }

    /// The kind as messages and descriptions name it.
    pub fn title(self) -> &'static str {
        match self {
            Self::Classic => "Classic ELB",
            Self::Nlb => "NLB",
        }
    }

    /// Reads `classic` or `nlb`.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "classic" => Some(Self::Classic),
            "nlb" => Some(Self::Nlb),
            _ => None,
        }
    }
}

/// The protocol the load balancer speaks to the instances: a Classic
/// ELB's listeners any of them; an NLB's target groups TLS (`ssl`, behind
/// a TLS listener) or TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendProtocol {
    Tcp,
    Ssl,
    Http,
    Https,
}

impl BackendProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Ssl => "SSL",
            Self::Http => "HTTP",
            Self::Https => "HTTPS",
        }
    }
}

/// Access logs of either kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessLog {
    pub enabled: bool,
    /// Minutes: 5 or 60 (a Classic ELB's only).
    pub interval: Option<i32>,
    pub bucket: Option<String>,
    pub prefix: Option<String>,
}

/// What the annotations ask of a Classic ELB only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassicOptions {
    pub draining: Option<bool>,
    /// Seconds.
    pub draining_timeout: Option<i32>,
    /// Seconds.
    pub idle_timeout: Option<i32>,
    /// Groups to add to the load balancer's own.
    pub extra_security_groups: Vec<String>,
}

/// The target group attributes an NLB's Service sets; `None` leaves the
/// group's value as it is (AWS's default on a new group), as upstream
/// leaves it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetGroupAttributes {
    pub preserve_client_ip: Option<bool>,
    pub proxy_protocol_v2: Option<bool>,
}

/// A health check protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HcProtocol {
    Tcp,
    Http,
    Https,
}

impl HcProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Http => "HTTP",
            Self::Https => "HTTPS",
        }
    }
}

/// Where health checks go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HcPort {
    /// The port traffic goes to (the node port).
    TrafficPort,
    /// A fixed port.
    Port(u16),
}

/// Health check settings the Service asks for; `None` takes the default,
/// which depends on the traffic policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthCheckOverrides {
    pub protocol: Option<HcProtocol>,
    pub port: Option<HcPort>,
    pub path: Option<String>,
    pub interval: Option<i32>,
    pub timeout: Option<i32>,
    pub healthy: Option<i32>,
    pub unhealthy: Option<i32>,
}

/// Which ports get TLS listeners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsPorts {
    /// Every port.
    All,
    /// Ports by number or name.
    Some(Vec<String>),
}

/// TLS termination at the NLB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    pub certificate_arn: String,
    pub ports: TlsPorts,
    pub policy: Option<String>,
}

/// Everything the annotations ask of the load balancer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LbOptions {
    pub kind: LbKind,
    pub internal: bool,
    pub cross_zone: Option<bool>,
    pub proxy_protocol: bool,
    pub tags: BTreeMap<String, String>,
    /// Subnet IDs or Name tags.
    pub subnets: Vec<String>,
    pub eip_allocations: Vec<String>,
    pub private_ipv4: Vec<Ipv4Addr>,
    pub health_check: HealthCheckOverrides,
    /// Label keys, with the value each must have (`None`: any value).
    pub target_node_labels: Vec<(String, Option<String>)>,
    pub tls: Option<Tls>,
    pub dualstack: bool,
    pub backend_protocol: Option<BackendProtocol>,
    /// `None` without any access log annotation: off, as upstream.
    pub access_log: Option<AccessLog>,
    /// Groups to use in place of the one the gateway makes.
    pub security_groups: Vec<String>,
    pub target_group_attributes: TargetGroupAttributes,
    pub classic: ClassicOptions,
    /// The annotations accepted that change nothing on this kind, each
    /// with why and what would (for a Normal event).
    pub no_effect: Vec<String>,
    /// A change of kind replaces the load balancer ([`ALLOW_REPLACEMENT`]).
    pub allow_replacement: bool,
}

impl LbOptions {
    /// Whether a node with `labels` is a target: it has every label the
    /// target-node-labels annotation names, with the value it gives.
    pub fn selects(&self, labels: &HashMap<String, String>) -> bool {
        self.target_node_labels
            .iter()
            .all(|(key, value)| match (labels.get(key), value) {
                (Some(have), Some(want)) => have == want,
                (Some(_), None) => true,
                (None, _) => false,
            })
    }
}

/// The request field that a problem with the annotation `key` names.
pub(super) fn field(key: &str) -> String {
    format!("spec.annotations[{key:?}]")
}

/// Comma-separated items, trimmed, empty ones dropped.
fn items(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

fn boolean(value: &str) -> Option<bool> {
    match value {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

fn number(value: &str, range: std::ops::RangeInclusive<i32>) -> Option<i32> {
    value
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|n| range.contains(n))
}

/// Whether `key` is a Kubernetes label key: an optional DNS subdomain
/// prefix and `/`, then a name of 1 to 63 characters.
fn label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            })
    });
    prefix_ok && !name.is_empty() && label_value(name)
}

/// Whether `value` is a Kubernetes label value.
fn label_value(value: &str) -> bool {
    let b = value.as_bytes();
    b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_none_or(u8::is_ascii_alphanumeric)
        && b.last().is_none_or(u8::is_ascii_alphanumeric)
}

/// Whether `id` looks like `<prefix>-<hex>`.
fn aws_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|r| {
            (1..=32).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_alphanumeric())
        })
}

/// Tag keys the gateway sets itself.
fn reserved_tag(key: &str) -> bool {
    key.starts_with("kubernetes.io/cluster/")
        || key == super::tags::TAG_SERVICE_NAME
        || key == super::tags::TAG_SERVICE_UID
        || key.to_ascii_lowercase().starts_with("aws:")
}

/// Why one annotation's value is refused: what it accepts.
struct Problem(&'static str);

impl Problem {
    fn message(self, value: &str) -> String {
        format!("{} is not accepted; {}", quote(value), self.0)
    }
}

/// Reads one annotation of this provider into `o`.
fn read(o: &mut LbOptions, key: &str, value: &str) -> Result<(), Problem> {
    match key {
        TYPE => match LbKind::parse(value) {
            Some(kind) => o.kind = kind,
            None => {
                return Err(Problem(
                    "use nlb or classic, or external for the AWS Load Balancer Controller",
                ));
            }
        },
        // "0.0.0.0/0" is what old manifests write for "internal".
        INTERNAL => match value.trim() {
            "true" | "0.0.0.0/0" => o.internal = true,
            "false" => o.internal = false,
            _ => return Err(Problem("use true or false")),
        },
        CROSS_ZONE => match boolean(value.trim()) {
            Some(b) => o.cross_zone = Some(b),
            None => return Err(Problem("use true or false")),
        },
        PROXY_PROTOCOL => {
            if value.trim() == "*" {
                o.proxy_protocol = true;
            } else {
                return Err(Problem("use * (proxy protocol v2 on every port)"));
            }
        }
        SSL_CERT => {
            let v = value.trim();
            if v.starts_with("arn:") && v.len() <= 2048 && !v.contains(',') {
                o.tls
                    .get_or_insert(Tls {
                        certificate_arn: String::new(),
                        ports: TlsPorts::All,
                        policy: None,
                    })
                    .certificate_arn = v.to_owned();
            } else {
                return Err(Problem(
                    "use the ARN of one ACM or IAM certificate (arn:...)",
                ));
            }
        }
        SSL_PORTS | SSL_POLICY => {}
        IP_ADDRESS_TYPE => match value.trim() {
            "ipv4" => o.dualstack = false,
            "dualstack" => o.dualstack = true,
            _ => return Err(Problem("use ipv4 or dualstack")),
        },
        ADDITIONAL_TAGS | SUBNETS | EIP_ALLOCATIONS | PRIVATE_IPV4 | TARGET_NODE_LABELS => {
            return read_list(o, key, value);
        }
        HC_PROTOCOL | HC_PORT | HC_PATH | HC_INTERVAL | HC_TIMEOUT | HC_HEALTHY | HC_UNHEALTHY => {
            return read_health_check(o, key, value);
        }
        BACKEND_PROTOCOL => match value.trim().to_ascii_lowercase().as_str() {
            "tcp" => o.backend_protocol = Some(BackendProtocol::Tcp),
            "ssl" => o.backend_protocol = Some(BackendProtocol::Ssl),
            "http" => o.backend_protocol = Some(BackendProtocol::Http),
            "https" => o.backend_protocol = Some(BackendProtocol::Https),
            _ => return Err(Problem("use tcp, ssl, http or https")),
        },
        SECURITY_GROUPS => o.security_groups = security_groups(value)?,
        DRAINING | DRAINING_TIMEOUT | IDLE_TIMEOUT | EXTRA_SECURITY_GROUPS => {
            return read_classic(&mut o.classic, key, value);
        }
        ACCESS_LOG | ACCESS_LOG_INTERVAL | ACCESS_LOG_BUCKET | ACCESS_LOG_PREFIX => {
            return read_access_log(o.access_log.get_or_insert_default(), key, value);
        }
        TARGET_GROUP_ATTRIBUTES => {
            return read_target_group_attributes(&mut o.target_group_attributes, value);
        }
        other => {
            let suffix = &other[PREFIX.len()..];
            let controllers = CONTROLLER_ONLY
                .iter()
                .any(|name| suffix == *name || (name.ends_with('.') && suffix.starts_with(name)));
            let why = if controllers {
                CONTROLLER_KEY
            } else {
                UNKNOWN_KEY
            };
            o.no_effect
                .push(format!("{} has no effect: {why}", short(other)));
        }
    }
    Ok(())
}

/// `key` without the `service.beta.kubernetes.io/` of every annotation
/// here, as tables and events name it.
pub fn short(key: &str) -> &str {
    key.trim_start_matches("service.beta.kubernetes.io/")
}

/// Reads a list of 1 to 5 security group IDs.
fn security_groups(value: &str) -> Result<Vec<String>, Problem> {
    let groups: Vec<String> = items(value).into_iter().map(str::to_owned).collect();
    if groups.is_empty() || groups.len() > 5 || !groups.iter().all(|g| aws_id(g, "sg")) {
        return Err(Problem(
            "use 1 to 5 security group IDs (sg-...) separated by commas",
        ));
    }
    Ok(groups)
}

/// Reads the target group attributes upstream takes (`key=value` pairs,
/// each key once, each value true or false).
fn read_target_group_attributes(a: &mut TargetGroupAttributes, value: &str) -> Result<(), Problem> {
    let accepts = "use preserve_client_ip.enabled and proxy_protocol_v2.enabled, each once, =true or =false, separated by commas";
    let mut seen = Vec::new();
    for item in items(value) {
        let (k, v) = item.split_once('=').unwrap_or((item, ""));
        let (k, v) = (k.trim(), boolean(v.trim()));
        if seen.contains(&k) {
            return Err(Problem(accepts));
        }
        seen.push(k);
        match (k, v) {
            ("preserve_client_ip.enabled", Some(b)) => a.preserve_client_ip = Some(b),
            ("proxy_protocol_v2.enabled", Some(b)) => a.proxy_protocol_v2 = Some(b),
            _ => return Err(Problem(accepts)),
        }
    }
    Ok(())
}

/// Reads one of the annotations that hold a list.
fn read_list(o: &mut LbOptions, key: &str, value: &str) -> Result<(), Problem> {
    match key {
        ADDITIONAL_TAGS => {
            let mut ok = true;
            for item in items(value) {
                let (k, v) = item.split_once('=').unwrap_or((item, ""));
                let (k, v) = (k.trim(), v.trim());
                if k.is_empty() || k.len() > 128 || v.len() > 256 || reserved_tag(k) {
                    ok = false;
                } else {
                    o.tags.insert(k.to_owned(), v.to_owned());
                }
            }
            if !ok || o.tags.len() > 40 {
                return Err(Problem(
                    "use key=value pairs separated by commas, at most 40, keys of 1 to 128 characters not starting with aws: nor naming the cluster or Service tags, values of at most 256",
                ));
            }
        }
        SUBNETS => {
            o.subnets = items(value).into_iter().map(str::to_owned).collect();
            if o.subnets.is_empty()
                || o.subnets.len() > 20
                || o.subnets.iter().any(|s| s.len() > 255)
            {
                return Err(Problem(
                    "use 1 to 20 subnet IDs (subnet-...) or subnet Name tags, separated by commas",
                ));
            }
        }
        EIP_ALLOCATIONS => {
            o.eip_allocations = items(value).into_iter().map(str::to_owned).collect();
            if o.eip_allocations.is_empty()
                || o.eip_allocations.len() > 20
                || !o.eip_allocations.iter().all(|a| aws_id(a, "eipalloc"))
            {
                return Err(Problem(
                    "use Elastic IP allocation IDs (eipalloc-...), one per subnet, separated by commas",
                ));
            }
        }
        PRIVATE_IPV4 => {
            let parsed: Result<Vec<Ipv4Addr>, _> =
                items(value).into_iter().map(str::parse).collect();
            match parsed {
                Ok(ips) if !ips.is_empty() && ips.len() <= 20 => o.private_ipv4 = ips,
                _ => {
                    return Err(Problem(
                        "use IPv4 addresses, one per subnet, separated by commas",
                    ));
                }
            }
        }
        TARGET_NODE_LABELS => {
            let mut selector = Vec::new();
            let mut ok = true;
            for item in items(value) {
                let (k, v) = match item.split_once('=') {
                    Some((k, v)) => (k.trim(), Some(v.trim())),
                    None => (item, None),
                };
                if label_key(k) && v.is_none_or(label_value) {
                    selector.push((k.to_owned(), v.map(str::to_owned)));
                } else {
                    ok = false;
                }
            }
            if ok && !selector.is_empty() && selector.len() <= 16 {
                o.target_node_labels = selector;
            } else {
                return Err(Problem(
                    "use 1 to 16 label keys or key=value pairs separated by commas",
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Reads one of the annotations only a Classic ELB has.
fn read_classic(o: &mut ClassicOptions, key: &str, value: &str) -> Result<(), Problem> {
    match key {
        DRAINING => match boolean(value.trim()) {
            Some(b) => o.draining = Some(b),
            None => return Err(Problem("use true or false")),
        },
        DRAINING_TIMEOUT => match number(value, 1..=3600) {
            Some(n) => o.draining_timeout = Some(n),
            None => return Err(Problem("use whole seconds from 1 to 3600")),
        },
        IDLE_TIMEOUT => match number(value, 1..=4000) {
            Some(n) => o.idle_timeout = Some(n),
            None => return Err(Problem("use whole seconds from 1 to 4000")),
        },
        EXTRA_SECURITY_GROUPS => o.extra_security_groups = security_groups(value)?,
        _ => {}
    }
    Ok(())
}

/// Reads one of the access log annotations.
fn read_access_log(log: &mut AccessLog, key: &str, value: &str) -> Result<(), Problem> {
    match key {
        ACCESS_LOG => match boolean(value.trim()) {
            Some(b) => log.enabled = b,
            None => return Err(Problem("use true or false")),
        },
        ACCESS_LOG_INTERVAL => match number(value, 5..=60).filter(|n| matches!(n, 5 | 60)) {
            Some(n) => log.interval = Some(n),
            None => return Err(Problem("use 5 or 60 (minutes)")),
        },
        ACCESS_LOG_BUCKET => {
            let v = value.trim();
            if (3..=63).contains(&v.len())
                && v.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
            {
                log.bucket = Some(v.to_owned());
            } else {
                return Err(Problem("use the name of an S3 bucket"));
            }
        }
        ACCESS_LOG_PREFIX => {
            let v = value.trim().trim_matches('/');
            if v.len() <= 1024 && v.bytes().all(|b| b.is_ascii_graphic()) {
                log.prefix = Some(v.to_owned());
            } else {
                return Err(Problem(
                    "use a key prefix of at most 1024 printable characters",
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Refuses what the annotations in `keys` ask of a kind that refuses it,
/// and what settings need together.
fn kind_problems(o: &LbOptions, keys: &[&String]) -> Vec<(String, String)> {
    let (other_only, kind) = match o.kind {
        LbKind::Classic => (&NLB_ONLY[..], "Classic ELBs"),
        LbKind::Nlb => (&CLASSIC_ONLY[..], "NLBs"),
    };
    let mut problems: Vec<(String, String)> = other_only
        .iter()
        .filter(|(key, _)| keys.iter().any(|k| k.as_str() == *key))
        .map(|(key, why)| (field(key), format!("not supported for {kind}: {why}")))
        .collect();
    if let Some(log) = &o.access_log
        && log.enabled
        && log.bucket.is_none()
    {
        problems.push((
            field(ACCESS_LOG_BUCKET),
            format!("needs a bucket when {ACCESS_LOG} is true"),
        ));
    }
    let c = &o.classic;
    if o.kind == LbKind::Classic && c.draining_timeout.is_some() && c.draining != Some(true) {
        problems.push((
            field(DRAINING_TIMEOUT),
            format!("needs {DRAINING}: \"true\""),
        ));
    }
    problems
}

/// Notes each annotation in `keys` that changes nothing on the chosen
/// kind, as upstream ignores it there, with why and what would.
fn kind_notices(o: &mut LbOptions, keys: &[&String]) {
    let (no_effect, kind) = match o.kind {
        LbKind::Classic => (&NO_EFFECT_ON_CLASSIC[..], "a Classic ELB"),
        LbKind::Nlb => (&NO_EFFECT_ON_NLB[..], "an NLB"),
    };
    for (key, why) in no_effect {
        if keys.iter().any(|k| k.as_str() == *key) {
            o.no_effect
                .push(format!("{} has no effect on {kind}: {why}", short(key)));
        }
    }
    if o.kind != LbKind::Nlb {
        return;
    }
    let why = match o.backend_protocol {
        Some(BackendProtocol::Http | BackendProtocol::Https) => {
            "an NLB's target groups speak TCP, or TLS behind a TLS listener (ssl); a Classic ELB speaks HTTP"
        }
        Some(BackendProtocol::Ssl) if o.tls.is_none() => {
            "ssl makes an NLB's target groups TLS behind TLS listeners only, and it has none (aws-load-balancer-ssl-cert)"
        }
        _ => return,
    };
    o.no_effect.push(format!(
        "{} has no effect on an NLB: {why}",
        short(BACKEND_PROTOCOL)
    ));
}

/// Reads one of the health check annotations.
fn read_health_check(o: &mut LbOptions, key: &str, value: &str) -> Result<(), Problem> {
    match key {
        HC_PROTOCOL => match value.trim().to_ascii_uppercase().as_str() {
            "TCP" => o.health_check.protocol = Some(HcProtocol::Tcp),
            "HTTP" => o.health_check.protocol = Some(HcProtocol::Http),
            "HTTPS" => o.health_check.protocol = Some(HcProtocol::Https),
            _ => return Err(Problem("use TCP, HTTP or HTTPS")),
        },
        HC_PORT => match value.trim() {
            "traffic-port" => o.health_check.port = Some(HcPort::TrafficPort),
            v => match number(v, 1..=65535) {
                Some(n) => o.health_check.port = Some(HcPort::Port(n as u16)),
                None => {
                    return Err(Problem("use traffic-port or a port number from 1 to 65535"));
                }
            },
        },
        HC_PATH => {
            let v = value.trim();
            if v.starts_with('/') && v.len() <= 1024 && v.bytes().all(|b| b.is_ascii_graphic()) {
                o.health_check.path = Some(v.to_owned());
            } else {
                return Err(Problem(
                    "use a path starting with / of at most 1024 printable characters",
                ));
            }
        }
        HC_INTERVAL => match number(value, 5..=300) {
            Some(n) => o.health_check.interval = Some(n),
            None => return Err(Problem("use whole seconds from 5 to 300")),
        },
        HC_TIMEOUT => match number(value, 2..=120) {
            Some(n) => o.health_check.timeout = Some(n),
            None => return Err(Problem("use whole seconds from 2 to 120")),
        },
        HC_HEALTHY => match number(value, 2..=10) {
            Some(n) => o.health_check.healthy = Some(n),
            None => return Err(Problem("use a count from 2 to 10")),
        },
        HC_UNHEALTHY => match number(value, 2..=10) {
            Some(n) => o.health_check.unhealthy = Some(n),
            None => return Err(Problem("use a count from 2 to 10")),
        },
        _ => {}
    }
    Ok(())
}

/// Refuses fixed NLB addresses that do not fit its scheme or subnets.
fn nlb_address_problems(o: &LbOptions) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    if !o.eip_allocations.is_empty() && o.internal {
        problems.push((
            field(EIP_ALLOCATIONS),
            "Elastic IPs are for internet-facing NLBs; this one is internal".into(),
        ));
    }
    if !o.private_ipv4.is_empty() && !o.internal {
        problems.push((
            field(PRIVATE_IPV4),
            format!("private addresses are for internal NLBs; set {INTERNAL}: \"true\""),
        ));
    }
    for (key, count) in [
        (EIP_ALLOCATIONS, o.eip_allocations.len()),
        (PRIVATE_IPV4, o.private_ipv4.len()),
    ] {
        if count > 0 && count != o.subnets.len() {
            problems.push((
                field(key),
                format!(
                    "gives {count} values for {} subnets; name the subnets with {SUBNETS}, one value per subnet in the same order",
                    o.subnets.len()
                ),
            ));
        }
    }
    problems
}

/// Reads and checks the AWS annotations, reporting every problem at once.
/// A Service for the AWS Load Balancer Controller is
/// `ImplementedElsewhere`, before any other annotation is looked at.
pub fn parse(
    annotations: &HashMap<String, String>,
    default: LbKind,
) -> Result<LbOptions, CloudError> {
    if let Some(kind) = annotations.get(TYPE).map(|v| v.trim())
        && matches!(kind, "external" | "nlb-ip")
    {
        return Err(CloudError::ImplementedElsewhere(format!(
            "{TYPE}={kind} belongs to the AWS Load Balancer Controller"
        )));
    }
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut o = LbOptions {
        kind: default,
        ..Default::default()
    };
    let mut keys: Vec<&String> = annotations
        .keys()
        .filter(|k| k.starts_with(PREFIX))
        .collect();
    keys.sort();
    for key in &keys {
        if let Err(problem) = read(&mut o, key, annotations[*key].as_str()) {
            problems.push((field(key), problem.message(&annotations[*key])));
        }
    }
    problems.extend(kind_problems(&o, &keys));
    kind_notices(&mut o, &keys);
    match annotations.get(ALLOW_REPLACEMENT).map(|v| v.trim()) {
        None | Some("false") => {}
        Some("true") => o.allow_replacement = true,
        Some(other) => problems.push((
            field(ALLOW_REPLACEMENT),
            format!(
                "{} is not accepted; use \"true\" or \"false\"",
                quote(other)
            ),
        )),
    }
    // The TLS settings that only make sense with a certificate.
    let ports = annotations.get(SSL_PORTS).map(|v| v.trim());
    let policy = annotations.get(SSL_POLICY).map(|v| v.trim());
    match o.tls.as_mut() {
        Some(tls) => {
            if let Some(ports) = ports {
                let list = items(ports);
                if list == ["*"] {
                    tls.ports = TlsPorts::All;
                } else if !list.is_empty()
                    && list.len() <= 100
                    && list.iter().all(|p| p.len() <= 63)
                {
                    tls.ports = TlsPorts::Some(list.into_iter().map(str::to_owned).collect());
                } else {
                    problems.push((
                        field(SSL_PORTS),
                        format!("{} is not accepted; use * or port numbers or names separated by commas", quote(ports)),
                    ));
                }
            }
            if let Some(policy) = policy {
                if !policy.is_empty()
                    && policy.len() <= 128
                    && policy
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                {
                    tls.policy = Some(policy.to_owned());
                } else {
                    problems.push((
                        field(SSL_POLICY),
                        format!("{} is not accepted; use the name of an ELB security policy, e.g. ELBSecurityPolicy-TLS13-1-2-2021-06", quote(policy)),
                    ));
                }
            }
        }
        None => {
            for (key, set) in [(SSL_PORTS, ports.is_some()), (SSL_POLICY, policy.is_some())] {
                if set {
                    problems.push((field(key), format!("needs {SSL_CERT} as well")));
                }
            }
        }
    }
    let hc = &o.health_check;
    if hc.path.is_some() && hc.protocol == Some(HcProtocol::Tcp) {
        problems.push((field(HC_PATH), "TCP health checks have no path".into()));
    }
    if let (Some(interval), Some(timeout)) = (hc.interval, hc.timeout)
        && timeout > interval
    {
        problems.push((
            field(HC_TIMEOUT),
            format!("{timeout}s is longer than the interval ({interval}s)"),
        ));
    }
    if o.kind == LbKind::Nlb {
        problems.extend(nlb_address_problems(&o));
    }
    CloudError::none_of(problems)?;
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn nlb(pairs: &[(&str, &str)]) -> LbOptions {
        parse(&annotations(pairs), LbKind::Nlb).unwrap()
    }

    fn problems(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        problems_of(pairs, LbKind::Nlb)
    }

    fn problems_of(pairs: &[(&str, &str)], default: LbKind) -> Vec<(String, String)> {
        match parse(&annotations(pairs), default) {
            Err(CloudError::InvalidArgument(p)) => p,
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    #[test]
    fn no_annotations_is_an_internet_facing_tcp_checked_nlb() {
        let o = nlb(&[("example.com/other", "x")]);
        assert_eq!(
            o,
            LbOptions {
                kind: LbKind::Nlb,
                ..Default::default()
            }
        );
    }

    #[test]
    fn the_type_annotation_picks_the_kind_and_the_default_applies_without_it() {
        let kind =
            |pairs: &[(&str, &str)], default| parse(&annotations(pairs), default).unwrap().kind;
        assert_eq!(kind(&[], LbKind::Classic), LbKind::Classic);
        assert_eq!(kind(&[], LbKind::Nlb), LbKind::Nlb);
        assert_eq!(kind(&[(TYPE, "nlb")], LbKind::Classic), LbKind::Nlb);
        assert_eq!(kind(&[(TYPE, " classic ")], LbKind::Nlb), LbKind::Classic);
    }

    #[test]
    fn classic_settings_are_read_for_a_classic_elb() {
        let o = parse(
            &annotations(&[
                (BACKEND_PROTOCOL, "HTTP"),
                (DRAINING, "true"),
                (DRAINING_TIMEOUT, "120"),
                (IDLE_TIMEOUT, "300"),
                (ACCESS_LOG, "true"),
                (ACCESS_LOG_INTERVAL, "5"),
                (ACCESS_LOG_BUCKET, "my-logs"),
                (ACCESS_LOG_PREFIX, "/elb/"),
                (EXTRA_SECURITY_GROUPS, "sg-0a1, sg-0b2"),
                (CROSS_ZONE, "true"),
                (PROXY_PROTOCOL, "*"),
            ]),
            LbKind::Classic,
        )
        .unwrap();
        let c = &o.classic;
        assert_eq!(o.backend_protocol, Some(BackendProtocol::Http));
        assert_eq!(
            (c.draining, c.draining_timeout, c.idle_timeout),
            (Some(true), Some(120), Some(300))
        );
        let log = o.access_log.as_ref().unwrap();
        assert!(log.enabled);
        assert_eq!(log.interval, Some(5));
        assert_eq!(log.bucket.as_deref(), Some("my-logs"));
        assert_eq!(log.prefix.as_deref(), Some("elb"));
        assert_eq!(c.extra_security_groups, ["sg-0a1", "sg-0b2"]);
        assert!(o.proxy_protocol);
        assert!(o.no_effect.is_empty(), "{:?}", o.no_effect);
    }

    #[test]
    fn what_upstream_refuses_on_a_kind_is_refused_with_why() {
        let found = problems_of(
            &[(TARGET_GROUP_ATTRIBUTES, "proxy_protocol_v2.enabled=true")],
            LbKind::Classic,
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].1.contains("no target groups"), "{found:?}");
        let found = problems(&[(EXTRA_SECURITY_GROUPS, "sg-1")]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].1.contains("not supported for NLBs"), "{found:?}");
        let found = problems_of(
            &[
                (ACCESS_LOG, "true"),
                (DRAINING_TIMEOUT, "30"),
                (ACCESS_LOG_INTERVAL, "15"),
            ],
            LbKind::Classic,
        );
        let has = |key: &str, text: &str| {
            found
                .iter()
                .any(|(f, p)| f.contains(key) && p.contains(text))
        };
        assert!(has("s3-bucket-name", "needs a bucket"), "{found:?}");
        assert!(has("draining-timeout", "needs"), "{found:?}");
        assert!(has("emit-interval", "5 or 60"), "{found:?}");
        let found = problems(&[(ACCESS_LOG, "true")]);
        assert!(found[0].1.contains("needs a bucket"), "{found:?}");
    }

    #[test]
    fn what_upstream_ignores_on_a_kind_is_accepted_and_said_to_have_no_effect() {
        let o = nlb(&[
            (IDLE_TIMEOUT, "60"),
            (DRAINING, "true"),
            (PROXY_PROTOCOL, "*"),
            (BACKEND_PROTOCOL, "http"),
            (ACCESS_LOG_INTERVAL, "5"),
            (
                "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type",
                "ip",
            ),
            (
                "service.beta.kubernetes.io/aws-load-balancer-listener-attributes.TCP-80",
                "x=y",
            ),
            (
                "service.beta.kubernetes.io/aws-load-balancer-colour",
                "blue",
            ),
        ]);
        let said = |text: &str| o.no_effect.iter().any(|n| n.contains(text));
        assert_eq!(o.no_effect.len(), 8, "{:?}", o.no_effect);
        assert!(said(
            "connection-idle-timeout has no effect on an NLB: an NLB's TCP idle timeout is fixed"
        ));
        assert!(
            said("proxy-protocol has no effect on an NLB")
                && said("proxy_protocol_v2.enabled=true")
        );
        assert!(said("backend-protocol has no effect on an NLB"));
        assert!(said(
            "nlb-target-type has no effect: a setting of the AWS Load Balancer Controller"
        ));
        assert!(said(
            "listener-attributes.TCP-80 has no effect: a setting of the AWS Load Balancer Controller"
        ));
        assert!(said("colour has no effect: not an annotation"));
        // tcp is what an NLB speaks anyway; ssl with a certificate is honoured.
        assert!(nlb(&[(BACKEND_PROTOCOL, "tcp")]).no_effect.is_empty());
        let tls = nlb(&[
            (BACKEND_PROTOCOL, "ssl"),
            (SSL_CERT, "arn:aws:acm:r:1:certificate/x"),
        ]);
        assert!(tls.no_effect.is_empty(), "{:?}", tls.no_effect);
        assert_eq!(tls.backend_protocol, Some(BackendProtocol::Ssl));
        // A value wrong for both kinds is still refused.
        assert_eq!(problems(&[(IDLE_TIMEOUT, "forever")]).len(), 1);
        let classic = parse(
            &annotations(&[
                (IP_ADDRESS_TYPE, "dualstack"),
                (EIP_ALLOCATIONS, "eipalloc-1"),
            ]),
            LbKind::Classic,
        )
        .unwrap();
        assert_eq!(classic.no_effect.len(), 2, "{:?}", classic.no_effect);
        assert!(
            classic
                .no_effect
                .iter()
                .all(|n| n.contains("on a Classic ELB"))
        );
    }

    #[test]
    fn target_group_attributes_take_upstreams_two_keys_once_each() {
        let o = nlb(&[(
            TARGET_GROUP_ATTRIBUTES,
            "preserve_client_ip.enabled=false, proxy_protocol_v2.enabled=true",
        )]);
        assert_eq!(
            o.target_group_attributes,
            TargetGroupAttributes {
                preserve_client_ip: Some(false),
                proxy_protocol_v2: Some(true),
            }
        );
        for bad in [
            "proxy_protocol_v2.enabled=yes",
            "deregistration_delay.timeout_seconds=30",
            "proxy_protocol_v2.enabled=true,proxy_protocol_v2.enabled=false",
            "proxy_protocol_v2.enabled",
        ] {
            let found = problems(&[(TARGET_GROUP_ATTRIBUTES, bad)]);
            assert_eq!(found.len(), 1, "{bad}: {found:?}");
        }
    }

    #[test]
    fn external_and_nlb_ip_belong_to_the_load_balancer_controller() {
        for kind in ["external", "nlb-ip"] {
            let verdict = parse(
                &annotations(&[(TYPE, kind), (HC_INTERVAL, "bogus")]),
                LbKind::Classic,
            );
            assert!(
                matches!(verdict, Err(CloudError::ImplementedElsewhere(_))),
                "{kind}"
            );
        }
    }

    #[test]
    fn valid_values_are_read() {
        let o = nlb(&[
            (TYPE, "nlb"),
            (INTERNAL, "true"),
            (CROSS_ZONE, "true"),
            (PROXY_PROTOCOL, "*"),
            (ADDITIONAL_TAGS, "team=web, cost-centre=42"),
            (SUBNETS, "subnet-0a1, private-b"),
            (PRIVATE_IPV4, "10.0.1.10,10.0.2.10"),
            (HC_PROTOCOL, "http"),
            (HC_PORT, "8080"),
            (HC_PATH, "/ready"),
            (HC_INTERVAL, "30"),
            (HC_TIMEOUT, "5"),
            (HC_HEALTHY, "3"),
            (HC_UNHEALTHY, "4"),
            (TARGET_NODE_LABELS, "node-role.example.com/lb, zone=a"),
            (SSL_CERT, "arn:aws:acm:us-east-1:1:certificate/x"),
            (SSL_PORTS, "443, https"),
            (SSL_POLICY, "ELBSecurityPolicy-TLS13-1-2-2021-06"),
            (IP_ADDRESS_TYPE, "dualstack"),
            (SECURITY_GROUPS, "sg-0a1"),
        ]);
        assert!(o.internal && o.dualstack);
        assert_eq!(o.security_groups, ["sg-0a1"]);
        assert_eq!(o.cross_zone, Some(true));
        assert_eq!(o.tags["cost-centre"], "42");
        assert_eq!(o.subnets, ["subnet-0a1", "private-b"]);
        assert_eq!(o.private_ipv4.len(), 2);
        assert_eq!(o.health_check.protocol, Some(HcProtocol::Http));
        assert_eq!(o.health_check.port, Some(HcPort::Port(8080)));
        assert_eq!(
            o.target_node_labels,
            [
                ("node-role.example.com/lb".to_owned(), None),
                ("zone".to_owned(), Some("a".to_owned()))
            ]
        );
        let tls = o.tls.unwrap();
        assert_eq!(
            tls.ports,
            TlsPorts::Some(vec!["443".into(), "https".into()])
        );
        assert!(tls.policy.is_some());
    }

    #[test]
    fn every_problem_is_reported_with_what_is_accepted() {
        let found = problems(&[
            (TYPE, "alb"),
            (INTERNAL, "yes"),
            (HC_INTERVAL, "1"),
            (HC_PORT, "70000"),
            (ADDITIONAL_TAGS, "kubernetes.io/cluster/other=owned"),
            (SSL_PORTS, "443"),
            (IDLE_TIMEOUT, "0"),
        ]);
        let has = |key: &str, text: &str| {
            found
                .iter()
                .any(|(f, p)| f.contains(key) && p.contains(text))
        };
        assert_eq!(found.len(), 7, "{found:?}");
        assert!(has("-type", "use nlb or classic"));
        assert!(has("-internal", "true or false"));
        assert!(has("healthcheck-interval", "5 to 300"));
        assert!(has("healthcheck-port", "traffic-port"));
        assert!(has("additional-resource-tags", "key=value"));
        assert!(has("ssl-ports", "needs"));
        assert!(has("idle-timeout", "1 to 4000"));
    }

    #[test]
    fn addresses_must_match_the_named_subnets_and_the_scheme() {
        let found = problems(&[
            (EIP_ALLOCATIONS, "eipalloc-1,eipalloc-2"),
            (SUBNETS, "subnet-1"),
        ]);
        assert!(found[0].1.contains("2 values for 1 subnets"), "{found:?}");
        let found = problems(&[(PRIVATE_IPV4, "10.0.0.1")]);
        assert!(
            found.iter().any(|(_, p)| p.contains("internal NLBs")),
            "{found:?}"
        );
    }

    #[test]
    fn target_node_labels_select_by_key_and_by_value() {
        let o = nlb(&[(TARGET_NODE_LABELS, "lb, zone=a")]);
        let labels = |pairs: &[(&str, &str)]| annotations(pairs);
        assert!(o.selects(&labels(&[("lb", ""), ("zone", "a")])));
        assert!(!o.selects(&labels(&[("lb", ""), ("zone", "b")])));
        assert!(!o.selects(&labels(&[("zone", "a")])));
        assert!(LbOptions::default().selects(&labels(&[])));
        let found = problems(&[(TARGET_NODE_LABELS, "Bad Key=x")]);
        assert!(found[0].1.contains("label keys"), "{found:?}");
    }

    /// The cells of the operators' table row of `key`: values, upstream,
    /// Classic ELB here, NLB here.
    fn table_row(doc: &str, key: &str) -> Vec<String> {
        let start = format!("| `{}` | ", short(key));
        let row = doc
            .lines()
            .find(|l| l.starts_with(&start))
            .unwrap_or_else(|| panic!("{} not in the table", short(key)));
        row[start.len()..]
            .trim_end_matches(" |")
            .split(" | ")
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_operators_table_says_what_each_kind_does_with_every_annotation() {
        let doc = include_str!("../../../helm/aws/README.md");
        for key in KNOWN {
            assert_eq!(table_row(doc, key).len(), 4, "{}", short(key));
        }
        let cell = |key: &str, kind: LbKind| {
            table_row(doc, key)[match kind {
                LbKind::Classic => 2,
                LbKind::Nlb => 3,
            }]
            .clone()
        };
        for (key, _) in NLB_ONLY {
            assert!(cell(key, LbKind::Classic).starts_with("refused"), "{key}");
        }
        for (key, _) in CLASSIC_ONLY {
            assert!(cell(key, LbKind::Nlb).starts_with("refused"), "{key}");
        }
        for (key, _) in NO_EFFECT_ON_CLASSIC {
            assert!(cell(key, LbKind::Classic).starts_with("no effect"), "{key}");
        }
        for (key, _) in NO_EFFECT_ON_NLB {
            assert!(cell(key, LbKind::Nlb).starts_with("no effect"), "{key}");
        }
        // No other row claims a refusal or no effect the code does not make.
        for key in KNOWN {
            for kind in [LbKind::Classic, LbKind::Nlb] {
                let text = cell(key, kind);
                let (refused, ignored) = match kind {
                    LbKind::Classic => (&NLB_ONLY[..], &NO_EFFECT_ON_CLASSIC[..]),
                    LbKind::Nlb => (&CLASSIC_ONLY[..], &NO_EFFECT_ON_NLB[..]),
                };
                assert_eq!(
                    text.starts_with("refused"),
                    refused.iter().any(|(k, _)| *k == key),
                    "{key} for {kind:?}: {text}"
                );
                assert_eq!(
                    text.starts_with("no effect"),
                    ignored.iter().any(|(k, _)| *k == key),
                    "{key} for {kind:?}: {text}"
                );
            }
        }
        for name in CONTROLLER_ONLY {
            assert!(
                doc.contains(&format!("`{name}`")),
                "{name} not in the Controller's list"
            );
        }
    }
}
