//! Callers known by their client certificate (mutual TLS): the TLS
//! handshake verified the chain against the client CA bundle; here the
//! certificate's identity is mapped to a role through
//! `--client-cert-roles`. Tools that can only present a certificate
//! (Cluster Autoscaler's external gRPC client) come in this way, with no
//! token.
//!
//! A certificate names one identity, read as SPIFFE reads an X.509-SVID:
//! its one URI SAN (`spiffe://<trust domain>/ns/<namespace>/sa/<name>`),
//! matched exactly. A certificate with several URI SANs names no one and
//! is refused, whatever else it carries, so no order of the configuration
//! decides who it is. Only a certificate with no URI SAN at all is known by
//! its subject's common name, and only when the operator mapped that
//! `CN=`: a certificate issued for a URI (SPIRE's, whose CN is a DNS name)
//! is never taken for a CN someone else was mapped by.

use crate::identity::{Caller, Role};

/// What a verified client certificate says of its holder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertIdentity {
    /// Its URI subject alternative names.
    pub uris: Vec<String>,
    /// Its subject's common names (one, in a well-formed certificate).
    pub common_names: Vec<String>,
}

impl CertIdentity {
    /// Reads a DER certificate; `None` for one that does not parse (the
    /// handshake verified it, so that does not happen in practice).
    pub fn from_der(der: &[u8]) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let uris = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|name| match name {
                        x509_parser::extensions::GeneralName::URI(uri) => Some((*uri).to_owned()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let common_names = cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok())
            .map(str::to_owned)
            .collect();
        Some(Self { uris, common_names })
    }

    /// How the certificate is named in refusals and logs.
    pub fn describe(&self) -> String {
        let mut names: Vec<String> = self.uris.clone();
        names.extend(self.common_names.iter().map(|cn| format!("CN={cn}")));
        if names.is_empty() {
            "a certificate with neither a URI SAN nor a common name".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// The one identity the certificate names: its URI SAN, or with none
    /// its common name. `Err` for a certificate that names several.
    fn identity(&self) -> Result<Option<Matcher>, String> {
        match (self.uris.as_slice(), self.common_names.as_slice()) {
            ([uri], _) => Ok(Some(Matcher::Uri(uri.clone()))),
            ([], [cn]) => Ok(Some(Matcher::CommonName(cn.clone()))),
            ([], []) => Ok(None),
            ([], many) => Err(format!(
                "the client certificate's subject carries {} common names ({}); an identity is one name",
                many.len(),
                self.describe()
            )),
            (many, _) => Err(format!(
                "the client certificate carries {} URI SANs ({}); an identity is exactly one",
                many.len(),
                self.describe()
            )),
        }
    }
}

/// One configured identity.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Matcher {
    Uri(String),
    CommonName(String),
}

impl Matcher {
    fn name(&self) -> String {
        match self {
            Self::Uri(uri) => uri.clone(),
            Self::CommonName(cn) => format!("CN={cn}"),
        }
    }
}

/// Which certificate identities may call, with which role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientCertRoles {
    entries: Vec<(Matcher, Role)>,
}

impl ClientCertRoles {
    /// Reads `<identity>=<role>` entries, comma-separated; an identity is
    /// a URI (`spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler`)
    /// or `CN=<common name>`. Every problem is reported.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let mut entries: Vec<(Matcher, Role)> = Vec::new();
        let mut problems = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((identity, role)) = entry.rsplit_once('=') else {
                problems.push(format!(
                    "{entry:?}: use <identity>=<role>, the identity a URI SAN (spiffe://<trust domain>/ns/<namespace>/sa/<name>) or CN=<common name>"
                ));
                continue;
            };
            let matcher = if let Some(cn) = identity.strip_prefix("CN=") {
                (!cn.is_empty()).then(|| Matcher::CommonName(cn.to_owned()))
            } else {
                identity
                    .split_once("://")
                    .filter(|(scheme, rest)| {
                        !scheme.is_empty()
                            && !rest.is_empty()
                            && !identity.chars().any(char::is_whitespace)
                    })
                    .map(|_| Matcher::Uri(identity.to_owned()))
            };
            let Some(matcher) = matcher else {
                problems.push(format!(
                    "{identity:?}: not an identity; use a URI SAN (spiffe://<trust domain>/ns/<namespace>/sa/<name>) or CN=<common name>"
                ));
                continue;
            };
            match role.parse::<Role>() {
                Ok(role) => {
                    if entries.iter().any(|(m, _)| *m == matcher) {
                        problems.push(format!("{identity} appears twice"));
                    } else {
                        entries.push((matcher, role));
                    }
                }
                Err(e) => problems.push(format!("{entry:?}: {e}")),
            }
        }
        if problems.is_empty() {
            Ok(Self { entries })
        } else {
            Err(problems)
        }
    }

    /// Whether no identity is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller a certificate maps to: `Ok(None)` when its identity is
    /// mapped to no role, `Err` (why) for a certificate that names more
    /// than one identity.
    pub fn caller(&self, cert: &CertIdentity) -> Result<Option<Caller>, String> {
        let Some(identity) = cert.identity()? else {
            return Ok(None);
        };
        Ok(self
            .entries
            .iter()
            .find(|(matcher, _)| *matcher == identity)
            .map(|(matcher, role)| Caller {
                name: matcher.name(),
                role: *role,
            }))
    }
}

