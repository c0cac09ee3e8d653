use std::process::ExitCode;

use cloud_gateway::Gateway;
use cloud_gateway::settings::{Args, Settings};

fn main() -> ExitCode {
    ccm_runtime::process::main::<Args, Settings, _, _>(
        "cloud-gateway",
        Settings::from_args,
        |s| ccm_runtime::telemetry::Options {
            format: s.log_format,
            directives: s.log_level.clone(),
            otlp_endpoint: s.otlp_endpoint.clone(),
            service: String::new(),
        },
        |settings, shutdown| async move {
            let gateway = Gateway::start(settings, shutdown).await?;
            gateway.wait().await
        },
    )
}
