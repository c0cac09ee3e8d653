//! Logging through `tracing`, plain or JSON. Libraries never install a
//! subscriber; binaries call [`init`] once.

use std::fmt;
use std::str::FromStr;

use tracing_subscriber::EnvFilter;

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

fn hold_at_info(mut filter: EnvFilter, directives: &str) -> EnvFilter {
    for target in HELD_AT_INFO {
        if !directives.contains(target)
            && let Ok(directive) = format!("{target}=info").parse()
        {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// Installs the global subscriber. `RUST_LOG`, when set, wins over
/// `directives`. Calling it twice is harmless (tests do).
pub fn init(format: LogFormat, directives: &str) {
    let from_env = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    let directives = from_env.as_deref().unwrap_or(directives);
    let filter = EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info"));
    let filter = hold_at_info(filter, directives);
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
