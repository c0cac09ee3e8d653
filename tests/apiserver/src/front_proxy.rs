//! The front proxy's PKI, as kube-apiserver's `--requestheader-*` and
//! `--proxy-client-*` flags set it up: a CA of its own, and a client
//! certificate it signs (CN `front-proxy-client`) that the server presents
//! to every aggregated API server it forwards to (see `aggregation`). Those
//! servers trust a request's `X-Remote-*` headers only from a client with
//! that certificate; they learn the CA, the allowed names and the header
//! names from the ConfigMap `kube-system/extension-apiserver-authentication`,
//! which the server publishes at every start.
//!
//! With a state directory the three PEM files are kept there
//! ([`CA_FILE`], [`CLIENT_CERT_FILE`], [`CLIENT_KEY_FILE`]) and reused by
//! the next start, so the ConfigMap a restarted server publishes names the
//! same CA its objects were made with; files that are missing or do not
//! fit together are replaced by a new set.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use serde_json::{Value, json};

/// The namespace of the ConfigMap aggregated API servers read.
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
/// The ConfigMap aggregated API servers read the front proxy's settings
/// from. Its name is kube-apiserver's and must never change: aggregated
/// servers look it up by name.
pub const CONFIG_MAP: &str = "extension-apiserver-authentication";
/// The common name of the front proxy's client certificate, the only one
/// the ConfigMap allows.
pub const CLIENT_NAME: &str = "front-proxy-client";
/// The front proxy CA's certificate in the state directory.
pub const CA_FILE: &str = "front-proxy-ca.crt";
/// The front proxy's client certificate in the state directory.
pub const CLIENT_CERT_FILE: &str = "front-proxy-client.crt";
/// The front proxy's client key in the state directory.
pub const CLIENT_KEY_FILE: &str = "front-proxy-client.key";
/// The header naming the user a forwarded request is from.
pub const USER_HEADER: &str = "X-Remote-User";
/// The header naming one group of that user (one line per group).
pub const GROUP_HEADER: &str = "X-Remote-Group";
/// The header carrying the user's uid.
pub const UID_HEADER: &str = "X-Remote-Uid";
/// The prefix of the headers carrying the user's extra attributes.
pub const EXTRA_HEADERS_PREFIX: &str = "X-Remote-Extra-";

/// The front proxy's CA and client certificate, in PEM.
#[derive(Clone)]
pub struct FrontProxy {
    /// The CA aggregated servers verify the client certificate with
    /// (`requestheader-client-ca-file`).
    pub ca_pem: String,
    /// The client certificate, CN [`CLIENT_NAME`], signed by the CA.
    pub client_cert_pem: String,
    /// The client certificate's private key (ECDSA P-256, PKCS#8).
    pub client_key_pem: String,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontProxy")
            .field("ca_pem", &self.ca_pem)
            .field("client_cert_pem", &self.client_cert_pem)
            .finish_non_exhaustive()
    }
}

/// How a backend's certificate is checked.
pub(crate) enum Trust {
    /// Verified against these roots, for the name the caller gives.
    Roots(RootCertStore),
    /// Not verified (`insecureSkipTLSVerify`).
    Anything,
}

