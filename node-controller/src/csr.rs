//! The decisions on kubelet serving certificate requests, as pure
//! functions: what a CSR asks, read and checked on its own
//! ([`examine`]), then against the cloud's word on the node's instance
//! ([`against_instance`]). Nothing here reads the cluster or the cloud:
//! the loop that does hands both in. A CSR is approved only when every
//! rule holds; a rule broken for certain is a denial with a reason a person
//! reads; whatever the cloud could not answer is no decision at all.

use std::net::IpAddr;

use ccm_proto::v1::{Instance, InstanceState, NodeAddressType};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_PKCS1_RSAENCRYPTION, OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME,
};
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;

/// The only signer whose requests are judged; every other is never
/// touched.
pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The group every kubelet's identity is in.
pub const NODES_GROUP: &str = "system:nodes";
/// The prefix of a kubelet's user name and certificate common name.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// A rule broken for certain: the CSR is denied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// A short name for metrics and the condition's reason.
    pub reason: &'static str,
    /// What is wrong, for a person.
    pub message: String,
}

fn deny(reason: &'static str, message: impl Into<String>) -> Denial {
    Denial {
        reason,
        message: message.into(),
    }
}

/// What an honest-looking CSR asks for: a serving certificate for `node`
/// with these addresses and names, still to be checked against the cloud.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub node: String,
    pub ips: Vec<IpAddr>,
    pub dns: Vec<String>,
}

/// The CSR's fields `examine` reads, as kube-apiserver stored them (the
/// requester fields come from the authenticated user, never from the
/// client).
#[derive(Clone, Copy, Debug)]
pub struct Spec<'a> {
    pub username: &'a str,
    pub groups: &'a [String],
    pub usages: &'a [String],
    /// The PEM text of the PKCS#10 request.
    pub request: &'a [u8],
}

/// Reads a CSR of [`SIGNER`] on its own: the requester is the kubelet of
/// the node the certificate names, the request is one PKCS#10 block whose
/// signature verifies, its subject is exactly `CN=system:node:<name>,
/// O=system:nodes`, its usages exactly a server's (`key encipherment` only
/// with an RSA key, never `client auth`), and it names at least one
/// address or DNS name and nothing else.
pub fn examine(spec: Spec<'_>) -> Result<Request, Denial> {
    let node = spec
        .username
        .strip_prefix(NODE_USER_PREFIX)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            deny(
                "RequesterNotANode",
                format!(
                    "requested by {:?}, not by a node (system:node:<name>)",
                    spec.username
                ),
            )
        })?;
    if !spec.groups.iter().any(|g| g == NODES_GROUP) {
        return Err(deny(
            "RequesterNotANode",
            format!(
                "requested by {:?} outside the group {NODES_GROUP}",
                spec.username
            ),
        ));
    }
    let der = one_request_block(spec.request)?;
    let (rest, csr) = X509CertificationRequest::from_der(&der).map_err(|_| {
        deny(
            "Unreadable",
            "the request is not a PKCS#10 certificate request",
        )
    })?;
    if !rest.is_empty() {
        return Err(deny("Unreadable", "the request has bytes after its end"));
    }
    csr.verify_signature().map_err(|_| {
        deny(
            "BadSignature",
            "the request's signature does not verify with its own key",
        )
    })?;
    check_subject(&csr, node)?;
    let rsa = csr
        .certification_request_info
        .subject_pki
        .algorithm
        .algorithm
        == OID_PKCS1_RSAENCRYPTION;
    check_usages(spec.usages, rsa)?;
    let (ips, dns) = names(&csr)?;
    if ips.is_empty() && dns.is_empty() {
        return Err(deny("NoNames", "the request names no address or DNS name"));
    }
    Ok(Request {
        node: node.to_owned(),
        ips,
        dns,
    })
}

/// The DER of the one PEM block `pem` holds, a certificate request.
fn one_request_block(pem: &[u8]) -> Result<Vec<u8>, Denial> {
    let blocks: Vec<Pem> = Pem::iter_from_buffer(pem)
        .collect::<Result<_, _>>()
        .map_err(|_| deny("Unreadable", "the request is not PEM"))?;
    match blocks.as_slice() {
        [one] if one.label == "CERTIFICATE REQUEST" => Ok(one.contents.clone()),
        [one] => Err(deny(
            "Unreadable",
            format!(
                "the request's PEM block is a {:?}, not a CERTIFICATE REQUEST",
                one.label
            ),
        )),
        blocks => Err(deny(
            "Unreadable",
            format!("the request holds {} PEM blocks, not one", blocks.len()),
        )),
    }
}

