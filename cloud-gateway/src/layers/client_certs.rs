//! Callers known by their client certificate (mutual TLS): the TLS
//! handshake verified the chain against the client CA bundle; here the
//! certificate's identity (a URI SAN such as a SPIFFE ID
//! `spiffe://<trust domain>/ns/<namespace>/sa/<name>`, or the subject's
//! common name) is mapped to a role through `--client-cert-roles`. Tools
//! that can only present a certificate (Cluster Autoscaler's external gRPC
//! client) come in this way, with no token.

use crate::identity::{Caller, Role};

/// What a verified client certificate says of its holder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertIdentity {
    /// Its URI subject alternative names.
    pub uris: Vec<String>,
    /// Its subject's common name.
    pub common_name: Option<String>,
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
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        Some(Self { uris, common_name })
    }

    /// How the certificate is named in refusals and logs.
    pub fn describe(&self) -> String {
        let mut names: Vec<String> = self.uris.clone();
        if let Some(cn) = &self.common_name {
            names.push(format!("CN={cn}"));
        }
        if names.is_empty() {
            "a certificate with neither a URI SAN nor a common name".to_owned()
        } else {
            names.join(", ")
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
    fn matches(&self, cert: &CertIdentity) -> bool {
        match self {
            Self::Uri(uri) => cert.uris.iter().any(|u| u == uri),
            Self::CommonName(cn) => cert.common_name.as_deref() == Some(cn),
        }
    }

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

    /// The caller a certificate maps to: the first configured identity it
    /// carries.
    pub fn caller(&self, cert: &CertIdentity) -> Option<Caller> {
        self.entries
            .iter()
            .find(|(matcher, _)| matcher.matches(cert))
            .map(|(matcher, role)| Caller {
                name: matcher.name(),
                role: *role,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUTOSCALER: &str = "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler";

    #[test]
    fn a_certificate_maps_by_its_uri_or_its_common_name() {
        let roles =
            ClientCertRoles::parse(&format!("{AUTOSCALER}=node, CN=ops-console=admin")).unwrap();
        let autoscaler = CertIdentity {
            uris: vec![AUTOSCALER.to_owned()],
            common_name: Some("whatever".into()),
        };
        assert_eq!(
            roles.caller(&autoscaler),
            Some(Caller {
                name: AUTOSCALER.into(),
                role: Role::Node
            })
        );
        let ops = CertIdentity {
            uris: vec![],
            common_name: Some("ops-console".into()),
        };
        assert_eq!(roles.caller(&ops).map(|c| c.role), Some(Role::Admin));
        let stranger = CertIdentity {
            uris: vec!["spiffe://cluster.local/ns/default/sa/web".into()],
            common_name: Some("ops-console-2".into()),
        };
        assert_eq!(roles.caller(&stranger), None);
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
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let identity = CertIdentity::from_der(cert.der()).unwrap();
        assert_eq!(identity.uris, vec![AUTOSCALER.to_owned()]);
        assert_eq!(identity.common_name.as_deref(), Some("cluster-autoscaler"));
        assert_eq!(
            identity.describe(),
            format!("{AUTOSCALER}, CN=cluster-autoscaler")
        );
    }
}
