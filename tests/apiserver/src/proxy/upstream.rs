//! The proxy's side of the conversation with a backend: a minimal HTTP/1.1
//! client, over TCP ([`exchange`]) or any stream already open, such as a
//! TLS one ([`exchange_over`]). One request per connection
//! (`Connection: close`); the answer is
//! read whole, bounded in size ([`MAX_ANSWER`]) and in time, its body framed
//! by `Content-Length`, `Transfer-Encoding: chunked` or the end of the
//! connection. Errors are worded as Go's dialer and HTTP client word them,
//! since kube-apiserver passes those on (`dial tcp ADDR: connect:
//! connection refused`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::StatusCode;
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::net::TcpStream;

/// The most an answer may hold, head and body together.
pub const MAX_ANSWER: u64 = 64 << 20;

/// A request as it goes on the wire.
pub struct Request<'a> {
    pub method: &'a str,
    /// The path and query, as the request line carries them.
    pub target: &'a str,
    /// Headers besides `Host`, `Content-Length` and `Connection`, which
    /// are set here.
    pub headers: Vec<(&'a str, &'a [u8])>,
    pub body: &'a [u8],
}

/// What the backend answered.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// In the order received; names as sent.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// Sends `request` to `addr` and reads the answer, all within `deadline`.
pub async fn exchange(
    addr: SocketAddr,
    request: &Request<'_>,
    deadline: Duration,
) -> Result<Answer, String> {
    tokio::time::timeout(deadline, talk(addr, request))
        .await
        .unwrap_or_else(|_| Err(format!("no answer from {addr} within {deadline:?}")))
}

async fn talk(addr: SocketAddr, request: &Request<'_>) -> Result<Answer, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("dial tcp {addr}: connect: {}", describe(&e)))?;
    exchange_over(stream, &addr.to_string(), request).await
}

/// Sends `request` over `stream`, open to `host` (which the `Host` header
/// and errors name), and reads the answer. Unbounded in time: the caller
/// sets the deadline.
pub async fn exchange_over(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    host: &str,
    request: &Request<'_>,
) -> Result<Answer, String> {
    let written = async {
        stream.write_all(&encode(host, request)).await?;
        // A TLS stream holds what it was given until flushed.
        stream.flush().await
    };
    written
        .await
        .map_err(|e| format!("write tcp {host}: {}", describe(&e)))?;
    let mut reader = BufReader::new(stream.take(MAX_ANSWER));
    // Interim answers (100 Continue and the like) precede the real one.
    let (status, headers) = loop {
        let (status, headers) = read_head(&mut reader).await?;
        if !status.is_informational() || status == StatusCode::SWITCHING_PROTOCOLS {
            break (status, headers);
        }
    };
    let body = match framing(request.method, status, &headers)? {
        Framing::Empty => Vec::new(),
        Framing::Length(n) => read_length(&mut reader, n).await?,
        Framing::Chunked => read_chunked(&mut reader).await?,
        Framing::UntilClose => {
            let mut body = Vec::new();
            reader.read_to_end(&mut body).await.map_err(read_error)?;
            body
        }
    };
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// An I/O error in the lower-case words Go uses for the common ones.
fn describe(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::ConnectionReset => "connection reset by peer".into(),
        _ => e.to_string(),
    }
}

fn read_error(e: std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "unexpected EOF".into(),
        _ => format!("read: {}", describe(&e)),
    }
}

/// The request's bytes: line, headers, body.
fn encode(host: &str, request: &Request<'_>) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\n",
        request.method, request.target
    )
    .into_bytes();
    for (name, value) in &request.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !request.body.is_empty() || matches!(request.method, "POST" | "PUT" | "PATCH") {
        out.extend_from_slice(format!("Content-Length: {}\r\n", request.body.len()).as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(request.body);
    out
}

/// One line without its line end; EOF before a line end is an error.
async fn read_line(reader: &mut (impl AsyncBufRead + Unpin)) -> Result<Vec<u8>, String> {
    let mut line = Vec::new();
    reader
        .read_until(b'\n', &mut line)
        .await
        .map_err(read_error)?;
    if line.pop() != Some(b'\n') {
        return Err("unexpected EOF".into());
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(line)
}

/// The status line and headers.
async fn read_head(
    reader: &mut (impl AsyncBufRead + Unpin),
) -> Result<(StatusCode, Vec<(String, Vec<u8>)>), String> {
    let line = read_line(reader).await?;
    let status = parse_status(&line).ok_or_else(|| {
        format!(
            "malformed HTTP response {:?}",
            String::from_utf8_lossy(&line)
        )
    })?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader).await?;
        if line.is_empty() {
            return Ok((status, headers));
        }
        let colon = line.iter().position(|b| *b == b':').ok_or_else(|| {
            format!(
                "malformed MIME header line: {}",
                String::from_utf8_lossy(&line)
            )
        })?;
        let (name, value) = line.split_at(colon);
        headers.push((
            String::from_utf8_lossy(name).trim().to_owned(),
            value[1..].trim_ascii().to_vec(),
        ));
    }
}

/// `HTTP/1.1 200 OK` → 200.
fn parse_status(line: &[u8]) -> Option<StatusCode> {
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split(' ');
    if !words.next()?.starts_with("HTTP/1.") {
        return None;
    }
    StatusCode::from_bytes(words.next()?.as_bytes()).ok()
}