impl FrontProxy {
    /// A new CA and a client certificate signed by it.
    pub fn generate() -> Result<Self, rcgen::Error> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(DnType::CommonName, "front-proxy-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(DnType::CommonName, CLIENT_NAME);
        client.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate()?;
        let client_cert = client.signed_by(&client_key, &issuer)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
        })
    }

    /// The set kept in `dir` if it loads, else a new one (written there).
    /// Without a directory, always a new one.
    pub fn load_or_generate(dir: Option<&Path>) -> std::io::Result<Self> {
        if let Some(kept) = dir.and_then(Self::load) {
            return Ok(kept);
        }
        let made = Self::generate().map_err(std::io::Error::other)?;
        if let Some(dir) = dir {
            made.save(dir)?;
        }
        Ok(made)
    }

    /// The set kept in `dir`, if all three files are there and fit
    /// together: the certificate is signed by the CA, for a client, and
    /// the key is its own.
    fn load(dir: &Path) -> Option<Self> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let kept = Self {
            ca_pem: read(CA_FILE)?,
            client_cert_pem: read(CLIENT_CERT_FILE)?,
            client_key_pem: read(CLIENT_KEY_FILE)?,
        };
        match kept.check() {
            Ok(()) => Some(kept),
            Err(why) => {
                tracing::warn!(dir = %dir.display(), %why, "front proxy files do not load; making new ones");
                None
            }
        }
    }

    /// Whether the three parts fit together (see [`Self::load`]).
    fn check(&self) -> Result<(), String> {
        use rustls::server::WebPkiClientVerifier;
        let roots = self.roots()?;
        let chain = self.chain()?;
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            ccm_runtime::tls::provider(),
        )
        .build()
        .map_err(|e| e.to_string())?;
        verifier
            .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
            .map_err(|e| format!("the client certificate: {e}"))?;
        self.client_config(Trust::Anything).map(drop)
    }

    /// Writes the three files into `dir` (the key readable by its owner
    /// only).
    fn save(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(CA_FILE), &self.ca_pem)?;
        std::fs::write(dir.join(CLIENT_CERT_FILE), &self.client_cert_pem)?;
        crate::pki::write_private(&dir.join(CLIENT_KEY_FILE), self.client_key_pem.as_bytes())
    }

    /// The data of the ConfigMap [`CONFIG_MAP`], as kube-apiserver
    /// publishes it: the CA, and each list as a JSON array in a string.
    pub fn config_map_data(&self) -> Value {
        let list = |items: &[&str]| json!(items).to_string();
        json!({
            "requestheader-client-ca-file": self.ca_pem,
            "requestheader-allowed-names": list(&[CLIENT_NAME]),
            "requestheader-username-headers": list(&[USER_HEADER]),
            "requestheader-group-headers": list(&[GROUP_HEADER]),
            "requestheader-extra-headers-prefix": list(&[EXTRA_HEADERS_PREFIX]),
            "requestheader-uid-headers": list(&[UID_HEADER]),
        })
    }

    /// The ConfigMap [`CONFIG_MAP`] as it is stored.
    pub fn config_map(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": CONFIG_MAP_NAMESPACE},
            "data": self.config_map_data(),
        })
    }

    fn roots(&self) -> Result<RootCertStore, String> {
        ccm_runtime::tls::roots(self.ca_pem.as_bytes(), CA_FILE).map_err(|e| format!("{e:#}"))
    }

    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, String> {
        ccm_runtime::tls::certificates(self.client_cert_pem.as_bytes(), CLIENT_CERT_FILE)
            .map_err(|e| format!("{e:#}"))
    }

    /// A TLS client configuration that presents the client certificate
    /// and checks servers as `trust` says.
    pub(crate) fn client_config(&self, trust: Trust) -> Result<Arc<ClientConfig>, String> {
        let key = PrivateKeyDer::from_pem_slice(self.client_key_pem.as_bytes())
            .map_err(|e| format!("{CLIENT_KEY_FILE}: not a PEM private key: {e}"))?;
        let provider = ccm_runtime::tls::provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match trust {
            Trust::Roots(roots) => builder.with_root_certificates(roots),
            Trust::Anything => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServer(provider))),
        };
        let config = builder
            .with_client_auth_cert(self.chain()?, key)
            .map_err(|e| format!("{CLIENT_CERT_FILE} with {CLIENT_KEY_FILE}: {e}"))?;
        Ok(Arc::new(config))
    }
}

/// Accepts any server certificate, still checking that the server holds
/// its key: `insecureSkipTLSVerify`, and what kubelet's HTTPS probes do.
#[derive(Debug)]
pub struct AnyServer(Arc<CryptoProvider>);

impl AnyServer {
    /// A verifier on the crypto provider every TLS user here shares.
    pub fn new() -> Self {
        Self(ccm_runtime::tls::provider())
    }
}

impl Default for AnyServer {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
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
            &self.0.signature_verification_algorithms,
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
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_map_names_the_ca_and_the_headers_as_json_lists() {
        let made = FrontProxy::generate().unwrap();
        let data = made.config_map_data();
        assert_eq!(data["requestheader-client-ca-file"], made.ca_pem);
        assert_eq!(
            data["requestheader-allowed-names"],
            r#"["front-proxy-client"]"#
        );
        assert_eq!(
            data["requestheader-username-headers"],
            r#"["X-Remote-User"]"#
        );
        assert_eq!(data["requestheader-group-headers"], r#"["X-Remote-Group"]"#);
        assert_eq!(
            data["requestheader-extra-headers-prefix"],
            r#"["X-Remote-Extra-"]"#
        );
        assert_eq!(data["requestheader-uid-headers"], r#"["X-Remote-Uid"]"#);
        made.check().unwrap();
    }

    #[test]
    fn a_kept_set_is_reused_and_a_broken_one_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let first = FrontProxy::load_or_generate(Some(dir.path())).unwrap();
        let again = FrontProxy::load_or_generate(Some(dir.path())).unwrap();
        assert_eq!(again.ca_pem, first.ca_pem);
        assert_eq!(again.client_key_pem, first.client_key_pem);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join(CLIENT_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // A CA that did not sign the client certificate: a new set.
        let other = FrontProxy::generate().unwrap();
        std::fs::write(dir.path().join(CA_FILE), &other.ca_pem).unwrap();
        let replaced = FrontProxy::load_or_generate(Some(dir.path())).unwrap();
        assert_ne!(replaced.ca_pem, first.ca_pem);
        assert_ne!(replaced.ca_pem, other.ca_pem);
        replaced.check().unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(CA_FILE)).unwrap(),
            replaced.ca_pem
        );
    }
}
