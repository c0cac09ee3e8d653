//! An NLB's listeners: which the Service's ports call for (one per port
//! number, TCP and UDP on one number sharing a TCP_UDP listener, TLS where
//! the certificate annotations ask), and bringing the NLB's listeners to
//! them, each forwarding to its target group.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, Listener, ProtocolEnum,
};
use ccm_provider::{CloudError, LoadBalancerSpec, Protocol, Result};

use super::ingress_rules::Opening;
use crate::annotations::{self, BackendProtocol, LbOptions, TlsPorts};
use crate::{AwsCloud, errors};

/// The most listeners one NLB has (an AWS quota).
const MAX_LISTENERS: usize = 50;
/// The TLS policy of a new TLS listener when the Service names none (an
/// existing one keeps its own, so an adopted listener's clients are not
/// cut off).
const DEFAULT_TLS_POLICY: &str = "ELBSecurityPolicy-TLS13-1-2-2021-06";

/// One listener and its target group.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Listening {
    pub(super) port: i32,
    pub(super) listener: ProtocolEnum,
    pub(super) target: ProtocolEnum,
    pub(super) node_port: i32,
    pub(super) tls: bool,
}

impl Listening {
    /// The port clients reach, with its IP protocols.
    pub(super) fn client_opening(&self) -> Opening {
        Opening {
            port: self.port,
            protocols: ip_protocols(&self.listener),
        }
    }

    /// The node port the NLB reaches, with its IP protocols.
    pub(super) fn node_opening(&self) -> Opening {
        Opening {
            port: self.node_port,
            protocols: ip_protocols(&self.target),
        }
    }
}

/// The IP protocols a listener or target protocol carries, as security
/// group rules name them.
fn ip_protocols(p: &ProtocolEnum) -> &'static [&'static str] {
    match p {
        ProtocolEnum::Udp => &["udp"],
        ProtocolEnum::TcpUdp => &["tcp", "udp"],
        _ => &["tcp"],
    }
}

/// One Service port: protocol, node port, name.
type PortEntry<'a> = (Protocol, i32, &'a str);

/// The listeners of `spec`: TCP and UDP ports with the same number share
/// one TCP_UDP listener.
pub(super) fn listenings(spec: &LoadBalancerSpec, o: &LbOptions) -> Result<Vec<Listening>> {
    let mut out = Vec::new();
    for (port, entries) in ports_by_number(spec)? {
        out.push(listening(port, &entries, o)?);
    }
    check_tls_ports_exist(spec, o)?;
    let udp = |l: &Listening| matches!(l.target, ProtocolEnum::Udp | ProtocolEnum::TcpUdp);
    if o.target_group_attributes.preserve_client_ip == Some(false) && out.iter().any(udp) {
        return Err(CloudError::invalid(
            annotations::field(annotations::TARGET_GROUP_ATTRIBUTES),
            "preserve_client_ip.enabled=false: AWS keeps client addresses on UDP target groups, and the Service has a UDP port",
        ));
    }
    Ok(out)
}

/// The Service's ports by number, refusing what an NLB cannot carry.
fn ports_by_number(spec: &LoadBalancerSpec) -> Result<BTreeMap<i32, Vec<PortEntry<'_>>>> {
    let mut by_port: BTreeMap<i32, Vec<PortEntry<'_>>> = BTreeMap::new();
    for p in &spec.ports {
        let protocol = p.protocol;
        if protocol == Protocol::Sctp {
            return Err(CloudError::invalid(
                "spec.ports",
                format!("port {}: NLBs do not carry SCTP", p.port),
            ));
        }
        if p.node_port == 0 {
            return Err(CloudError::invalid(
                "spec.ports",
                format!(
                    "port {}: has no node port; NLB instance targets need one (allocateLoadBalancerNodePorts must not be false)",
                    p.port
                ),
            ));
        }
        by_port
            .entry(p.port)
            .or_default()
            .push((protocol, p.node_port, p.name.as_str()));
    }
    if by_port.len() > MAX_LISTENERS {
        return Err(CloudError::invalid(
            "spec.ports",
            format!(
                "{} distinct ports; an NLB has at most {MAX_LISTENERS} listeners",
                by_port.len()
            ),
        ));
    }
    Ok(by_port)
}

