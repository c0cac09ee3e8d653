//! The health check a load balancer runs against its targets, whatever its
//! kind: the defaults the traffic policy calls for, with the annotations'
//! overrides. A pure decision; each kind writes it in its own API's terms.

use ccm_provider::{CloudError, LoadBalancerSpec, Result, TrafficPolicy};

use crate::annotations::{self, HcPort, HcProtocol, LbKind, LbOptions};
use crate::settings::SharedProbe;

/// The health check of every target of one load balancer.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct HealthCheck {
    pub(super) protocol: HcProtocol,
    pub(super) port: HcPort,
    pub(super) path: Option<String>,
    pub(super) interval: i32,
    pub(super) timeout: i32,
    pub(super) healthy: i32,
    pub(super) unhealthy: i32,
}

impl HealthCheck {
    /// The port checks go to when it is not the traffic port: the nodes
    /// must admit the load balancer on it as well.
    pub(super) fn own_port(&self) -> Option<i32> {
        match self.port {
            HcPort::Port(p) => Some(i32::from(p)),
            HcPort::TrafficPort => None,
        }
    }
}

/// The health check: HTTP on the health check node port at `/healthz`
/// for the Local traffic policy; for the Cluster policy, TCP on the
/// traffic port, or with the `shared` probe HTTP on kube-proxy's port and
/// path (upstream's "Shared" probe mode). The annotations override each,
/// except that an NLB checks the shared probe whatever they say, as
/// upstream's does ([`shared_probe_overrides`] says so in an event).
/// Intervals, thresholds and timeouts default
/// as each kind's upstream does: a Classic ELB's 2 healthy / 6 unhealthy
/// checks 10 s apart with a 5 s timeout; an NLB's 3 / 3 every 30 s for
/// the Cluster policy and 2 / 2 every 10 s for Local, with AWS's timeout
/// (10 s, 6 s for HTTP), so an NLB upstream made keeps its checks.
pub(super) fn health_check(
    spec: &LoadBalancerSpec,
    o: &LbOptions,
    shared: Option<&SharedProbe>,
) -> Result<HealthCheck> {
    let local = spec.external_traffic_policy == TrafficPolicy::Local;
    let classic = o.kind == LbKind::Classic;
    let mut h = o.health_check.clone();
    let (default_protocol, default_port, default_path) = if local {
        if spec.health_check_node_port <= 0 {
            return Err(CloudError::invalid(
                "spec.health_check_node_port",
                "the Local traffic policy needs a health check node port",
            ));
        }
        (
            HcProtocol::Http,
            HcPort::Port(spec.health_check_node_port as u16),
            Some("/healthz".to_owned()),
        )
    } else if let Some(probe) = shared {
        if !classic {
            (h.protocol, h.port, h.path) = (None, None, None);
        }
        (
            HcProtocol::Http,
            HcPort::Port(probe.port),
            Some(probe.path.clone()),
        )
    } else {
        (HcProtocol::Tcp, HcPort::TrafficPort, None)
    };
    let protocol = h.protocol.unwrap_or(default_protocol);
    let path = match protocol {
        HcProtocol::Tcp => None,
        _ => h.path.clone().or(default_path).or(Some("/".to_owned())),
    };
    // An NLB's defaults follow the traffic policy, as upstream's do.
    let (default_interval, default_healthy, default_unhealthy) = match (classic, local) {
        (true, _) => (10, 2, 6),
        (false, true) => (10, 2, 2),
        (false, false) => (30, 3, 3),
    };
    let interval = h.interval.unwrap_or(default_interval);
    let default_timeout = match (classic, protocol) {
        (true, _) => 5,
        (false, HcProtocol::Http) => 6,
        (false, _) => 10,
    };
    let timeout = h.timeout.unwrap_or(default_timeout.min(interval));
    if timeout > interval {
        return Err(CloudError::invalid(
            annotations::field(annotations::HC_TIMEOUT),
            format!("{timeout}s is longer than the interval ({interval}s)"),
        ));
    }
    Ok(HealthCheck {
        protocol,
        port: h.port.unwrap_or(default_port),
        path,
        interval,
        timeout,
        healthy: h.healthy.unwrap_or(default_healthy),
        unhealthy: h.unhealthy.unwrap_or(default_unhealthy),
    })
}

