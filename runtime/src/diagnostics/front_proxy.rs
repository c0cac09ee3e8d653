//! Who kube-apiserver says is asking. The API server forwards an aggregated
//! API's requests over TLS with its front-proxy client certificate and
//! names the user it authenticated in headers (`X-Remote-User`,
//! `X-Remote-Group`, ...). Those headers are believed only on a connection
//! whose client certificate was signed by the request-header CA and
//! (when the list is not empty) carries one of the allowed common names;
//! anyone else is refused, whatever headers they send.
//!
//! The CA, the allowed names and the header names come, as upstream's
//! aggregated API servers take them, from the ConfigMap
//! `kube-system/extension-apiserver-authentication` that kube-apiserver
//! publishes (read again every [`REFRESH`], so a rotated front-proxy CA is
//! followed), or from a CA file and a list of names given as flags.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio_util::sync::CancellationToken;

use crate::https::{Peer, common_names};

/// Where kube-apiserver publishes how it authenticates to aggregated APIs.
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
pub const CONFIG_MAP_NAME: &str = "extension-apiserver-authentication";

/// How often the request-header settings are read again.
pub const REFRESH: Duration = Duration::from_secs(30);

/// How often they are tried while none has been read yet.
const FIRST_READ_RETRY: Duration = Duration::from_secs(2);

/// How kube-apiserver's front proxy is recognised and read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// The CA bundle (PEM) that signs the front proxy's client certificate.
    pub ca_pem: Vec<u8>,
    /// Common names the client certificate must carry one of; empty: any
    /// certificate the CA signed.
    pub allowed_names: Vec<String>,
    pub user_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub uid_headers: Vec<String>,
}

impl RequestHeader {
    /// The settings from a CA bundle and allowed names, with kube-apiserver's
    /// default header names.
    pub fn new(ca_pem: Vec<u8>, allowed_names: Vec<String>) -> Self {
        Self {
            ca_pem,
            allowed_names,
            user_headers: vec!["X-Remote-User".into()],
            group_headers: vec!["X-Remote-Group".into()],
            uid_headers: vec!["X-Remote-Uid".into()],
        }
    }

    /// The settings kube-apiserver published in its ConfigMap; `Ok(None)`
    /// when it names no request-header CA (the front proxy is not set up).
    pub fn from_config_map(map: &ConfigMap) -> Result<Option<Self>, String> {
        let data = map.data.clone().unwrap_or_default();
        let Some(ca) = data
            .get("requestheader-client-ca-file")
            .filter(|ca| !ca.trim().is_empty())
        else {
            return Ok(None);
        };
        let list = |key: &str, default: &[&str]| -> Result<Vec<String>, String> {
            match data.get(key).filter(|v| !v.trim().is_empty()) {
                None => Ok(default.iter().map(|s| (*s).to_owned()).collect()),
                Some(text) => serde_json::from_str(text)
                    .map_err(|e| format!("{key}: not a JSON list of strings: {e}")),
            }
        };
        Ok(Some(Self {
            ca_pem: ca.as_bytes().to_vec(),
            allowed_names: list("requestheader-allowed-names", &[])?,
            user_headers: list("requestheader-username-headers", &["X-Remote-User"])?,
            group_headers: list("requestheader-group-headers", &["X-Remote-Group"])?,
            uid_headers: list("requestheader-uid-headers", &[])?,
        }))
    }
}

/// Where the request-header settings come from.
#[derive(Clone)]
pub enum Source {
    /// Flags: a CA bundle file (read again on each refresh) and names.
    File {
        ca: PathBuf,
        allowed_names: Vec<String>,
    },
    /// kube-apiserver's ConfigMap, read with this client.
    ConfigMap(kube::Client),
}

impl Source {
    async fn read(&self) -> Result<Option<RequestHeader>, String> {
        match self {
            Source::File { ca, allowed_names } => {
                let pem = tokio::fs::read(ca)
                    .await
                    .map_err(|e| format!("read {}: {e}", ca.display()))?;
                Ok(Some(RequestHeader::new(pem, allowed_names.clone())))
            }
            Source::ConfigMap(client) => {
                let api: kube::Api<ConfigMap> =
                    kube::Api::namespaced(client.clone(), CONFIG_MAP_NAMESPACE);
                let map = api
                    .get_opt(CONFIG_MAP_NAME)
                    .await
                    .map_err(|e| format!("read {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: {e}"))?
                    .ok_or_else(|| {
                        format!("no ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}")
                    })?;
                RequestHeader::from_config_map(&map)
            }
        }
    }
}

