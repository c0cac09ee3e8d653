//! Logging through `tracing`, plain or JSON, and, when an OTLP endpoint is
//! configured, the same spans exported as OpenTelemetry traces with W3C
//! trace context carried across processes. Libraries never install a
//! subscriber; binaries call [`init`] once, inside their runtime.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line, for log collectors.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "plain" => Ok(Self::Plain),
            "json" => Ok(Self::Json),
            other => Err(format!("{other:?} is not a log format; use plain or json")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Plain => "plain",
            Self::Json => "json",
        })
    }
}

/// Checks a log filter directive such as `info` or `info,cloud_gateway=debug`.
pub fn parse_filter(directives: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(directives).map_err(|e| format!("{directives:?} is not a log filter: {e}"))
}

/// Libraries whose debug lines carry request details (the AWS SDK's show
/// the access key ID): held at `info` unless a directive names them, so
/// `--log-level debug` never puts credentials in a log.
const HELD_AT_INFO: &[&str] = &[
    "aws_config",
    "aws_credential_types",
    "aws_runtime",
    "aws_sdk_ec2",
    "aws_sdk_sts",
    "aws_sigv4",
    "aws_smithy_http_client",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
];

/// What the log filter holds beyond the operator's `directives`, for each
/// target they do not name: the libraries of [`HELD_AT_INFO`] at their
/// default level but never above `info`; and, when nothing in the log is
/// above `info`, no gateway call spans ([`ccm_proto::CALL_SPANS`]): they
/// are for traces, and at `debug` they give the log lines their context.
fn held_directives(directives: &str) -> Vec<String> {
    use tracing_subscriber::filter::LevelFilter;
    // A directive list without a bare level logs nothing else.
    let default = directives
        .split(',')
        .filter_map(|d| d.trim().parse::<LevelFilter>().ok())
        .next_back()
        .unwrap_or(LevelFilter::OFF);
    let held = default.min(LevelFilter::INFO);
    let mut out: Vec<String> = HELD_AT_INFO
        .iter()
        .filter(|target| !directives.contains(*target))
        .map(|target| format!("{target}={held}"))
        .collect();
    let quiet = EnvFilter::try_new(directives)
        .ok()
        .and_then(|filter| filter.max_level_hint())
        .is_some_and(|most| most <= LevelFilter::INFO);
    if quiet && !directives.contains(ccm_proto::CALL_SPANS) {
        out.push(format!("{}=off", ccm_proto::CALL_SPANS));
    }
    out
}

/// How a process logs and traces.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub format: LogFormat,
    /// Log filter directives (see [`parse_filter`]).
    pub directives: String,
    /// Where to send traces over OTLP/gRPC (`--otlp-endpoint`, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`); `None` turns tracing export off, with
    /// no exporter, no propagator and no span bookkeeping for it.
    pub otlp_endpoint: Option<String>,
    /// The service name traces carry (`OTEL_SERVICE_NAME` wins).
    pub service: String,
}

