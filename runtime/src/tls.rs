//! TLS for the servers every process runs: a certificate and key read from
//! PEM files and read again while the process runs, so a mounted Secret
//! updated in place (cert-manager's renewal, a rotated chart CA) is served
//! without a restart; optionally client certificates, verified against a
//! CA bundle file that is reloaded the same way.
//!
//! A reload builds a whole new server configuration and swaps it in:
//! connections already open keep the one they were accepted with, so no
//! call in flight is dropped. Files that do not load (a half-written
//! update, a key that does not match its certificate) leave the last good
//! configuration in place and are named in a warning.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use tokio_util::sync::CancellationToken;

/// The ALPN protocol of gRPC (HTTP/2).
pub const ALPN_H2: &[u8] = b"h2";

/// Where a server's certificate, key and (optionally) client CA bundle are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA bundle for client certificates; without it none is asked for.
    pub client_ca: Option<PathBuf>,
}

impl PemFiles {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }

    fn read(&self) -> anyhow::Result<Vec<Vec<u8>>> {
        self.paths()
            .map(|path| std::fs::read(path).with_context(|| format!("read {}", path.display())))
            .collect()
    }
}

/// A server's TLS configuration, current as of the last reload; clones
/// share it.
#[derive(Clone)]
pub struct ServerTls {
    current: Arc<RwLock<Arc<ServerConfig>>>,
    files: Option<PemFiles>,
    /// Verifies client certificates by other means than `files.client_ca`
    /// (a CA that comes from the API server, say).
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    alpn: Vec<Vec<u8>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads `files` now (an error names the file and what is wrong with
    /// it); `alpn` lists the protocols offered, e.g. [`ALPN_H2`].
    pub fn from_files(files: PemFiles, alpn: &[&[u8]]) -> anyhow::Result<Self> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let config = build(&files, &files.read()?, None, &alpn)?;
        Ok(Self {
            current: Arc::new(RwLock::new(config)),
            files: Some(files),
            verifier: None,
            alpn,
        })
    }

    /// As [`Self::from_files`] (with no `client_ca` file), asking clients
    /// for a certificate that `verifier` checks; one may come without.
    pub fn from_files_verifying(
        files: PemFiles,
        verifier: Arc<dyn ClientCertVerifier>,
        alpn: &[&[u8]],
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            files.client_ca.is_none(),
            "a client CA file and a verifier of its own: pick one"
        );
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let config = build(&files, &files.read()?, Some(verifier.clone()), &alpn)?;
        Ok(Self {
            current: Arc::new(RwLock::new(config)),
            files: Some(files),
            verifier: Some(verifier),
            alpn,
        })
    }

    /// A certificate made up now for `names` (DNS names or IP addresses)
    /// and signed by itself, as upstream's controller managers serve when
    /// given no certificate: the connection is encrypted, though no client
    /// can verify whom it reached. Nothing to reload.
    pub fn self_signed(names: &[String], alpn: &[&[u8]]) -> anyhow::Result<Self> {
        let made = rcgen::generate_simple_self_signed(names.to_vec())
            .context("make a self-signed certificate")?;
        let cert = CertificateDer::from(made.cert.der().to_vec());
        let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
            .map_err(|e| anyhow::anyhow!("the self-signed key: {e}"))?;
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)?;
        config.alpn_protocols = alpn.clone();
        Ok(Self {
            current: Arc::new(RwLock::new(Arc::new(config))),
            files: None,
            verifier: None,
            alpn,
        })
    }

    /// A configuration made elsewhere, served as it is: nothing to reload.
    pub fn fixed(config: Arc<ServerConfig>) -> Self {
        Self {
            alpn: config.alpn_protocols.clone(),
            current: Arc::new(RwLock::new(config)),
            files: None,
            verifier: None,
        }
    }

    /// The configuration to accept the next connection with.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// An acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config())
    }

    /// Whether client certificates are asked for.
    pub fn verifies_clients(&self) -> bool {
        self.verifier.is_some() || self.files.as_ref().is_some_and(|f| f.client_ca.is_some())
    }

    /// Reads the files again every `interval` until `shutdown`, and swaps
    /// in what changed. Nothing to do for a self-signed certificate.
    pub fn reload_every(&self, interval: Duration, shutdown: CancellationToken) {
        let Some(files) = self.files.clone() else {
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            // What was last tried, good or not: a broken update is named
            // once, not every interval.
            let mut last = files.read().ok();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = shutdown.cancelled() => return,
                }
                let read = {
                    let files = files.clone();
                    tokio::task::spawn_blocking(move || files.read()).await
                };
                let bytes = match read {
                    Ok(Ok(bytes)) => bytes,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %format!("{e:#}"), "TLS files unreadable; still serving the last good certificate");
                        continue;
                    }
                    Err(_) => continue,
                };
                if last.as_ref() == Some(&bytes) {
                    continue;
                }
                match build(&files, &bytes, this.verifier.clone(), &this.alpn) {
                    Ok(config) => {
                        *this.current.write().unwrap_or_else(|e| e.into_inner()) = config;
                        tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
                    }
                    Err(e) => tracing::warn!(
                        error = %format!("{e:#}"),
                        "TLS files changed but do not load; still serving the last good certificate"
                    ),
                }
                last = Some(bytes);
            }
        });
    }
}

