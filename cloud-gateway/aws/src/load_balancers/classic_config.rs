//! What a Classic ELB is configured with, decided from the Service and its
//! annotations as cloud-provider-aws decides it, so a Classic ELB it made
//! is already what we want: its listeners, its health check target, its
//! attributes and the names of its policies. Pure; `classic` writes them.

use std::collections::BTreeSet;

use ccm_provider::{CloudError, LoadBalancerSpec, Protocol, Result};

use super::health_check::HealthCheck;
use super::ingress_rules::Opening;
use super::listeners::{check_tls_ports_exist, is_tls_port};
use crate::annotations::{self, BackendProtocol, HcPort, HcProtocol, LbOptions};

/// The most listeners one Classic ELB has (an AWS quota).
const MAX_LISTENERS: usize = 100;
/// The idle timeout when the Service sets none (seconds; upstream's).
const DEFAULT_IDLE_TIMEOUT: i32 = 60;

/// The proxy protocol policy's name, type and attribute (upstream's).
pub(super) const PROXY_POLICY: &str = "k8s-proxyprotocol-enabled";
pub(super) const PROXY_POLICY_TYPE: &str = "ProxyProtocolPolicyType";
pub(super) const PROXY_POLICY_ATTRIBUTE: &str = "ProxyProtocol";
/// The SSL negotiation policy's type and attribute (upstream's); its name
/// comes from [`ssl_policy_name`].
pub(super) const SSL_POLICY_TYPE: &str = "SSLNegotiationPolicyType";
pub(super) const SSL_POLICY_ATTRIBUTE: &str = "Reference-Security-Policy";

/// One Classic ELB listener. Protocols are upper case, as AWS reports
/// them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ClassicListener {
    pub(super) port: i32,
    pub(super) protocol: &'static str,
    pub(super) instance_port: i32,
    pub(super) instance_protocol: &'static str,
    pub(super) certificate: Option<String>,
}

impl ClassicListener {
    /// Whether clients reach it over TLS (SSL or HTTPS), which the SSL
    /// negotiation policy applies to.
    pub(super) fn is_tls(&self) -> bool {
        matches!(self.protocol, "SSL" | "HTTPS")
    }

    /// The port clients reach.
    pub(super) fn client_opening(&self) -> Opening {
        Opening {
            port: self.port,
            protocols: &["tcp"],
        }
    }

    /// Whether `have` (as AWS reports it) is this listener: protocols
    /// compared without case, the certificate by ARN.
    pub(super) fn is(&self, have: &aws_sdk_elasticloadbalancing::types::Listener) -> bool {
        have.load_balancer_port() == self.port
            && have.instance_port() == self.instance_port
            && have.protocol().eq_ignore_ascii_case(self.protocol)
            && have
                .instance_protocol()
                .unwrap_or(have.protocol())
                .eq_ignore_ascii_case(self.instance_protocol)
            && have.ssl_certificate_id().map(str::to_ascii_lowercase)
                == self.certificate.as_deref().map(str::to_ascii_lowercase)
    }
}

/// The listeners of `spec`, one per port: TCP to TCP; with the
/// certificate annotation on the ports it names, SSL (or HTTPS when the
/// instances speak HTTP or HTTPS) to the backend protocol; HTTP to HTTP
/// where the backend protocol is HTTP on a port without the certificate.
pub(super) fn classic_listeners(
    spec: &LoadBalancerSpec,
    o: &LbOptions,
) -> Result<Vec<ClassicListener>> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for p in &spec.ports {
        if p.protocol != Protocol::Tcp {
            return Err(CloudError::invalid(
                "spec.ports",
                format!(
                    "port {}: a Classic ELB carries TCP only; annotate {}: nlb for {}",
                    p.port,
                    annotations::TYPE,
                    p.protocol.as_str()
                ),
            ));
        }
        if p.node_port == 0 {
            return Err(CloudError::invalid(
                "spec.ports",
                format!(
                    "port {}: has no node port; a Classic ELB sends to node ports (allocateLoadBalancerNodePorts must not be false)",
                    p.port
                ),
            ));
        }
        if !seen.insert(p.port) {
            return Err(CloudError::invalid(
                "spec.ports",
                format!("port {} is named twice", p.port),
            ));
        }
        out.push(listener(p.port, p.node_port, &p.name, o));
    }
    if out.len() > MAX_LISTENERS {
        return Err(CloudError::invalid(
            "spec.ports",
            format!(
                "{} ports; a Classic ELB has at most {MAX_LISTENERS} listeners",
                out.len()
            ),
        ));
    }
    check_tls_ports_exist(spec, o)?;
    Ok(out)
}

