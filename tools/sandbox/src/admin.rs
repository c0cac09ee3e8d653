//! A GET on an admin endpoint (`/livez`, `/metrics`, `/debug/status`) or a
//! probe. Admin ports serve HTTPS only: the certificate is not verified
//! here, as kubelet's probes and kube-apiserver's proxy do not verify it
//! (the tools ask what a port answers, not whom they reached); `/metrics`
//! and `/debug/*` need a bearer token.

use std::sync::Arc;

use kube_test_apiserver::front_proxy::AnyServer;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// `GET path` on the admin port at `addr` over HTTPS, with `token` as the
/// bearer token when given: `(status, body)`, or the connection's failure.
pub async fn admin_get(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut config = rustls::ClientConfig::builder_with_provider(ccm_runtime::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer::new()))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from("localhost").expect("a DNS name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    exchange(tls, path, token).await
}

/// A plain HTTP GET (a server that is not an admin port): `(status,
/// body)`, or the connection's failure.
pub async fn try_http_get(
    addr: std::net::SocketAddr,
    path: &str,
) -> std::io::Result<(u16, String)> {
    exchange(tokio::net::TcpStream::connect(addr).await?, path, None).await
}

async fn exchange(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    stream.flush().await?;
    let mut bytes = Vec::new();
    // A TLS peer that closes without close_notify still gave its answer.
    match stream.read_to_end(&mut bytes).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !bytes.is_empty() => {}
        Err(e) => return Err(e),
    }
    let response = String::from_utf8_lossy(&bytes);
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