/// How an answer's body is delimited (RFC 9112 §6.3).
#[derive(Debug, PartialEq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

fn header<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn framing(
    method: &str,
    status: StatusCode,
    headers: &[(String, Vec<u8>)],
) -> Result<Framing, String> {
    if method == "HEAD"
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if let Some(codings) = header(headers, "transfer-encoding") {
        let last = codings.rsplit(|b| *b == b',').next().unwrap_or_default();
        if last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            return Ok(Framing::Chunked);
        }
        return Ok(Framing::UntilClose);
    }
    let Some(length) = header(headers, "content-length") else {
        return Ok(Framing::UntilClose);
    };
    let length: u64 = std::str::from_utf8(length)
        .ok()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| format!("bad Content-Length {:?}", String::from_utf8_lossy(length)))?;
    if length > MAX_ANSWER {
        return Err(too_large());
    }
    Ok(Framing::Length(length))
}

fn too_large() -> String {
    format!("the answer is larger than the test API server's limit of {MAX_ANSWER} bytes")
}

async fn read_length(
    reader: &mut (impl AsyncBufRead + Unpin),
    length: u64,
) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    reader
        .take(length)
        .read_to_end(&mut body)
        .await
        .map_err(read_error)?;
    if (body.len() as u64) < length {
        return Err("unexpected EOF".into());
    }
    Ok(body)
}

async fn read_chunked(reader: &mut (impl AsyncBufRead + Unpin)) -> Result<Vec<u8>, String> {
    let malformed = || "malformed chunked encoding".to_owned();
    let mut body = Vec::new();
    loop {
        let line = read_line(reader).await?;
        let size = std::str::from_utf8(&line)
            .ok()
            .and_then(|l| l.split(';').next())
            .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
            .ok_or_else(malformed)?;
        if size == 0 {
            // Trailers, if any, up to the empty line; a backend that
            // closes without it has still sent the whole body.
            while let Ok(line) = read_line(reader).await
                && !line.is_empty()
            {}
            return Ok(body);
        }
        if body.len() as u64 + size > MAX_ANSWER {
            return Err(too_large());
        }
        let chunk = read_length(reader, size).await?;
        body.extend_from_slice(&chunk);
        if !read_line(reader).await?.is_empty() {
            return Err(malformed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A backend that answers any request with `answer` (or never, if
    /// `None`), then closes.
    async fn backend(answer: Option<&'static [u8]>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 4096];
            let _ = conn.read(&mut request).await;
            match answer {
                Some(bytes) => conn.write_all(bytes).await.unwrap(),
                None => tokio::time::sleep(Duration::from_secs(60)).await,
            }
        });
        addr
    }

    fn get() -> Request<'static> {
        Request {
            method: "GET",
            target: "/metrics?x=1",
            headers: vec![("Accept", b"text/plain")],
            body: b"",
        }
    }

    async fn ask(answer: &'static [u8]) -> Result<Answer, String> {
        exchange(backend(Some(answer)).await, &get(), Duration::from_secs(5)).await
    }

    #[test]
    fn requests_carry_host_length_and_close() {
        let addr = "10.0.0.1:8080";
        let post = Request {
            method: "POST",
            target: "/x",
            headers: vec![("Content-Type", b"application/json")],
            body: b"{}",
        };
        assert_eq!(
            String::from_utf8(encode(addr, &post)).unwrap(),
            "POST /x HTTP/1.1\r\nHost: 10.0.0.1:8080\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );
        let get = String::from_utf8(encode(addr, &get())).unwrap();
        assert!(!get.contains("Content-Length"), "{get}");
        assert!(get.starts_with("GET /metrics?x=1 HTTP/1.1\r\n"), "{get}");
    }

    #[tokio::test]
    async fn bodies_are_framed_by_length_chunks_or_close() {
        let sized = ask(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello, and more")
            .await
            .unwrap();
        assert_eq!(sized.status, 200);
        assert_eq!(sized.body, b"hello");
        assert_eq!(
            header(&sized.headers, "content-type"),
            Some(&b"text/plain"[..])
        );
        let chunked = ask(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(chunked.body, b"hello, world");
        let closed = ask(b"HTTP/1.0 418 I'm a teapot\r\n\r\nshort and stout")
            .await
            .unwrap();
        assert_eq!(closed.status, 418);
        assert_eq!(closed.body, b"short and stout");
        let interim = ask(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(interim.status, 204);
        assert!(interim.body.is_empty());
    }

    #[tokio::test]
    async fn broken_answers_are_errors_not_panics() {
        for (answer, want) in [
            (&b"SSH-2.0-OpenSSH\r\n\r\n"[..], "malformed HTTP response"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
                "unexpected EOF",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                "bad Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "malformed chunked",
            ),
            (
                b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
                "malformed MIME header",
            ),
            (b"HTTP/1.1 200 OK\r\n", "unexpected EOF"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
                "larger than",
            ),
        ] {
            let err = ask(answer).await.unwrap_err();
            assert!(err.contains(want), "{err} (wanted {want})");
        }
    }

    #[tokio::test]
    async fn a_refused_or_silent_backend_is_an_error_in_time() {
        let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let err = exchange(addr, &get(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err, format!("dial tcp {addr}: connect: connection refused"));
        let silent = backend(None).await;
        let err = exchange(silent, &get(), Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(err.contains("no answer") && err.contains("200ms"), "{err}");
    }
}