/// The listener of one TCP port.
fn listener(port: i32, node_port: i32, name: &str, o: &LbOptions) -> ClassicListener {
    let backend = o.backend_protocol;
    let certificate = o
        .tls
        .as_ref()
        .filter(|_| is_tls_port(o, port, name))
        .map(|t| t.certificate_arn.clone());
    let (protocol, instance_protocol) = match (&certificate, backend) {
        (Some(_), None) => ("SSL", "TCP"),
        (Some(_), Some(b @ (BackendProtocol::Http | BackendProtocol::Https))) => {
            ("HTTPS", b.as_str())
        }
        (Some(_), Some(b)) => ("SSL", b.as_str()),
        (None, Some(BackendProtocol::Http)) => ("HTTP", "HTTP"),
        (None, _) => ("TCP", "TCP"),
    };
    ClassicListener {
        port,
        protocol,
        instance_port: node_port,
        instance_protocol,
        certificate,
    }
}

/// The health check's target (`TCP:30080`, `HTTP:32000/healthz`): the
/// traffic port is the first listener's node port; a TCP check becomes
/// SSL where the instances speak SSL or HTTPS and the Service chose no
/// protocol.
pub(super) fn health_check_target(
    hc: &HealthCheck,
    listeners: &[ClassicListener],
    o: &LbOptions,
) -> String {
    let port = match hc.port {
        HcPort::Port(p) => i32::from(p),
        HcPort::TrafficPort => listeners.first().map_or(0, |l| l.instance_port),
    };
    let secure_backend = matches!(
        o.backend_protocol,
        Some(BackendProtocol::Ssl | BackendProtocol::Https)
    );
    match hc.protocol {
        HcProtocol::Tcp if secure_backend && o.health_check.protocol.is_none() => {
            format!("SSL:{port}")
        }
        HcProtocol::Tcp => format!("TCP:{port}"),
        p => format!("{}:{port}{}", p.as_str(), hc.path.as_deref().unwrap_or("/")),
    }
}

/// The attributes a Classic ELB gets: what the annotations set, upstream's
/// defaults for the rest (access log and draining off, 60 s idle timeout,
/// cross-zone off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Attributes {
    pub(super) cross_zone: bool,
    pub(super) draining: bool,
    pub(super) draining_timeout: Option<i32>,
    pub(super) idle_timeout: i32,
    pub(super) access_log: annotations::AccessLog,
}

impl Attributes {
    pub(super) fn of(o: &LbOptions) -> Self {
        let c = &o.classic;
        Self {
            cross_zone: o.cross_zone.unwrap_or(false),
            draining: c.draining.unwrap_or(false),
            draining_timeout: c.draining_timeout,
            idle_timeout: c.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
            access_log: o.access_log.clone().unwrap_or_default(),
        }
    }

    /// Whether `have` (as AWS reports them) already are these; what the
    /// Service leaves unset is not compared.
    pub(super) fn are(
        &self,
        have: &aws_sdk_elasticloadbalancing::types::LoadBalancerAttributes,
    ) -> bool {
        let cross_zone = have
            .cross_zone_load_balancing()
            .is_some_and(|c| c.enabled())
            == self.cross_zone;
        let draining = have.connection_draining();
        let draining_ok = draining.is_some_and(|d| d.enabled()) == self.draining
            && (self.draining_timeout.is_none()
                || draining.and_then(|d| d.timeout()) == self.draining_timeout);
        let idle = have
            .connection_settings()
            .map_or(DEFAULT_IDLE_TIMEOUT, |s| s.idle_timeout())
            == self.idle_timeout;
        let log = have.access_log();
        let want = &self.access_log;
        let log_ok = log.is_some_and(|l| l.enabled()) == want.enabled
            && (!want.enabled
                || (log.and_then(|l| l.s3_bucket_name()) == want.bucket.as_deref()
                    && (want.interval.is_none()
                        || log.and_then(|l| l.emit_interval()) == want.interval)
                    && log.and_then(|l| l.s3_bucket_prefix()).unwrap_or_default()
                        == want.prefix.as_deref().unwrap_or_default()));
        cross_zone && draining_ok && idle && log_ok
    }
}

