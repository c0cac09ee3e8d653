use std::process::ExitCode;

use route_controller::args::{Args, Settings};

fn main() -> ExitCode {
    ccm_runtime::process::main::<Args, Settings, _, _>(
        "route-controller",
        Settings::from_args,
        |s| s.common.telemetry(),
        |settings, shutdown| async move {
            route_controller::start(settings, shutdown)
                .await?
                .wait()
                .await
        },
    )
}
