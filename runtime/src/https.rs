//! HTTPS for the axum servers a process runs: a listener whose connections
//! are TLS-handshaken with the [`ServerTls`] configuration current at that
//! moment, several at once and each within [`HANDSHAKE_TIMEOUT`], off the
//! accept loop so a slow client holds up no one else. Each connection
//! carries its [`Peer`]: the remote address and the verified client
//! certificate, when one was presented, which handlers read through
//! `ConnectInfo<Peer>`.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::{IncomingStream, Listener};
use rustls::pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use crate::tls::ServerTls;

/// Longest time a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once, at most.
const CONCURRENT_HANDSHAKES: usize = 64;

/// Who is at the other end of a connection.
#[derive(Clone, Debug)]
pub struct Peer {
    pub remote: SocketAddr,
    /// The leaf of the client's certificate chain, verified by the server's
    /// client verifier; `None` when the client presented none.
    pub client_cert: Option<Arc<CertificateDer<'static>>>,
}

/// A TCP listener whose connections come out TLS-handshaken.
pub struct TlsListener {
    local: SocketAddr,
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, Peer)>,
}

impl TlsListener {
    /// Accepts on `listener` in the background, handshaking with `tls`.
    /// Connections whose handshake fails or times out are dropped and
    /// logged at debug level (a port scan is not news).
    pub fn new(listener: TcpListener, tls: ServerTls) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(CONCURRENT_HANDSHAKES);
        let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, remote) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, as
                        // axum's own accept loop does.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let (acceptor, tx) = (tls.acceptor(), tx.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let client_cert = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|chain| chain.first())
                                .map(|leaf| Arc::new(leaf.clone().into_owned()));
                            let _ = tx
                                .send((
                                    stream,
                                    Peer {
                                        remote,
                                        client_cert,
                                    },
                                ))
                                .await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%remote, error = %e, "TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            local,
            handshaken: rx,
        })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accept loop only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(Peer {
            remote: self.local,
            client_cert: None,
        })
    }
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// The parts of a certificate's subject that name a client: its common
/// names (the front proxy's allowed names are matched against them; a
/// Kubernetes client certificate's username) and its organizations (a
/// Kubernetes client certificate's groups).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    pub common_names: Vec<String>,
    pub organizations: Vec<String>,
}

/// The subject of a DER certificate; empty when it does not parse.
pub fn subject(cert: &CertificateDer<'_>) -> Subject {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Subject::default();
    };
    let strings = |attrs: Vec<&x509_parser::x509::AttributeTypeAndValue<'_>>| {
        attrs
            .into_iter()
            .filter_map(|a| a.as_str().ok().map(str::to_owned))
            .collect()
    };
    Subject {
        common_names: strings(parsed.subject().iter_common_name().collect()),
        organizations: strings(parsed.subject().iter_organization().collect()),
    }
}

/// The subject's common names in a DER certificate.
pub fn common_names(cert: &CertificateDer<'_>) -> Vec<String> {
    subject(cert).common_names
}