/// The request-header settings in force, with a verifier of their CA.
struct Trusted {
    header: RequestHeader,
    verifier: Arc<dyn ClientCertVerifier>,
}

/// The user kube-apiserver authenticated, as its headers name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
}

/// The front proxy's current settings; clones share them.
#[derive(Clone, Default)]
pub struct FrontProxy {
    current: Arc<RwLock<Option<Arc<Trusted>>>>,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontProxy")
            .field("known", &self.trusted().is_some())
            .finish()
    }
}

impl FrontProxy {
    /// No settings yet: every client certificate is refused until
    /// [`Self::set`] or [`Self::follow`] gives some.
    pub fn new() -> Self {
        Self::default()
    }

    fn trusted(&self) -> Option<Arc<Trusted>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts `header` in force; an error when its CA bundle does not load.
    pub fn set(&self, header: RequestHeader) -> anyhow::Result<()> {
        let roots = crate::tls::roots(&header.ca_pem, "the request-header CA")?;
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crate::tls::provider())
                .build()?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) =
            Some(Arc::new(Trusted { header, verifier }));
        Ok(())
    }

    /// Reads `source` now and every [`REFRESH`] until `shutdown` (every
    /// few seconds while nothing has been read), putting what changed in
    /// force. A read that fails keeps the settings in force.
    pub fn follow(&self, source: Source, shutdown: CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut last: Option<RequestHeader> = None;
            loop {
                match source.read().await {
                    Ok(Some(header)) if last.as_ref() != Some(&header) => {
                        match this.set(header.clone()) {
                            Ok(()) => tracing::info!(
                                allowed_names = ?header.allowed_names,
                                "front-proxy settings in force"
                            ),
                            Err(e) => tracing::warn!(
                                error = %format!("{e:#}"),
                                "front-proxy settings do not load; keeping the last good ones"
                            ),
                        }
                        last = Some(header);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => tracing::warn!(
                        "kube-apiserver names no request-header CA: the diagnostics API refuses every request until it does"
                    ),
                    Err(why) => tracing::warn!(error = %why, "front-proxy settings not read"),
                }
                let wait = if this.trusted().is_some() {
                    REFRESH
                } else {
                    FIRST_READ_RETRY
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        });
    }

    /// The TLS verifier of client certificates, following the settings in
    /// force. A client may come without one (and is refused by
    /// [`Self::authenticate`], with a clear answer rather than a failed
    /// handshake).
    pub fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::new(Verifier(self.clone()))
    }

    /// The user a request is made for: only from a connection with the
    /// front proxy's certificate, of an allowed name, and only from the
    /// headers kube-apiserver is known to set.
    pub fn authenticate(&self, peer: &Peer, headers: &HeaderMap) -> Result<User, String> {
        let Some(trusted) = self.trusted() else {
            return Err("the front proxy's CA is not known yet".into());
        };
        let Some(cert) = &peer.client_cert else {
            return Err(
                "no client certificate: this API answers kube-apiserver's front proxy only; ask through the API server".into(),
            );
        };
        let allowed = &trusted.header.allowed_names;
        if !allowed.is_empty() {
            // kube-apiserver reads one common name of a subject; one with
            // several is no name, whichever of them is allowed.
            match common_names(cert).as_slice() {
                [name] if allowed.contains(name) => {}
                [name] => {
                    return Err(format!(
                        "the client certificate's common name {name:?} is not an allowed front-proxy name"
                    ));
                }
                names => {
                    return Err(format!(
                        "the client certificate's subject carries {} common names ({names:?}); the front proxy's carries one",
                        names.len()
                    ));
                }
            }
        }
        let values = |names: &[String]| -> Vec<String> {
            names
                .iter()
                .flat_map(|name| headers.get_all(name.as_str()))
                .filter_map(|v| v.to_str().ok())
                .map(str::to_owned)
                .collect()
        };
        let name = values(&trusted.header.user_headers)
            .into_iter()
            .find(|n| !n.is_empty())
            .ok_or("the front proxy named no user")?;
        Ok(User {
            name,
            uid: values(&trusted.header.uid_headers).into_iter().next(),
            groups: values(&trusted.header.group_headers),
        })
    }
}

/// A client certificate verifier that follows [`FrontProxy`]'s CA.
struct Verifier(FrontProxy);

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("front-proxy verifier")
    }
}

