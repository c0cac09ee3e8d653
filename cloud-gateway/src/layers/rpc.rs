//! The tower layer that counts and times every gRPC request by method and
//! code, and answers a call whose `grpc-timeout` passes with
//! `DEADLINE_EXCEEDED`. It sits outside auth, so refused calls are counted
//! too.

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tower::{Layer, Service};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::metrics::{MethodLabels, Metrics, RpcLabels};

/// Counts and times requests.
#[derive(Clone)]
pub struct RpcLayer {
    metrics: Metrics,
}

impl RpcLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for RpcLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`RpcLayer`] makes.
#[derive(Clone)]
pub struct MetricsService<S> {
    inner: S,
    metrics: Metrics,
}

/// Keeps label cardinality bounded: unknown paths are one label.
fn method_label(path: &str) -> String {
    let known = [
        "/cloudgateway.v1.",
        "/clusterautoscaler.cloudprovider.v1.externalgrpc.",
        "/grpc.health.v1.",
        "/grpc.reflection.",
    ];
    if known.iter().any(|p| path.starts_with(p)) && path.len() < 128 {
        path.to_owned()
    } else {
        "unknown".to_owned()
    }
}

/// The caller's deadline from the `grpc-timeout` header: at most 8 digits
/// and a unit (gRPC over HTTP/2). Anything else is no deadline.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for MetricsService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let method = method_label(req.uri().path());
        let metrics = self.metrics.clone();
        let start = Instant::now();
        let deadline = grpc_timeout(req.headers());
        // A contract call continues the caller's trace (W3C trace context
        // in its metadata); health and reflection calls are not traced.
        let span = if req.uri().path().starts_with("/cloudgateway.v1.") {
            let parent = opentelemetry::global::get_text_map_propagator(|p| {
                p.extract(&ccm_runtime::telemetry::HeaderExtractor(req.headers()))
            });
            let span = tracing::info_span!(
                target: ccm_proto::CALL_SPANS,
                "grpc request",
                otel.name = method.trim_start_matches('/'),
                otel.kind = "server",
                rpc.method = method.as_str(),
                rpc.grpc.status_code = tracing::field::Empty,
            );
            let _ = span.set_parent(parent);
            span
        } else {
            tracing::Span::none()
        };
        let future = span
            .in_scope(|| self.inner.call(req))
            .instrument(span.clone());
        // tonic's server runs the same timer, but answers CANCELLED when it
        // fires; the contract (and gRPC) say DEADLINE_EXCEEDED. This sleep
        // starts before tonic's, so it fires first and the call's work is
        // dropped with it.
        let expired = deadline.map(|d| Box::pin(tokio::time::sleep(d)));
        Box::pin(async move {
            let result = match expired {
                None => future.await,
                Some(expired) => tokio::select! {
                    biased;
                    result = future => result,
                    () = expired => Ok(tonic::Status::deadline_exceeded(format!(
                        "the caller's deadline of {:?} passed",
                        deadline.unwrap_or_default()
                    ))
                    .into_http()),
                },
            };
            // Unary errors are "trailers-only" responses: the code is in
            // the headers. No grpc-status header means the call succeeded.
            let code = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or(tonic::Code::Ok, tonic::Code::from_i32),
                Err(_) => tonic::Code::Unknown,
            };
            span.record("rpc.grpc.status_code", code as i32);
            metrics.count_served(&method, code == tonic::Code::Ok);
            metrics
                .grpc_requests
                .get_or_create(&RpcLabels {
                    method: method.clone(),
                    code: format!("{code:?}"),
                })
                .inc();
            metrics
                .grpc_duration
                .get_or_create(&MethodLabels { method })
                .observe(start.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Option<Duration> {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().unwrap());
        grpc_timeout(&headers)
    }

    #[test]
    fn the_services_served_keep_their_method_names_and_other_paths_are_one_label() {
        for path in [
            "/cloudgateway.v1.Instances/GetInstances",
            "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/NodeGroups",
            "/grpc.health.v1.Health/Check",
        ] {
            assert_eq!(method_label(path), path);
        }
        for path in [
            "/evil.Service/Method",
            "/",
            &format!("/cloudgateway.v1.{}", "x".repeat(200)),
        ] {
            assert_eq!(method_label(path), "unknown", "{path}");
        }
    }

    #[test]
    fn grpc_timeout_values_of_every_unit_and_garbage_is_none() {
        assert_eq!(parse("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(parse("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "123456789m", "12x", "-1S", "1.5S", "ms"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }
}
