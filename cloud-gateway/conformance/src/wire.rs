//! Calls below the typed client: bytes sent as they are, and a bare HTTP/2
//! call whose deadline no client library enforces first.

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use ccm_proto::{GatewayClient, TokenSource};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// Passes bytes through untouched, to send what is not a message.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// One unary call of `path` with `body` sent as it is.
pub(crate) async fn raw_unary(
    client: &GatewayClient,
    path: &'static str,
    body: Bytes,
) -> Result<Bytes, Status> {
    let channel = client
        .authorized_channel()
        .map_err(|e| Status::internal(e.to_string()))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    grpc.unary(
        tonic::Request::new(body),
        http::uri::PathAndQuery::from_static(path),
        RawCodec,
    )
    .await
    .map(|r| r.into_inner())
}

/// The gRPC path of `Instances/GetInstances`.
pub(crate) const GET_INSTANCES: &str = "/cloudgateway.v1.Instances/GetInstances";

/// A gRPC message on the wire: uncompressed flag, length, message.
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

/// A connection to the gateway: over TLS trusting `tls_ca` for
/// `https://`, in clear for `http://`.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

async fn connect(address: &str, tls_ca: Option<&std::path::Path>) -> Result<Box<dyn Io>, String> {
    let uri: http::Uri = address.parse().map_err(|e| format!("{address}: {e}"))?;
    let host = uri.host().unwrap_or_default().to_owned();
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| format!("connect {authority}: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Ok(Box::new(tcp));
    }
    let ca = tls_ca.ok_or("https needs --tls-ca")?;
    let pem = std::fs::read(ca).map_err(|e| format!("read {}: {e}", ca.display()))?;
    let config = ccm_runtime::tls::client_config(
        &pem,
        &ca.display().to_string(),
        None,
        &[ccm_runtime::tls::ALPN_H2],
    )
    .map_err(|e| format!("{e:#}"))?;
    let name = rustls::pki_types::ServerName::try_from(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    )
    .map_err(|e| format!("{host}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {authority}: {e}"))?;
    Ok(Box::new(tls))
}

/// One unary call over a bare HTTP/2 connection with `grpc-timeout` set to
/// `deadline`: a gRPC client library would enforce that deadline itself and
/// hide what the gateway does at it. Returns the gateway's code and how long
/// it took to answer.
pub(crate) async fn call_with_deadline(
    address: &str,
    tls_ca: Option<&std::path::Path>,
    token: &TokenSource,
    path: &str,
    message: &[u8],
    deadline: Duration,
) -> Result<(Code, Duration), String> {
    let token = match token {
        TokenSource::Static(token) => token.clone(),
        TokenSource::File(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("read {}: {e}", path.display()))?
            .trim()
            .to_owned(),
        TokenSource::None => return Err("the deadline check needs a token".into()),
    };
    let (send, connection) = h2::client::handshake(connect(address, tls_ca).await?)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    let driver = tokio::spawn(connection);
    let request = http::Request::post(format!("{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .header("grpc-timeout", format!("{}m", deadline.as_millis()))
        .body(())
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let answer = async {
        let mut send = send.ready().await?;
        let (response, mut body) = send.send_request(request, false)?;
        body.send_data(grpc_frame(message), true)?;
        let response = response.await?;
        let status = |headers: &http::HeaderMap| {
            headers
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map(Code::from_i32)
        };
        if let Some(code) = status(response.headers()) {
            return Ok::<_, h2::Error>(code);
        }
        let mut body = response.into_body();
        while let Some(data) = body.data().await {
            data?;
        }
        Ok(body
            .trailers()
            .await?
            .as_ref()
            .and_then(status)
            .unwrap_or(Code::Unknown))
    };
    let answer = tokio::time::timeout(deadline + Duration::from_secs(5), answer).await;
    driver.abort();
    match answer {
        Ok(Ok(code)) => Ok((code, started.elapsed())),
        Ok(Err(e)) => Err(format!("the call failed at the HTTP/2 level: {e}")),
        Err(_) => Err(format!("no answer 5 s after a deadline of {deadline:?}")),
    }
}