fn check_subject(csr: &X509CertificationRequest<'_>, node: &str) -> Result<(), Denial> {
    let want_cn = format!("{NODE_USER_PREFIX}{node}");
    let mut cn = None;
    let mut o = None;
    for attr in csr.certification_request_info.subject.iter_attributes() {
        let value = attr.as_str().ok();
        if attr.attr_type() == &OID_X509_COMMON_NAME && cn.is_none() {
            cn = value;
        } else if attr.attr_type() == &OID_X509_ORGANIZATION_NAME && o.is_none() {
            o = value;
        } else {
            return Err(deny(
                "WrongSubject",
                format!(
                    "the subject {} has more than CN={want_cn}, O={NODES_GROUP}",
                    csr.certification_request_info.subject
                ),
            ));
        }
    }
    if cn != Some(want_cn.as_str()) || o != Some(NODES_GROUP) {
        return Err(deny(
            "WrongSubject",
            format!(
                "the subject is {}, not CN={want_cn}, O={NODES_GROUP}",
                csr.certification_request_info.subject
            ),
        ));
    }
    Ok(())
}

fn check_usages(usages: &[String], rsa: bool) -> Result<(), Denial> {
    let allowed = |u: &str| {
        matches!(u, "digital signature" | "server auth") || (rsa && u == "key encipherment")
    };
    if let Some(other) = usages.iter().find(|u| !allowed(u)) {
        return Err(deny(
            "WrongUsages",
            format!("a serving certificate has no usage {other:?}"),
        ));
    }
    for needed in ["digital signature", "server auth"] {
        if !usages.iter().any(|u| u == needed) {
            return Err(deny(
                "WrongUsages",
                format!("a serving certificate needs the usage {needed:?}"),
            ));
        }
    }
    Ok(())
}

/// The request's IP and DNS names; any other kind is a denial.
fn names(csr: &X509CertificationRequest<'_>) -> Result<(Vec<IpAddr>, Vec<String>), Denial> {
    let mut ips = Vec::new();
    let mut dns = Vec::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        let ParsedExtension::SubjectAlternativeName(san) = ext else {
            continue;
        };
        for name in &san.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push(d.to_ascii_lowercase()),
                GeneralName::IPAddress(bytes) => ips.push(ip(bytes)?),
                GeneralName::RFC822Name(_) => {
                    return Err(deny(
                        "ForbiddenName",
                        "a serving certificate names no email address",
                    ));
                }
                GeneralName::URI(_) => {
                    return Err(deny("ForbiddenName", "a serving certificate names no URI"));
                }
                other => {
                    return Err(deny(
                        "ForbiddenName",
                        format!(
                            "a serving certificate names only addresses and DNS names, not {other}"
                        ),
                    ));
                }
            }
        }
    }
    Ok((ips, dns))
}

fn ip(bytes: &[u8]) -> Result<IpAddr, Denial> {
    match bytes.len() {
        4 => Ok(IpAddr::from(<[u8; 4]>::try_from(bytes).unwrap_or_default())),
        16 => Ok(IpAddr::from(
            <[u8; 16]>::try_from(bytes).unwrap_or_default(),
        )),
        n => Err(deny("ForbiddenName", format!("an IP address of {n} bytes"))),
    }
}

