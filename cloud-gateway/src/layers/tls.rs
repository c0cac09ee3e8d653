//! TLS on the gRPC listener: each accepted connection (already holding a
//! connection slot) is handshaken with the server configuration current
//! at that moment ([`ServerTls`] reloads it from its files), several at
//! once, each within [`HANDSHAKE_TIMEOUT`]. A verified client
//! certificate's identity goes with the connection, into every request's
//! extensions as [`ConnInfo`], for the auth layer.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ccm_runtime::tls::ServerTls;
use futures::{Stream, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use super::client_certs::CertIdentity;
use super::request_limits::Guarded;
use crate::metrics::Metrics;

/// Longest time a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a request knows of its connection.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// The verified client certificate's identity, when one was presented.
    pub client_cert: Option<Arc<CertIdentity>>,
}

/// An accepted connection, in clear (loopback only) or over TLS.
pub enum Conn {
    Plain(Box<Guarded>),
    Tls {
        stream: Box<tokio_rustls::server::TlsStream<Guarded>>,
        client_cert: Option<Arc<CertIdentity>>,
    },
}

/// The connections of `incoming`, handshaken when `tls` is given; those
/// whose handshake fails are counted and dropped.
pub fn secured(
    incoming: impl Stream<Item = io::Result<Guarded>> + Send + 'static,
    tls: Option<ServerTls>,
    concurrent: usize,
    metrics: Metrics,
) -> impl Stream<Item = io::Result<Conn>> + Send + 'static {
    let Some(tls) = tls else {
        return incoming
            .map(|c| c.map(|c| Conn::Plain(Box::new(c))))
            .boxed();
    };
    incoming
        .map(move |accepted| {
            let (acceptor, metrics) = (tls.acceptor(), metrics.clone());
            async move {
                let conn = match accepted {
                    Ok(conn) => conn,
                    Err(e) => return Some(Err(e)),
                };
                let remote = conn.remote();
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(conn)).await {
                    Ok(Ok(stream)) => {
                        let client_cert = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|chain| chain.first())
                            .and_then(|leaf| CertIdentity::from_der(leaf))
                            .map(Arc::new);
                        Some(Ok(Conn::Tls {
                            stream: Box::new(stream),
                            client_cert,
                        }))
                    }
                    Ok(Err(e)) => {
                        metrics.tls_handshake_failures.inc();
                        tracing::debug!(remote = ?remote, error = %e, "TLS handshake failed");
                        None
                    }
                    Err(_) => {
                        metrics.tls_handshake_failures.inc();
                        tracing::debug!(remote = ?remote, "TLS handshake timed out");
                        None
                    }
                }
            }
        })
        .buffer_unordered(concurrent.max(1))
        .filter_map(std::future::ready)
        .boxed()
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        match self {
            Conn::Plain(conn) => ConnInfo {
                remote: conn.remote(),
                client_cert: None,
            },
            Conn::Tls {
                stream,
                client_cert,
            } => ConnInfo {
                remote: stream.get_ref().0.remote(),
                client_cert: client_cert.clone(),
            },
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(conn) => Pin::new(conn.as_mut()).poll_read(cx, buf),
            Conn::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(conn) => Pin::new(conn.as_mut()).poll_write(cx, buf),
            Conn::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(conn) => Pin::new(conn.as_mut()).poll_write_vectored(cx, bufs),
            Conn::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(conn) => conn.is_write_vectored(),
            Conn::Tls { stream, .. } => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(conn) => Pin::new(conn.as_mut()).poll_flush(cx),
            Conn::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(conn) => Pin::new(conn.as_mut()).poll_shutdown(cx),
            Conn::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