/// The listener on `port` for the Service ports `entries` with that number.
fn listening(port: i32, entries: &[PortEntry<'_>], o: &LbOptions) -> Result<Listening> {
    let node_ports: BTreeSet<i32> = entries.iter().map(|e| e.1).collect();
    let has = |p: Protocol| entries.iter().any(|e| e.0 == p);
    let (listener, target) = match (has(Protocol::Tcp), has(Protocol::Udp)) {
        (true, true) => {
            if node_ports.len() > 1 {
                return Err(CloudError::invalid(
                    "spec.ports",
                    format!(
                        "port {port}: TCP and UDP share one NLB listener (TCP_UDP), so they need the same node port, not {node_ports:?}"
                    ),
                ));
            }
            (ProtocolEnum::TcpUdp, ProtocolEnum::TcpUdp)
        }
        (false, true) => (ProtocolEnum::Udp, ProtocolEnum::Udp),
        _ => (ProtocolEnum::Tcp, ProtocolEnum::Tcp),
    };
    let tls = entries
        .iter()
        .any(|(_, _, name)| is_tls_port(o, port, name));
    if tls && listener != ProtocolEnum::Tcp {
        return Err(CloudError::invalid(
            annotations::field(annotations::SSL_PORTS),
            format!("port {port} carries UDP; only TCP ports can be TLS listeners"),
        ));
    }
    // Behind a TLS listener, `ssl` re-encrypts to the targets, as upstream.
    let target = if tls && o.backend_protocol == Some(BackendProtocol::Ssl) {
        ProtocolEnum::Tls
    } else {
        target
    };
    Ok(Listening {
        port,
        listener: if tls { ProtocolEnum::Tls } else { listener },
        target,
        node_port: entries[0].1,
        tls,
    })
}

/// Whether the TLS annotations name the port `port` called `name`.
pub(super) fn is_tls_port(o: &LbOptions, port: i32, name: &str) -> bool {
    match o.tls.as_ref().map(|t| &t.ports) {
        None => false,
        Some(TlsPorts::All) => true,
        Some(TlsPorts::Some(list)) => list
            .iter()
            .any(|p| p == name || p.parse::<i32>() == Ok(port)),
    }
}

/// Refuses a TLS port, by name or number, that the Service does not have.
pub(super) fn check_tls_ports_exist(spec: &LoadBalancerSpec, o: &LbOptions) -> Result<()> {
    let Some(TlsPorts::Some(list)) = o.tls.as_ref().map(|t| &t.ports) else {
        return Ok(());
    };
    for wanted in list {
        let known = spec
            .ports
            .iter()
            .any(|p| &p.name == wanted || wanted.parse::<i32>() == Ok(p.port));
        if !known {
            return Err(CloudError::invalid(
                annotations::field(annotations::SSL_PORTS),
                format!("{wanted:?} names no port of the Service"),
            ));
        }
    }
    Ok(())
}

/// The certificate and policy of the NLB's TLS listeners, when it has any.
struct TlsSettings {
    certificate_arn: Option<String>,
    certificates: Option<Vec<Certificate>>,
    /// The policy the Service names, if any.
    policy: Option<String>,
}

impl TlsSettings {
    /// The certificate and policy `o` asks for.
    fn of(o: &LbOptions) -> Self {
        Self {
            certificate_arn: o.tls.as_ref().map(|t| t.certificate_arn.clone()),
            certificates: o.tls.as_ref().map(|t| {
                vec![
                    Certificate::builder()
                        .certificate_arn(&t.certificate_arn)
                        .build(),
                ]
            }),
            policy: o.tls.as_ref().and_then(|t| t.policy.clone()),
        }
    }

    /// The policy of a TLS listener replacing `existing`: the one the
    /// Service names, else the one it has, else the default.
    fn policy_for(&self, existing: Option<&Listener>) -> String {
        self.policy
            .clone()
            .or_else(|| existing.and_then(|x| x.ssl_policy()).map(str::to_owned))
            .unwrap_or_else(|| DEFAULT_TLS_POLICY.to_owned())
    }

    /// Whether `listener` is already what `l` asks for.
    fn up_to_date(&self, listener: &Listener, l: &Listening, target_group: &str) -> bool {
        let targets_ok = listener
            .default_actions()
            .iter()
            .any(|a| a.target_group_arn() == Some(target_group));
        let cert_ok = !l.tls
            || (listener
                .certificates()
                .first()
                .and_then(|c| c.certificate_arn())
                == self.certificate_arn.as_deref()
                && listener.ssl_policy().is_some()
                && self
                    .policy
                    .as_deref()
                    .is_none_or(|p| listener.ssl_policy() == Some(p)));
        listener.protocol() == Some(&l.listener) && targets_ok && cert_ok
    }
}

/// The target groups `listeners` forward to.
pub(super) fn forwarded_groups(listeners: &[Listener]) -> Vec<String> {
    listeners
        .iter()
        .flat_map(|l| l.default_actions())
        .filter_map(|a| a.target_group_arn().map(str::to_owned))
        .collect()
}

/// The action that forwards to `target_group`.
fn forward(target_group: &str) -> Action {
    Action::builder()
        .r#type(ActionTypeEnum::Forward)
        .target_group_arn(target_group)
        .build()
}

impl AwsCloud {
    /// The listeners of the load balancer `arn`.
    pub(super) async fn listeners_of(&self, arn: &str) -> Result<Vec<Listener>> {
        Ok(self
            .elb
            .describe_listeners()
            .load_balancer_arn(arn)
            .send()
            .await
            .map_err(|e| errors::cloud_error("DescribeListeners", e))?
            .listeners()
            .to_vec())
    }

    /// Listeners as wanted: each forwards to its target group; others go.
    /// Returns the target groups the listeners forwarded to before.
    pub(super) async fn sync_listeners(
        &self,
        arn: &str,
        wanted: &[(Listening, String)],
        o: &LbOptions,
    ) -> Result<BTreeSet<String>> {
        let listeners = self.listeners_of(arn).await?;
        let before: BTreeSet<String> = forwarded_groups(&listeners).into_iter().collect();
        let tls = TlsSettings::of(o);
        for (l, tg) in wanted {
            match listeners.iter().find(|x| x.port() == Some(l.port)) {
                Some(x) if tls.up_to_date(x, l, tg) => {}
                Some(x) => self.modify_listener(x, l, tg, &tls).await?,
                None => self.create_listener(arn, l, tg, &tls).await?,
            }
        }
        for x in &listeners {
            if !wanted.iter().any(|(l, _)| x.port() == Some(l.port)) {
                self.delete_listener(x).await?;
            }
        }
        Ok(before)
    }

    /// Brings `listener` to what `l` asks, forwarding to `target_group`.
    async fn modify_listener(
        &self,
        listener: &Listener,
        l: &Listening,
        target_group: &str,
        tls: &TlsSettings,
    ) -> Result<()> {
        let mut m = self
            .elb
            .modify_listener()
            .listener_arn(listener.listener_arn().unwrap_or_default())
            // Only a change is sent: the port is the same by construction.
            .set_protocol((listener.protocol() != Some(&l.listener)).then(|| l.listener.clone()))
            .default_actions(forward(target_group));
        if l.tls {
            m = m
                .set_certificates(tls.certificates.clone())
                .ssl_policy(tls.policy_for(Some(listener)));
        }
        m.send()
            .await
            .map_err(|e| errors::cloud_error("ModifyListener", e))?;
        Ok(())
    }

    /// A new listener on the NLB `arn` as `l` asks, forwarding to
    /// `target_group`.
    async fn create_listener(
        &self,
        arn: &str,
        l: &Listening,
        target_group: &str,
        tls: &TlsSettings,
    ) -> Result<()> {
        let mut c = self
            .elb
            .create_listener()
            .load_balancer_arn(arn)
            .protocol(l.listener.clone())
            .port(l.port)
            .default_actions(forward(target_group));
        if l.tls {
            c = c
                .set_certificates(tls.certificates.clone())
                .ssl_policy(tls.policy_for(None));
        }
        c.send()
            .await
            .map_err(|e| errors::cloud_error("CreateListener", e))?;
        Ok(())
    }

    /// Deletes `listener`; one already gone is fine.
    async fn delete_listener(&self, listener: &Listener) -> Result<()> {
        match self
            .elb
            .delete_listener()
            .listener_arn(listener.listener_arn().unwrap_or_default())
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if errors::code(&e) == Some("ListenerNotFound") => Ok(()),
            Err(e) => Err(errors::cloud_error("DeleteListener", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_balancers::test_support::{port, spec};

    #[test]
    fn tcp_and_udp_on_one_port_share_a_tcp_udp_listener() {
        let s = spec(vec![
            port("dns-tcp", Protocol::Tcp, 53, 30053),
            port("dns-udp", Protocol::Udp, 53, 30053),
            port("web", Protocol::Tcp, 80, 30080),
        ]);
        let ls = listenings(&s, &LbOptions::default()).unwrap();
        assert_eq!(ls.len(), 2);
        assert_eq!(ls[0].listener, ProtocolEnum::TcpUdp);
        assert_eq!(ls[1].listener, ProtocolEnum::Tcp);
        assert_eq!(ls[0].client_opening().protocols, ["tcp", "udp"]);
        assert_eq!(ls[1].node_opening().port, 30080);
    }

    #[test]
    fn ports_an_nlb_cannot_carry_are_refused_with_why() {
        let sctp = spec(vec![port("", Protocol::Sctp, 9, 30009)]);
        assert!(listenings(&sctp, &LbOptions::default()).is_err());
        let split = spec(vec![
            port("a", Protocol::Tcp, 53, 30053),
            port("b", Protocol::Udp, 53, 30054),
        ]);
        let err = listenings(&split, &LbOptions::default()).unwrap_err();
        assert!(err.to_string().contains("same node port"), "{err}");
        let many = spec(
            (1..=51)
                .map(|p| port("", Protocol::Tcp, p, 30000 + p))
                .collect(),
        );
        let err = listenings(&many, &LbOptions::default()).unwrap_err();
        assert!(err.to_string().contains("at most 50 listeners"), "{err}");
    }
}
