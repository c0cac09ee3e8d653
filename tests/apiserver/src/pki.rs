//! The cluster's PKI, as kube-apiserver's `--tls-cert-file`,
//! `--client-ca-file` and `--service-account-signing-key-file` set it up:
//! one CA (CN `kubernetes`, as kubeadm names it) that signs the serving
//! certificate and the client certificates users authenticate with, and a
//! key that signs the ServiceAccount tokens the server mints (see
//! `tokens`).
//!
//! A client certificate names its user as kube-apiserver reads it: the
//! subject's common name is the username, each organization a group.
//!
//! With a state directory the CA and the signing key are kept there
//! ([`CA_FILE`], [`CA_KEY_FILE`], [`SIGNING_KEY_FILE`]) and reused by the
//! next start, so kubeconfigs and tokens made before a restart still work;
//! files that are missing or do not load are replaced by new ones. The
//! serving certificate is made at every start, for loopback and the
//! in-cluster names of the `kubernetes` Service.

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// The CA's certificate in the state directory (`--client-ca-file`, and
/// what kubeconfigs carry as `certificate-authority-data`).
pub const CA_FILE: &str = "ca.crt";
/// The CA's private key in the state directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// The key ServiceAccount tokens are signed with, in the state directory.
pub const SIGNING_KEY_FILE: &str = "sa.key";

/// The CA's common name.
const CA_NAME: &str = "kubernetes";

/// The names the serving certificate is for besides the listen address:
/// loopback, and the `kubernetes` Service's names in a cluster.
const SERVING_NAMES: [&str; 6] = [
    "localhost",
    "127.0.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The CA (certificate and key, PEM) and the token signing key.
#[derive(Clone)]
pub struct ClusterPki {
    pub ca_pem: String,
    ca_key_pem: String,
    /// The HMAC-SHA256 key ServiceAccount tokens are signed with.
    pub(crate) signing_key: Vec<u8>,
}

impl std::fmt::Debug for ClusterPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterPki").finish_non_exhaustive()
    }
}

