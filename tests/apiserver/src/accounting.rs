//! What each caller asked of the API server and what it was sent back:
//! `GET /debug/requests` (`DELETE` starts the count again). A benchmark
//! reads how many writes a controller made, how many LIST pages it read,
//! and how many bytes it was sent, watch streams included, as a real
//! server's audit log and `apiserver_response_sizes` would tell.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, Uri};
use axum::response::Response;
use http_body::Body as _;
use serde_json::{Value, json};
use tokio_stream::StreamExt;

/// One caller's counts.
#[derive(Default)]
struct Caller {
    /// `verb resource[/subresource]`, kube-apiserver's audit verbs.
    requests: BTreeMap<String, u64>,
    /// Body bytes sent, shared with the streams still sending.
    bytes: Arc<AtomicU64>,
    /// The largest whole (not streamed) response.
    largest: u64,
}

/// Every caller's counts, by user name.
#[derive(Default)]
pub struct Accounting {
    callers: Mutex<BTreeMap<String, Caller>>,
}

/// The audit verb of a request on a resource path: `get`, `list`,
/// `watch`, `create`, `update`, `patch` or `delete`.
pub fn verb(method: &Method, uri: &Uri, named: bool) -> &'static str {
    let watching = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .any(|p| matches!(p, "watch=true" | "watch=1"));
    match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

impl Accounting {
    /// Counts one request of `user` (`what`: verb and resource) and the
    /// bytes of its response, as they are sent.
    pub fn count(&self, user: &str, what: String, response: Response) -> Response {
        let bytes = {
            let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
            let caller = callers.entry(user.to_owned()).or_default();
            *caller.requests.entry(what).or_default() += 1;
            if let Some(size) = response.body().size_hint().exact() {
                caller.bytes.fetch_add(size, Ordering::Relaxed);
                caller.largest = caller.largest.max(size);
                return response;
            }
            caller.bytes.clone()
        };
        let (parts, body) = response.into_parts();
        let counted = body.into_data_stream().map(move |chunk| {
            if let Ok(chunk) = &chunk {
                bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            chunk
        });
        Response::from_parts(parts, Body::from_stream(counted))
    }

    /// Every caller's counts.
    pub fn report(&self) -> Value {
        let callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        callers
            .iter()
            .map(|(user, c)| {
                (
                    user.clone(),
                    json!({
                        "requests": c.requests,
                        "bytes": c.bytes.load(Ordering::Relaxed),
                        "largest_response_bytes": c.largest,
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// Starts every count again; streams still open count into the new
    /// count from here on.
    pub fn reset(&self) {
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        for caller in callers.values_mut() {
            caller.requests.clear();
            caller.bytes.store(0, Ordering::Relaxed);
            caller.largest = 0;
        }
    }
}
