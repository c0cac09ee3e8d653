//! The tower layer that counts and times every gRPC request by method and
//! code. It sits outside auth, so refused calls are counted too.

use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use tower::{Layer, Service};

use crate::metrics::{MethodLabels, Metrics, RpcLabels};

/// Counts and times requests.
#[derive(Clone)]
pub struct MetricsLayer {
    metrics: Metrics,
}

impl MetricsLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`MetricsLayer`] makes.
#[derive(Clone)]
pub struct MetricsService<S> {
    inner: S,
    metrics: Metrics,
}

/// Keeps label cardinality bounded: unknown paths are one label.
fn method_label(path: &str) -> String {
    let known = ["/cloudgateway.v1.", "/grpc.health.v1.", "/grpc.reflection."];
    if known.iter().any(|p| path.starts_with(p)) && path.len() < 128 {
        path.to_owned()
    } else {
        "unknown".to_owned()
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for MetricsService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
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
        let future = self.inner.call(req);
        Box::pin(async move {
            let result = future.await;
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