/// A certificate and its key, in PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl ClusterPki {
    /// A new CA and signing key.
    pub fn generate() -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = ca_params().self_signed(&key)?;
        let mut signing_key = vec![0; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut signing_key)
            .map_err(|_| rcgen::Error::RingUnspecified)?;
        Ok(Self {
            ca_pem: cert.pem(),
            ca_key_pem: key.serialize_pem(),
            signing_key,
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

    fn load(dir: &Path) -> Option<Self> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let kept = Self {
            ca_pem: read(CA_FILE)?,
            ca_key_pem: read(CA_KEY_FILE)?,
            signing_key: data_encoding::HEXLOWER
                .decode(read(SIGNING_KEY_FILE)?.trim().as_bytes())
                .ok()?,
        };
        // A set that cannot issue a certificate its own CA verifies is
        // no set: a key of another CA, a truncated file.
        match kept
            .issue_client("check", None)
            .map(|issued| kept.verify(&issued))
        {
            Ok(Ok(())) if kept.signing_key.len() >= 32 => Some(kept),
            outcome => {
                tracing::warn!(dir = %dir.display(), ?outcome, "cluster CA files do not load; making new ones");
                None
            }
        }
    }

    fn save(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(CA_FILE), &self.ca_pem)?;
        write_private(&dir.join(CA_KEY_FILE), self.ca_key_pem.as_bytes())?;
        write_private(
            &dir.join(SIGNING_KEY_FILE),
            data_encoding::HEXLOWER.encode(&self.signing_key).as_bytes(),
        )
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, rcgen::Error> {
        // The CA's parameters are fixed (see `ca_params`): with its key
        // they sign as the certificate kept on disk does.
        Ok(Issuer::new(
            ca_params(),
            KeyPair::from_pem(&self.ca_key_pem)?,
        ))
    }

    /// A serving certificate for `extra_names` and [`SERVING_NAMES`].
    pub fn issue_serving(&self, extra_names: &[String]) -> Result<Issued, rcgen::Error> {
        let mut names: Vec<String> = SERVING_NAMES.iter().map(|n| n.to_string()).collect();
        for name in extra_names {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        self.sign(params, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for `user`, in `group` if one is given, as
    /// `kubeadm kubeconfig user` makes one: CN the user, O the group. (One
    /// group at most: rcgen keeps one value per attribute type.)
    pub fn issue_client(&self, user: &str, group: Option<&str>) -> Result<Issued, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(group) = group {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group);
        }
        self.sign(params, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A new key, and a certificate of `params` for `usage` the CA signs.
    fn sign(
        &self,
        mut params: CertificateParams,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<Issued, rcgen::Error> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer()?)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA's certificate, DER.
    pub fn ca_der(&self) -> Vec<u8> {
        CertificateDer::from_pem_slice(self.ca_pem.as_bytes())
            .map(|c| c.to_vec())
            .unwrap_or_default()
    }

    fn verifier(&self) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
        let roots = ccm_runtime::tls::roots(self.ca_pem.as_bytes(), CA_FILE)
            .map_err(|e| format!("{e:#}"))?;
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), ccm_runtime::tls::provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| e.to_string())
    }

    fn verify(&self, issued: &Issued) -> Result<(), String> {
        let cert = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes())
            .map_err(|e| e.to_string())?;
        self.verifier()?
            .verify_client_cert(&cert, &[], rustls::pki_types::UnixTime::now())
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The TLS configuration the server accepts connections with: its
    /// serving certificate for `listen` (and [`SERVING_NAMES`]), HTTP/2 or
    /// HTTP/1.1, and a client certificate asked for but not required
    /// (bearer tokens are the other way in), verified against the CA.
    pub fn server_config(
        &self,
        listen: std::net::SocketAddr,
    ) -> std::io::Result<Arc<ServerConfig>> {
        let extra: Vec<String> = (!listen.ip().is_unspecified())
            .then(|| listen.ip().to_string())
            .into_iter()
            .collect();
        let serving = self.issue_serving(&extra).map_err(std::io::Error::other)?;
        let chain = ccm_runtime::tls::certificates(serving.cert_pem.as_bytes(), "serving")
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
            .map_err(std::io::Error::other)?;
        let mut config = ServerConfig::builder_with_provider(ccm_runtime::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_client_cert_verifier(self.verifier().map_err(std::io::Error::other)?)
            .with_single_cert(chain, key)
            .map_err(std::io::Error::other)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The user a verified client certificate names: its common name, and
/// its organizations as groups; `None` without a common name.
pub fn client_user(cert: &CertificateDer<'_>) -> Option<crate::TokenUser> {
    let subject = ccm_runtime::https::subject(cert);
    let username = subject.common_names.into_iter().next()?;
    Some(crate::TokenUser {
        username,
        uid: String::new(),
        groups: subject.organizations,
        audiences: Vec::new(),
    })
}

fn ca_params() -> CertificateParams {
    let mut ca = CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, CA_NAME);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca
}

/// Writes a file only its owner may read, replacing whatever was there.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    ccm_runtime::files::write_private(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_set_is_reused_and_its_certificates_verify() {
        let dir = tempfile::tempdir().unwrap();
        let first = ClusterPki::load_or_generate(Some(dir.path())).unwrap();
        let again = ClusterPki::load_or_generate(Some(dir.path())).unwrap();
        assert_eq!(first.ca_pem, again.ca_pem);
        assert_eq!(first.signing_key, again.signing_key);
        // Issued after the restart, verified by the CA made before it.
        let issued = again.issue_client("jane", Some("dev")).unwrap();
        first.verify(&issued).unwrap();
        let cert = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        let user = client_user(&cert).unwrap();
        assert_eq!(user.username, "jane");
        assert_eq!(user.groups, ["dev"]);
    }

    #[test]
    fn a_certificate_of_another_ca_is_refused_and_a_broken_set_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let ours = ClusterPki::load_or_generate(Some(dir.path())).unwrap();
        let theirs = ClusterPki::generate().unwrap();
        let err = ours
            .verify(
                &theirs
                    .issue_client("mallory", Some("system:masters"))
                    .unwrap(),
            )
            .unwrap_err();
        // Both CAs are called `kubernetes`: the name matches, the
        // signature does not.
        assert!(err.contains("BadSignature"), "{err}");
        std::fs::write(dir.path().join(CA_KEY_FILE), theirs.ca_key_pem).unwrap();
        let replaced = ClusterPki::load_or_generate(Some(dir.path())).unwrap();
        assert_ne!(replaced.ca_pem, ours.ca_pem);
        let mode = std::fs::metadata(dir.path().join(CA_KEY_FILE)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
    }
}