/// The one crypto provider every TLS user here is built on, made once.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::LazyLock<Arc<CryptoProvider>> =
        std::sync::LazyLock::new(|| Arc::new(rustls::crypto::ring::default_provider()));
    PROVIDER.clone()
}

/// Every certificate in a PEM bundle; an error when there is none.
pub fn certificates(pem: &[u8], what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{what}: not PEM certificates: {e}"))?;
    anyhow::ensure!(!certs.is_empty(), "{what}: holds no certificate");
    Ok(certs)
}

/// A root store of every certificate in a PEM bundle.
pub fn roots(pem: &[u8], what: &str) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(pem, what)? {
        roots
            .add(cert)
            .map_err(|e| anyhow::anyhow!("{what}: not a CA certificate: {e}"))?;
    }
    Ok(roots)
}

/// A client configuration trusting the CA bundle `ca_pem` (named `what`
/// in errors), presenting `client` (certificate and key PEM) when given,
/// offering `alpn`.
pub fn client_config(
    ca_pem: &[u8],
    what: &str,
    client: Option<(&[u8], &[u8])>,
    alpn: &[&[u8]],
) -> anyhow::Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_pem, what)?);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| anyhow::anyhow!("the client key: not a PEM private key: {e}"))?;
            builder.with_client_auth_cert(certificates(cert, "the client certificate")?, key)?
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A server configuration from the files' contents, in [`PemFiles::paths`]
/// order: TLS 1.3 and 1.2, client certificates optional when a client CA
/// or a `verifier` is given (a caller may still come with a token
/// instead).
fn build(
    files: &PemFiles,
    bytes: &[Vec<u8>],
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    alpn: &[Vec<u8>],
) -> anyhow::Result<Arc<ServerConfig>> {
    let cert_what = files.cert.display().to_string();
    let key_what = files.key.display().to_string();
    let certs = certificates(&bytes[0], &cert_what)?;
    let key = PrivateKeyDer::from_pem_slice(&bytes[1])
        .map_err(|e| anyhow::anyhow!("{key_what}: not a PEM private key: {e}"))?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (&files.client_ca, verifier) {
        (None, Some(verifier)) => builder.with_client_cert_verifier(verifier),
        (None, None) => builder.with_no_client_auth(),
        (Some(path), _) => {
            let roots = roots(&bytes[2], &path.display().to_string())?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .with_context(|| format!("client CA {}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .with_context(|| format!("{cert_what} with {key_what}"))?;
    config.alpn_protocols = alpn.to_vec();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let made = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        (made.cert.pem(), made.signing_key.serialize_pem())
    }

    #[test]
    fn a_key_that_does_not_match_its_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = pair("a");
        let (_, other_key) = pair("b");
        let files = PemFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            client_ca: None,
        };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, other_key).unwrap();
        let err = format!(
            "{:#}",
            ServerTls::from_files(files, &[ALPN_H2]).unwrap_err()
        );
        assert!(
            err.contains("tls.crt with") && err.contains("tls.key"),
            "{err}"
        );
    }

    #[test]
    fn a_self_signed_certificate_names_what_it_was_made_for() {
        let tls =
            ServerTls::self_signed(&["localhost".into(), "127.0.0.1".into()], &[ALPN_H2]).unwrap();
        assert_eq!(tls.config().alpn_protocols, vec![ALPN_H2.to_vec()]);
        assert!(!tls.verifies_clients());
    }

    #[test]
    fn a_file_without_a_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (_, key) = pair("a");
        let files = PemFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            client_ca: None,
        };
        std::fs::write(&files.cert, "not pem").unwrap();
        std::fs::write(&files.key, key).unwrap();
        let err = format!(
            "{:#}",
            ServerTls::from_files(files, &[ALPN_H2]).unwrap_err()
        );
        assert!(err.contains("tls.crt: holds no certificate"), "{err}");
    }
}