/// Whether a certificate of the client CA bundle `client_ca` (PEM) signed
/// the first certificate of `serving` (the serving chain, PEM): then every
/// certificate that CA issued for a server is also a client certificate
/// the gateway verifies. `false` for what does not parse (the TLS files
/// were loaded already, and name their own problems).
pub fn client_ca_signed_serving(client_ca: &[u8], serving: &[u8]) -> bool {
    let (Ok(cas), Ok(chain)) = (
        ccm_runtime::tls::certificates(client_ca, "the client CA"),
        ccm_runtime::tls::certificates(serving, "the serving certificate"),
    ) else {
        return false;
    };
    let Ok((_, leaf)) = x509_parser::parse_x509_certificate(&chain[0]) else {
        return false;
    };
    cas.iter().any(|ca| {
        x509_parser::parse_x509_certificate(ca).is_ok_and(|(_, ca)| {
            ca.subject() == leaf.issuer() && leaf.verify_signature(Some(ca.public_key())).is_ok()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUTOSCALER: &str = "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler";

    fn cert(uris: &[&str], cns: &[&str]) -> CertIdentity {
        CertIdentity {
            uris: uris.iter().map(|u| (*u).to_owned()).collect(),
            common_names: cns.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    #[test]
    fn a_certificate_maps_by_its_one_uri_or_with_none_its_common_name() {
        let roles =
            ClientCertRoles::parse(&format!("{AUTOSCALER}=node, CN=ops-console=admin")).unwrap();
        assert_eq!(
            roles.caller(&cert(&[AUTOSCALER], &["whatever"])),
            Ok(Some(Caller {
                name: AUTOSCALER.into(),
                role: Role::Node
            }))
        );
        assert_eq!(
            roles
                .caller(&cert(&[], &["ops-console"]))
                .unwrap()
                .map(|c| c.role),
            Some(Role::Admin)
        );
        let stranger = cert(
            &["spiffe://cluster.local/ns/default/sa/web"],
            &["ops-console-2"],
        );
        assert_eq!(roles.caller(&stranger), Ok(None));
        // A URI prefix, or the URI with more after it, is another identity.
        for near in [
            "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler/x",
            "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscale",
            "SPIFFE://cluster.local/ns/kube-system/sa/cluster-autoscaler",
        ] {
            assert_eq!(roles.caller(&cert(&[near], &[])), Ok(None), "{near}");
        }
    }

    #[test]
    fn a_mapped_common_name_means_nothing_on_a_certificate_with_a_uri() {
        // SPIRE's certificates carry a URI and a CN of their own choosing:
        // the URI is who they are, and it is mapped to nothing here.
        let roles = ClientCertRoles::parse("CN=cluster-autoscaler=autoscaler").unwrap();
        let spire = cert(
            &["spiffe://cluster.local/ns/default/sa/web"],
            &["cluster-autoscaler"],
        );
        assert_eq!(roles.caller(&spire), Ok(None));
        assert!(
            roles
                .caller(&cert(&[], &["cluster-autoscaler"]))
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn a_certificate_naming_several_identities_is_refused_whatever_is_mapped() {
        let roles = ClientCertRoles::parse(&format!(
            "{AUTOSCALER}=autoscaler,spiffe://cluster.local/ns/default/sa/web=node,CN=a=admin"
        ))
        .unwrap();
        for both in [
            [AUTOSCALER, "spiffe://cluster.local/ns/default/sa/web"],
            ["spiffe://cluster.local/ns/default/sa/web", AUTOSCALER],
        ] {
            let why = roles.caller(&cert(&both, &[])).unwrap_err();
            assert!(why.contains("2 URI SANs"), "{why}");
        }
        let why = roles.caller(&cert(&[], &["a", "b"])).unwrap_err();
        assert!(why.contains("2 common names"), "{why}");
    }

    #[test]
    fn every_problem_in_the_roles_is_reported() {
        let problems = ClientCertRoles::parse(&format!(
            "{AUTOSCALER}=node,{AUTOSCALER}=admin,nobody=node,CN==admin,CN=x=wizard,noequals"
        ))
        .unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(problems[0].contains("twice"), "{problems:?}");
        assert!(problems[3].contains("wizard"), "{problems:?}");
    }

    #[test]
    fn the_identity_is_read_from_a_real_certificate() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(AUTOSCALER).unwrap(),
        )];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "cluster-autoscaler");
        // A second CN, as an attribute of the same OID.
        params
            .distinguished_name
            .push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 3]), "other");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let identity = CertIdentity::from_der(cert.der()).unwrap();
        assert_eq!(identity.uris, vec![AUTOSCALER.to_owned()]);
        assert_eq!(identity.common_names, ["cluster-autoscaler", "other"]);
        assert_eq!(
            identity.describe(),
            format!("{AUTOSCALER}, CN=cluster-autoscaler, CN=other")
        );
    }

    #[test]
    fn a_client_ca_that_signed_the_serving_certificate_is_found() {
        let ca = |name: &str| {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap()
        };
        let (serving_ca, client_ca) = (ca("serving"), ca("clients"));
        // Another CA of the same name, whose key signed nothing here.
        let namesake = ca("serving");
        let key = rcgen::KeyPair::generate().unwrap();
        let serving = rcgen::CertificateParams::new(vec!["gw.svc".to_owned()])
            .unwrap()
            .signed_by(&key, &serving_ca)
            .unwrap()
            .pem();
        let bundle = |cas: &[&rcgen::CertifiedIssuer<'_, rcgen::KeyPair>]| {
            cas.iter().map(|c| c.pem()).collect::<String>().into_bytes()
        };
        assert!(client_ca_signed_serving(
            &bundle(&[&client_ca, &serving_ca]),
            serving.as_bytes()
        ));
        assert!(!client_ca_signed_serving(
            &bundle(&[&client_ca, &namesake]),
            serving.as_bytes()
        ));
        assert!(!client_ca_signed_serving(b"not pem", serving.as_bytes()));
    }
}
