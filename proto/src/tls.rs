//! How the client checks the gateway: against a CA bundle file that is
//! read again when it changes (a rotated CA in a mounted Secret is trusted
//! without a restart), and never in clear except on this machine. The
//! diagnostics API checks the release's admin ports the same way.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Verifies the gateway's certificate chain against the CA bundle in a
/// file, read at each handshake (connections are long-lived, so that is
/// rare) and rebuilt when its bytes change. A file that cannot be read or
/// holds no CA keeps the last good bundle; with none, the handshake fails.
#[derive(Debug)]
pub struct CaFile {
    path: PathBuf,
    algorithms: WebPkiSupportedAlgorithms,
    provider: Arc<CryptoProvider>,
    last: Mutex<Option<(Vec<u8>, Arc<WebPkiServerVerifier>)>>,
}

impl CaFile {
    /// Reads `path` now: a bundle that does not load is a configuration
    /// error at start.
    pub fn new(path: PathBuf) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let this = Self {
            algorithms: provider.signature_verification_algorithms,
            provider,
            path,
            last: Mutex::new(None),
        };
        this.current().map_err(|e| e.to_string())?;
        Ok(this)
    }

    fn current(&self) -> Result<Arc<WebPkiServerVerifier>, rustls::Error> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = std::fs::read(&self.path);
        match (&*last, bytes) {
            (Some((seen, verifier)), Ok(bytes)) if *seen == bytes => Ok(verifier.clone()),
            (_, Ok(bytes)) => match self.verifier(&bytes) {
                Ok(verifier) => {
                    if last.is_some() {
                        tracing::info!(file = %self.path.display(), "gateway CA bundle reloaded");
                    }
                    *last = Some((bytes, verifier.clone()));
                    Ok(verifier)
                }
                Err(e) => match &*last {
                    Some((_, verifier)) => {
                        tracing::warn!(file = %self.path.display(), error = %e, "gateway CA bundle does not load; trusting the last good one");
                        Ok(verifier.clone())
                    }
                    None => Err(e),
                },
            },
            (Some((_, verifier)), Err(e)) => {
                tracing::warn!(file = %self.path.display(), error = %e, "gateway CA bundle unreadable; trusting the last good one");
                Ok(verifier.clone())
            }
            (None, Err(e)) => Err(rustls::Error::General(format!(
                "read CA file {}: {e}",
                self.path.display()
            ))),
        }
    }

    fn verifier(&self, pem: &[u8]) -> Result<Arc<WebPkiServerVerifier>, rustls::Error> {
        let what = self.path.display();
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert =
                cert.map_err(|e| rustls::Error::General(format!("CA file {what}: not PEM: {e}")))?;
            roots.add(cert)?;
        }
        if roots.is_empty() {
            return Err(rustls::Error::General(format!(
                "CA file {what}: holds no certificate"
            )));
        }
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(format!("CA file {what}: {e}")))
    }
}

impl ServerCertVerifier for CaFile {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.current()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Whether `host` (a URI's host) is this machine: `localhost`, or a
/// loopback address.
pub(crate) fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_machine_is_loopback() {
        for host in ["localhost", "127.0.0.1", "127.3.2.1", "[::1]"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "10.0.0.1",
            "gateway.kube-system.svc",
            "0.0.0.0",
            "localhost.evil",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn a_rotated_bundle_is_read_again_and_a_broken_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let first = rcgen::generate_simple_self_signed(vec!["a".into()]).unwrap();
        std::fs::write(&path, first.cert.pem()).unwrap();
        let ca = CaFile::new(path.clone()).unwrap();
        let a = ca.current().unwrap();
        assert!(
            Arc::ptr_eq(&a, &ca.current().unwrap()),
            "unchanged: same verifier"
        );
        let second = rcgen::generate_simple_self_signed(vec!["b".into()]).unwrap();
        std::fs::write(&path, second.cert.pem()).unwrap();
        let b = ca.current().unwrap();
        assert!(!Arc::ptr_eq(&a, &b), "a new bundle: a new verifier");
        std::fs::write(&path, "garbage").unwrap();
        assert!(
            Arc::ptr_eq(&b, &ca.current().unwrap()),
            "broken: the last good one"
        );
        std::fs::write(&path, "").unwrap();
        assert!(CaFile::new(path).is_err(), "no CA at start is an error");
    }
}