/// What the cloud's answer about the node's instance makes of `request`:
/// approved (`Ok`) only when the instance runs, is the one the Node names
/// (`node_provider_id`), and every address and name the request asks for
/// is one the cloud gives the instance (addresses as IPs, DNS names and
/// the hostname as names: never what the Node's status says, which the
/// kubelet writes).
pub fn against_instance(
    request: &Request,
    node_provider_id: &str,
    state: InstanceState,
    instance: Option<&Instance>,
) -> Result<(), Denial> {
    let instance = match (state, instance) {
        (InstanceState::Running, Some(i)) => i,
        (InstanceState::NotFound, _) => {
            return Err(deny(
                "NoInstance",
                format!("node {} has no instance in the cloud", request.node),
            ));
        }
        _ => {
            return Err(deny(
                "InstanceNotRunning",
                format!("the instance of node {} is not running", request.node),
            ));
        }
    };
    if node_provider_id.is_empty() || instance.provider_id != node_provider_id {
        return Err(deny(
            "OtherInstance",
            format!(
                "node {} names {node_provider_id:?}, the cloud's instance is {:?}",
                request.node, instance.provider_id
            ),
        ));
    }
    let kind = |a: &ccm_proto::v1::NodeAddress| NodeAddressType::try_from(a.r#type).ok();
    let ips: Vec<IpAddr> = instance
        .addresses
        .iter()
        .filter(|a| {
            matches!(
                kind(a),
                Some(NodeAddressType::InternalIp | NodeAddressType::ExternalIp)
            )
        })
        .filter_map(|a| a.address.parse().ok())
        .collect();
    let dns: Vec<String> = instance
        .addresses
        .iter()
        .filter(|a| {
            matches!(
                kind(a),
                Some(
                    NodeAddressType::InternalDns
                        | NodeAddressType::ExternalDns
                        | NodeAddressType::Hostname
                )
            )
        })
        .map(|a| a.address.to_ascii_lowercase())
        .collect();
    if let Some(foreign) = request.ips.iter().find(|ip| !ips.contains(ip)) {
        return Err(deny(
            "ForeignAddress",
            format!(
                "{foreign} is not an address of node {}'s instance",
                request.node
            ),
        ));
    }
    if let Some(foreign) = request.dns.iter().find(|d| !dns.contains(d)) {
        return Err(deny(
            "ForeignName",
            format!(
                "{foreign} is not a DNS name of node {}'s instance",
                request.node
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_proto::v1::NodeAddress;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    const NODE: &str = "ip-10-0-1-5.ec2.internal";

    /// A CSR as an honest kubelet makes it, changed by `change`.
    fn pem(change: impl FnOnce(&mut CertificateParams)) -> String {
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, format!("system:node:{NODE}"));
        p.distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        p.subject_alt_names = vec![
            SanType::DnsName(NODE.try_into().unwrap()),
            SanType::IpAddress("10.0.1.5".parse().unwrap()),
        ];
        change(&mut p);
        let key = KeyPair::generate().unwrap();
        p.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn judge(
        username: &str,
        groups: &[&str],
        usages: &[&str],
        request: &str,
    ) -> Result<Request, Denial> {
        let groups = strings(groups);
        let usages = strings(usages);
        examine(Spec {
            username,
            groups: &groups,
            usages: &usages,
            request: request.as_bytes(),
        })
    }

    const USER: &str = "system:node:ip-10-0-1-5.ec2.internal";
    const GROUPS: &[&str] = &["system:nodes", "system:authenticated"];
    const USAGES: &[&str] = &["digital signature", "server auth"];

    #[test]
    fn an_honest_kubelets_request_is_read_whole() {
        let request = judge(USER, GROUPS, USAGES, &pem(|_| {})).unwrap();
        assert_eq!(request.node, NODE);
        assert_eq!(request.ips, ["10.0.1.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(request.dns, [NODE]);
    }

    #[test]
    fn each_broken_rule_is_a_denial_with_its_reason() {
        let honest = pem(|_| {});
        let cases: Vec<(&str, Result<Request, Denial>)> = vec![
            (
                "RequesterNotANode",
                judge(
                    "system:serviceaccount:kube-system:x",
                    &["system:serviceaccounts"],
                    USAGES,
                    &honest,
                ),
            ),
            (
                "RequesterNotANode",
                judge(USER, &["system:authenticated"], USAGES, &honest),
            ),
            (
                "WrongSubject",
                judge("system:node:other", GROUPS, USAGES, &honest),
            ),
            (
                "WrongUsages",
                judge(
                    USER,
                    GROUPS,
                    &["digital signature", "server auth", "client auth"],
                    &honest,
                ),
            ),
            (
                "WrongUsages",
                judge(
                    USER,
                    GROUPS,
                    &["digital signature", "key encipherment", "server auth"],
                    &honest,
                ),
            ),
            (
                "WrongUsages",
                judge(USER, GROUPS, &["digital signature"], &honest),
            ),
            (
                "Unreadable",
                judge(USER, GROUPS, USAGES, &format!("{honest}{honest}")),
            ),
            ("Unreadable", judge(USER, GROUPS, USAGES, "not pem")),
            (
                "WrongSubject",
                judge(
                    USER,
                    GROUPS,
                    USAGES,
                    &pem(|p| {
                        p.distinguished_name
                            .push(DnType::OrganizationalUnitName, "extra");
                    }),
                ),
            ),
            (
                "WrongSubject",
                judge(
                    USER,
                    GROUPS,
                    USAGES,
                    &pem(|p| {
                        p.distinguished_name = DistinguishedName::new();
                        p.distinguished_name
                            .push(DnType::CommonName, format!("system:node:{NODE}"));
                    }),
                ),
            ),
            (
                "ForbiddenName",
                judge(
                    USER,
                    GROUPS,
                    USAGES,
                    &pem(|p| {
                        p.subject_alt_names
                            .push(SanType::Rfc822Name("a@b.c".try_into().unwrap()));
                    }),
                ),
            ),
            (
                "ForbiddenName",
                judge(
                    USER,
                    GROUPS,
                    USAGES,
                    &pem(|p| {
                        p.subject_alt_names
                            .push(SanType::URI("spiffe://x/y".try_into().unwrap()));
                    }),
                ),
            ),
            (
                "NoNames",
                judge(USER, GROUPS, USAGES, &pem(|p| p.subject_alt_names.clear())),
            ),
        ];
        for (i, (reason, got)) in cases.into_iter().enumerate() {
            let denial = got.expect_err(&format!("case {i} must be denied"));
            assert_eq!(denial.reason, reason, "case {i}: {}", denial.message);
        }
    }

    #[test]
    fn an_rsa_key_may_ask_for_key_encipherment_too() {
        // Made with `openssl req -newkey rsa:2048`, as kubelets with RSA
        // keys ask.
        let rsa = include_str!("testdata/rsa-serving-csr.pem");
        let usages = ["digital signature", "key encipherment", "server auth"];
        let request = judge(USER, GROUPS, &usages, rsa).unwrap();
        assert_eq!(request.dns, [NODE]);
        assert!(judge(USER, GROUPS, USAGES, rsa).is_ok());
    }

    #[test]
    fn a_request_whose_signature_does_not_verify_is_denied() {
        let honest = pem(|_| {});
        let block = Pem::iter_from_buffer(honest.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let mut der = block.contents.clone();
        // The signature is last: flip its final byte.
        *der.last_mut().unwrap() ^= 0x01;
        let tampered = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            data_encoding::BASE64.encode(&der)
        );
        let denial = judge(USER, GROUPS, USAGES, &tampered).unwrap_err();
        assert_eq!(denial.reason, "BadSignature", "{}", denial.message);
    }

    fn instance(provider_id: &str, addresses: &[(NodeAddressType, &str)]) -> Instance {
        Instance {
            provider_id: provider_id.into(),
            addresses: addresses
                .iter()
                .map(|(t, a)| NodeAddress {
                    r#type: *t as i32,
                    address: a.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_cloud_decides_every_address_and_name() {
        let id = "aws:///eu-west-1a/i-1";
        let request = judge(USER, GROUPS, USAGES, &pem(|_| {})).unwrap();
        let cloud = instance(
            id,
            &[
                (NodeAddressType::InternalIp, "10.0.1.5"),
                (NodeAddressType::InternalDns, NODE),
            ],
        );
        assert_eq!(
            against_instance(&request, id, InstanceState::Running, Some(&cloud)),
            Ok(())
        );
        let reason = |r: Result<(), Denial>| r.unwrap_err().reason;
        // Another node's address, a name not the instance's.
        let other = instance(
            id,
            &[
                (NodeAddressType::InternalIp, "10.0.1.6"),
                (NodeAddressType::InternalDns, NODE),
            ],
        );
        assert_eq!(
            reason(against_instance(
                &request,
                id,
                InstanceState::Running,
                Some(&other)
            )),
            "ForeignAddress"
        );
        let renamed = instance(
            id,
            &[
                (NodeAddressType::InternalIp, "10.0.1.5"),
                (NodeAddressType::InternalDns, "x.internal"),
            ],
        );
        assert_eq!(
            reason(against_instance(
                &request,
                id,
                InstanceState::Running,
                Some(&renamed)
            )),
            "ForeignName"
        );
        // The address given as a name does not count as an address.
        let as_name = instance(
            id,
            &[
                (NodeAddressType::Hostname, "10.0.1.5"),
                (NodeAddressType::InternalDns, NODE),
            ],
        );
        assert_eq!(
            reason(against_instance(
                &request,
                id,
                InstanceState::Running,
                Some(&as_name)
            )),
            "ForeignAddress"
        );
        // Gone, stopped, another instance.
        assert_eq!(
            reason(against_instance(
                &request,
                id,
                InstanceState::NotFound,
                None
            )),
            "NoInstance"
        );
        assert_eq!(
            reason(against_instance(
                &request,
                id,
                InstanceState::Shutdown,
                Some(&cloud)
            )),
            "InstanceNotRunning"
        );
        assert_eq!(
            reason(against_instance(
                &request,
                "aws:///eu-west-1a/i-2",
                InstanceState::Running,
                Some(&cloud)
            )),
            "OtherInstance"
        );
        assert_eq!(
            reason(against_instance(
                &request,
                "",
                InstanceState::Running,
                Some(&cloud)
            )),
            "OtherInstance"
        );
    }
}
