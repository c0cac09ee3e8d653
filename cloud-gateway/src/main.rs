use std::process::ExitCode;

use cloud_gateway::Gateway;
use cloud_gateway::settings::{Args, Settings};

fn main() -> ExitCode {
    ccm_runtime::process::main::<Args, Settings, _, _>(
        "cloud-gateway",
        Settings::from_args,
        |s| (s.log_format, s.log_level.clone()),
        |settings, shutdown| async move {
            let gateway = Gateway::start(settings, shutdown).await?;
            gateway.wait().await
        },
    )
}