/// The name of the SSL negotiation policy for the predefined `policy`.
pub(super) fn ssl_policy_name(policy: &str) -> String {
    format!("k8s-SSLNegotiationPolicy-{policy}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::{LbKind, Tls, TlsPorts};
    use crate::load_balancers::test_support::{port, spec};

    fn tls(ports: TlsPorts, backend: Option<BackendProtocol>) -> LbOptions {
        let mut o = LbOptions {
            kind: LbKind::Classic,
            tls: Some(Tls {
                certificate_arn: "arn:aws:acm:eu-west-1:1:certificate/x".into(),
                ports,
                policy: None,
            }),
            ..Default::default()
        };
        o.backend_protocol = backend;
        o
    }

    fn protocols(l: &[ClassicListener]) -> Vec<(i32, &str, &str, bool)> {
        l.iter()
            .map(|l| {
                (
                    l.port,
                    l.protocol,
                    l.instance_protocol,
                    l.certificate.is_some(),
                )
            })
            .collect()
    }

    #[test]
    fn ports_map_to_listeners_as_upstream_maps_them() {
        let s = spec(vec![
            port("http", Protocol::Tcp, 80, 30080),
            port("https", Protocol::Tcp, 443, 30443),
        ]);
        let plain = classic_listeners(&s, &LbOptions::default()).unwrap();
        assert_eq!(
            protocols(&plain),
            [(80, "TCP", "TCP", false), (443, "TCP", "TCP", false)]
        );
        assert_eq!(plain[0].instance_port, 30080);

        let only_443 = TlsPorts::Some(vec!["https".into()]);
        let cases = [
            (None, [(80, "TCP", "TCP", false), (443, "SSL", "TCP", true)]),
            (
                Some(BackendProtocol::Http),
                [(80, "HTTP", "HTTP", false), (443, "HTTPS", "HTTP", true)],
            ),
            (
                Some(BackendProtocol::Https),
                [(80, "TCP", "TCP", false), (443, "HTTPS", "HTTPS", true)],
            ),
            (
                Some(BackendProtocol::Ssl),
                [(80, "TCP", "TCP", false), (443, "SSL", "SSL", true)],
            ),
            (
                Some(BackendProtocol::Tcp),
                [(80, "TCP", "TCP", false), (443, "SSL", "TCP", true)],
            ),
        ];
        for (backend, want) in cases {
            let got = classic_listeners(&s, &tls(only_443.clone(), backend)).unwrap();
            assert_eq!(protocols(&got), want, "{backend:?}");
        }
        let all = classic_listeners(&s, &tls(TlsPorts::All, None)).unwrap();
        assert!(all.iter().all(|l| l.protocol == "SSL"));
    }

    #[test]
    fn udp_and_ports_without_node_ports_are_refused_with_why() {
        let udp = spec(vec![port("dns", Protocol::Udp, 53, 30053)]);
        let err = classic_listeners(&udp, &LbOptions::default()).unwrap_err();
        assert!(err.to_string().contains("TCP only"), "{err}");
        assert!(err.to_string().contains("nlb"), "{err}");
        let none = spec(vec![port("a", Protocol::Tcp, 80, 0)]);
        assert!(classic_listeners(&none, &LbOptions::default()).is_err());
    }

    #[test]
    fn the_health_check_target_follows_the_traffic_policy_and_the_backend() {
        let listeners = classic_listeners(
            &spec(vec![
                port("a", Protocol::Tcp, 80, 30080),
                port("b", Protocol::Tcp, 81, 30081),
            ]),
            &LbOptions::default(),
        )
        .unwrap();
        let hc = |protocol, port, path: Option<&str>| HealthCheck {
            protocol,
            port,
            path: path.map(str::to_owned),
            interval: 10,
            timeout: 5,
            healthy: 2,
            unhealthy: 6,
        };
        let o = LbOptions::default();
        assert_eq!(
            health_check_target(
                &hc(HcProtocol::Tcp, HcPort::TrafficPort, None),
                &listeners,
                &o
            ),
            "TCP:30080"
        );
        assert_eq!(
            health_check_target(
                &hc(HcProtocol::Http, HcPort::Port(32000), Some("/healthz")),
                &listeners,
                &o
            ),
            "HTTP:32000/healthz"
        );
        let ssl = LbOptions {
            backend_protocol: Some(BackendProtocol::Ssl),
            ..Default::default()
        };
        assert_eq!(
            health_check_target(
                &hc(HcProtocol::Tcp, HcPort::TrafficPort, None),
                &listeners,
                &ssl
            ),
            "SSL:30080"
        );
    }

    #[test]
    fn attributes_default_as_upstream_sets_them() {
        let a = Attributes::of(&LbOptions::default());
        assert_eq!(
            (
                a.cross_zone,
                a.draining,
                a.idle_timeout,
                a.access_log.enabled
            ),
            (false, false, 60, false)
        );
        use aws_sdk_elasticloadbalancing::types::{
            ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing, LoadBalancerAttributes,
        };
        let fresh = LoadBalancerAttributes::builder()
            .cross_zone_load_balancing(CrossZoneLoadBalancing::builder().enabled(false).build())
            .connection_draining(
                ConnectionDraining::builder()
                    .enabled(false)
                    .timeout(300)
                    .build(),
            )
            .connection_settings(
                ConnectionSettings::builder()
                    .idle_timeout(60)
                    .build()
                    .unwrap(),
            )
            .build();
        assert!(a.are(&fresh));
        let mut o = LbOptions::default();
        o.classic.idle_timeout = Some(300);
        assert!(!Attributes::of(&o).are(&fresh));
    }
}