/// Checks an OTLP endpoint: an `http://` or `https://` URL.
pub fn parse_otlp_endpoint(value: &str) -> Result<String, String> {
    let ok = (value.starts_with("http://") || value.starts_with("https://"))
        && value.parse::<http::Uri>().is_ok_and(|u| u.host().is_some());
    if ok {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not an OTLP endpoint; use http://host:4317 or https://host:4317"
        ))
    }
}

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Installs the global subscriber. `RUST_LOG`, when set, wins over the
/// directives. Calling it twice is harmless (tests do). With an OTLP
/// endpoint it must run inside a tokio runtime (the exporter's connection
/// lives there).
pub fn init(options: &Options) {
    let from_env = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    let directives = from_env.as_deref().unwrap_or(&options.directives);
    let (directives, filter) = match EnvFilter::try_new(directives) {
        Ok(filter) => (directives, filter),
        Err(_) => ("info", EnvFilter::new("info")),
    };
    let filter = held_directives(directives)
        .iter()
        .filter_map(|d| d.parse().ok())
        .fold(filter, EnvFilter::add_directive);
    use std::io::IsTerminal;
    use tracing_subscriber::Layer as _;
    let ansi = std::io::stderr().is_terminal();
    // The log filter is the log's own: spans a trace needs are kept even
    // when the log shows warnings only.
    let logs = match options.format {
        LogFormat::Plain => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(filter);
    let traces = options.otlp_endpoint.as_deref().and_then(|endpoint| {
        match tracer_provider(endpoint, &options.service) {
            Ok(provider) => {
                let tracer = provider.tracer(options.service.clone());
                let _ = PROVIDER.set(provider);
                opentelemetry::global::set_text_map_propagator(
                    opentelemetry_sdk::propagation::TraceContextPropagator::new(),
                );
                Some(
                    tracing_opentelemetry::layer()
                        .with_tracer(tracer)
                        .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
                )
            }
            Err(e) => {
                eprintln!("traces: {e}; not exporting");
                None
            }
        }
    });
    // Two branches, not an `Option` layer: a `None` layer says every
    // callsite is of interest, so every span would be built for no one.
    let registry = tracing_subscriber::registry().with(logs);
    let _ = match traces {
        Some(traces) => registry.with(traces).try_init(),
        None => registry.try_init(),
    };
}

fn tracer_provider(endpoint: &str, service: &str) -> anyhow::Result<SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        // A collector that is down must not hold the exit up for long.
        .with_timeout(std::time::Duration::from_secs(3))
        .build()?;
    let name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| service.to_owned());
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(name)
                .build(),
        )
        .build())
}

/// Sends the spans still buffered; call once at exit. Nothing without an
/// endpoint.
pub fn flush() {
    if let Some(provider) = PROVIDER.get() {
        let _ = provider.shutdown();
    }
}

/// Reads W3C trace context from gRPC or HTTP headers.
pub struct HeaderExtractor<'a>(pub &'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_that_log_credentials_are_held_at_info_or_below() {
        let held = |directives| held_directives(directives);
        assert!(held("debug").contains(&"aws_sigv4=info".to_owned()));
        assert!(held("trace").contains(&"aws_sdk_ec2=info".to_owned()));
        // Held, never raised: a quiet log stays quiet.
        assert!(held("warn").contains(&"aws_sigv4=warn".to_owned()));
        assert!(held("cloud_gateway=debug").contains(&"aws_sigv4=off".to_owned()));
        // A target the operator names is theirs.
        assert!(
            !held("debug,aws_sigv4=trace")
                .iter()
                .any(|d| d.starts_with("aws_sigv4="))
        );
    }

    #[test]
    fn call_spans_are_left_out_of_a_log_at_info_or_quieter() {
        let off = format!("{}=off", ccm_proto::CALL_SPANS);
        for quiet in ["info", "warn", "error,cloud_gateway=info", "off"] {
            assert!(held_directives(quiet).contains(&off), "{quiet}");
        }
        for verbose in [
            "debug",
            "info,cloud_gateway=debug",
            "trace",
            "warn,ccm_calls=info",
            // A bare target means every level of it.
            "info,cloud_gateway",
        ] {
            assert!(!held_directives(verbose).contains(&off), "{verbose}");
        }
    }

    #[test]
    fn an_otlp_endpoint_is_an_http_or_https_url_with_a_host() {
        for ok in [
            "http://otel-collector:4317",
            "https://collector.example:4317",
        ] {
            assert_eq!(parse_otlp_endpoint(ok).as_deref(), Ok(ok));
        }
        for bad in [
            "otel-collector:4317",
            "grpc://collector:4317",
            "http://",
            "",
        ] {
            let err = parse_otlp_endpoint(bad).unwrap_err();
            assert!(err.contains("http://host:4317"), "{bad}: {err}");
        }
    }
}