impl ClientCertVerifier for Verifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The CA changes under us; no hints lets a client send any
        // certificate, which the verification below then judges.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self.0.trusted() {
            Some(trusted) => trusted
                .verifier
                .verify_client_cert(end_entity, intermediates, now),
            None => Err(rustls::Error::General(
                "the front proxy's CA is not known yet".into(),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &crate::tls::provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &crate::tls::provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        crate::tls::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn map(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn the_config_map_is_read_as_kube_apiserver_writes_it() {
        let header = RequestHeader::from_config_map(&map(&[
            ("requestheader-client-ca-file", "PEM"),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(header.allowed_names, ["front-proxy-client"]);
        assert_eq!(header.user_headers, ["X-Remote-User"]);
        assert!(header.uid_headers.is_empty());
        assert_eq!(
            RequestHeader::from_config_map(&map(&[("client-ca-file", "PEM")])).unwrap(),
            None,
            "no request-header CA: no front proxy"
        );
        let err = RequestHeader::from_config_map(&map(&[
            ("requestheader-client-ca-file", "PEM"),
            ("requestheader-allowed-names", "front-proxy-client"),
        ]))
        .unwrap_err();
        assert!(err.contains("requestheader-allowed-names"), "{err}");
    }

    fn ca_and_client(cn: &str) -> (String, CertificateDer<'static>) {
        ca_and_client_named(&[cn])
    }

    /// A CA and a client certificate whose subject carries every common
    /// name in `cns`, in order.
    fn ca_and_client_named(cns: &[&str]) -> (String, CertificateDer<'static>) {
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let issuer =
            rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        for (i, cn) in cns.iter().enumerate() {
            // rcgen keeps one value per attribute type: a second CN goes
            // in under CN's own OID, as a type of its own.
            let kind = if i == 0 {
                rcgen::DnType::CommonName
            } else {
                rcgen::DnType::CustomDnType(vec![2, 5, 4, 3])
            };
            params.distinguished_name.push(kind, *cn);
        }
        let leaf = params.signed_by(&key, &issuer).unwrap();
        (issuer.pem(), leaf.der().clone())
    }

    fn peer(cert: Option<CertificateDer<'static>>) -> Peer {
        Peer {
            remote: "127.0.0.1:1".parse().unwrap(),
            client_cert: cert.map(Arc::new),
        }
    }

    #[test]
    fn the_user_is_read_only_from_an_allowed_certificate() {
        let (ca, good) = ca_and_client("front-proxy-client");
        let (_, other_name) = ca_and_client("someone");
        let proxy = FrontProxy::new();
        let mut headers = HeaderMap::new();
        headers.insert("X-Remote-User", "alice".parse().unwrap());
        headers.append("X-Remote-Group", "sre".parse().unwrap());
        headers.append("X-Remote-Group", "system:authenticated".parse().unwrap());
        assert!(
            proxy
                .authenticate(&peer(Some(good.clone())), &headers)
                .unwrap_err()
                .contains("not known yet")
        );
        proxy
            .set(RequestHeader::new(
                ca.into_bytes(),
                vec!["front-proxy-client".into()],
            ))
            .unwrap();
        let user = proxy
            .authenticate(&peer(Some(good.clone())), &headers)
            .unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["sre", "system:authenticated"]);
        let no_cert = proxy.authenticate(&peer(None), &headers).unwrap_err();
        assert!(no_cert.contains("no client certificate"), "{no_cert}");
        let wrong = proxy
            .authenticate(&peer(Some(other_name)), &headers)
            .unwrap_err();
        assert!(wrong.contains("someone"), "{wrong}");
        let nobody = proxy
            .authenticate(&peer(Some(good)), &HeaderMap::new())
            .unwrap_err();
        assert!(nobody.contains("no user"), "{nobody}");
    }

    #[test]
    fn a_certificate_of_several_common_names_is_no_allowed_name() {
        let proxy = FrontProxy::new();
        let mut headers = HeaderMap::new();
        headers.insert("X-Remote-User", "alice".parse().unwrap());
        for names in [
            ["front-proxy-client", "someone"],
            ["someone", "front-proxy-client"],
        ] {
            let (ca, cert) = ca_and_client_named(&names);
            proxy
                .set(RequestHeader::new(
                    ca.into_bytes(),
                    vec!["front-proxy-client".into()],
                ))
                .unwrap();
            let refused = proxy.authenticate(&peer(Some(cert)), &headers).unwrap_err();
            assert!(refused.contains("2 common names"), "{refused}");
        }
    }
}