/// The health check annotations an NLB's shared probe overrides, each in
/// a sentence for the `AnnotationHasNoEffect` event.
pub(super) fn shared_probe_overrides(
    spec: &LoadBalancerSpec,
    o: &LbOptions,
    shared: Option<&SharedProbe>,
) -> Vec<String> {
    let Some(probe) = shared else {
        return Vec::new();
    };
    if o.kind != LbKind::Nlb || spec.external_traffic_policy == TrafficPolicy::Local {
        return Vec::new();
    }
    let h = &o.health_check;
    [
        (h.protocol.is_some(), annotations::HC_PROTOCOL),
        (h.port.is_some(), annotations::HC_PORT),
        (h.path.is_some(), annotations::HC_PATH),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .map(|(_, key)| {
        format!(
            "{} has no effect on this NLB: the gateway's shared health probe checks kube-proxy (HTTP on port {}, {}) for every Service with externalTrafficPolicy Cluster, as cloud-provider-aws's Shared probe mode does; set externalTrafficPolicy: Local or turn the shared probe off to choose the check",
            annotations::short(key),
            probe.port,
            probe.path
        )
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_balancers::test_support::{port, spec};
    use ccm_provider::Protocol;

    #[test]
    fn local_traffic_checks_healthz_on_the_health_check_node_port_with_upstreams_defaults() {
        let mut s = spec(vec![port("", Protocol::Tcp, 80, 30080)]);
        s.external_traffic_policy = TrafficPolicy::Local;
        s.health_check_node_port = 32000;
        let nlb = LbOptions {
            kind: LbKind::Nlb,
            ..Default::default()
        };
        let hc = health_check(&s, &nlb, None).unwrap();
        assert_eq!(hc.protocol, HcProtocol::Http);
        assert_eq!(hc.port, HcPort::Port(32000));
        assert_eq!(hc.own_port(), Some(32000));
        assert_eq!(hc.path.as_deref(), Some("/healthz"));
        assert_eq!(
            (hc.interval, hc.healthy, hc.unhealthy, hc.timeout),
            (10, 2, 2, 6)
        );
        s.external_traffic_policy = TrafficPolicy::Cluster;
        let hc = health_check(&s, &nlb, None).unwrap();
        assert_eq!(hc.protocol, HcProtocol::Tcp);
        assert_eq!(hc.port, HcPort::TrafficPort);
        assert_eq!(hc.own_port(), None);
        assert_eq!(hc.path, None);
        assert_eq!(
            (hc.interval, hc.healthy, hc.unhealthy, hc.timeout),
            (30, 3, 3, 10)
        );
        let classic = health_check(&s, &LbOptions::default(), None).unwrap();
        assert_eq!(
            (
                classic.healthy,
                classic.unhealthy,
                classic.timeout,
                classic.interval
            ),
            (2, 6, 5, 10)
        );
    }

    #[test]
    fn the_shared_probe_checks_kube_proxy_for_cluster_policy_services() {
        let probe = SharedProbe {
            port: 10256,
            path: "/healthz".into(),
        };
        let mut s = spec(vec![port("", Protocol::Tcp, 80, 30080)]);
        let mut nlb = LbOptions {
            kind: LbKind::Nlb,
            ..Default::default()
        };
        nlb.health_check.port = Some(HcPort::TrafficPort);
        nlb.health_check.interval = Some(20);
        let hc = health_check(&s, &nlb, Some(&probe)).unwrap();
        assert_eq!(hc.protocol, HcProtocol::Http);
        assert_eq!(hc.own_port(), Some(10256));
        assert_eq!(hc.path.as_deref(), Some("/healthz"));
        assert_eq!((hc.interval, hc.healthy, hc.timeout), (20, 3, 6));
        let notes = shared_probe_overrides(&s, &nlb, Some(&probe));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("aws-load-balancer-healthcheck-port has no effect"),
            "{notes:?}"
        );

        // A Classic ELB's annotations still win over the shared probe.
        let mut classic = LbOptions::default();
        classic.health_check.port = Some(HcPort::Port(8080));
        let hc = health_check(&s, &classic, Some(&probe)).unwrap();
        assert_eq!((hc.protocol, hc.own_port()), (HcProtocol::Http, Some(8080)));
        assert!(shared_probe_overrides(&s, &classic, Some(&probe)).is_empty());

        // Local traffic keeps its own check.
        s.external_traffic_policy = TrafficPolicy::Local;
        s.health_check_node_port = 32000;
        let hc = health_check(&s, &nlb, Some(&probe)).unwrap();
        assert_eq!(
            hc.port,
            HcPort::TrafficPort,
            "the annotation, as without the probe"
        );
        assert!(shared_probe_overrides(&s, &nlb, Some(&probe)).is_empty());
    }
}
