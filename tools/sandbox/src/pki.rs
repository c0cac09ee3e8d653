//! A certificate authority made at start, as a cluster's would be (the
//! chart's, or cert-manager's): the gateway's serving certificate and
//! client certificates for mutual TLS are issued by it, into PEM files.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// The name the gateway's certificate carries, beside `localhost` and
/// `127.0.0.1`, as the chart's Service would be named.
pub const GATEWAY_NAME: &str = "ccm-gateway.kube-system.svc";

/// The name the diagnostics API's certificate carries, as the API server
/// verifies it (`<service>.<namespace>.svc`).
pub const DIAGNOSTICS_NAME: &str = "ccm-diagnostics.kube-system.svc";

/// A CA whose certificate is in `<dir>/ca.crt`.
pub struct Pki {
    dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    /// Makes a CA named `name` into `dir`.
    pub fn create(dir: &Path, name: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate()?).context("make the CA")?;
        std::fs::write(dir.join("ca.crt"), issuer.pem())?;
        Ok(Self {
            dir: dir.to_owned(),
            issuer,
        })
    }

    /// The CA bundle file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A serving certificate for `names` (DNS names or IP addresses) into
    /// `<dir>/<file>.crt` and `.key`, written in place of any there.
    pub fn serving(&self, file: &str, names: &[&str]) -> anyhow::Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = names
            .iter()
            .map(|name| match name.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName((*name).try_into()?)),
            })
            .collect::<Result<_, rcgen::Error>>()?;
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(file, params)
    }

    /// A client certificate with the URI SAN `uri` (a SPIFFE ID) when
    /// given and the common name `cn`; `expired` makes one that ran out in
    /// 2020.
    pub fn client(
        &self,
        file: &str,
        uri: Option<&str>,
        cn: &str,
        expired: bool,
    ) -> anyhow::Result<Issued> {
        let uris: Vec<&str> = uri.into_iter().collect();
        self.client_naming(file, &uris, Some(cn), expired)
    }

    /// A client certificate with every URI SAN in `uris` and the common
    /// name `cn` when given (a certificate of several identities, or of
    /// none, for tests of how the gateway reads them).
    pub fn client_naming(
        &self,
        file: &str,
        uris: &[&str],
        cn: Option<&str>,
        expired: bool,
    ) -> anyhow::Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = uris
            .iter()
            .map(|uri| Ok(SanType::URI((*uri).try_into()?)))
            .collect::<Result<_, rcgen::Error>>()?;
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        self.issue(file, params)
    }

    fn issue(&self, file: &str, params: CertificateParams) -> anyhow::Result<Issued> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let issued = Issued {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        // The key first, then the certificate, each replaced whole (a
        // rename), as a Secret's files are: a reader never sees half a file.
        // The key is its owner's alone, as the kubelet mounts it (0400).
        ccm_runtime::files::write_private(&issued.key, key.serialize_pem().as_bytes())?;
        replace(&issued.cert, &cert.pem())?;
        Ok(issued)
    }
}

fn replace(path: &Path, contents: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
