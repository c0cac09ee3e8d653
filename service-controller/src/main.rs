use std::process::ExitCode;

use service_controller::args::{Args, Settings};

fn main() -> ExitCode {
    ccm_runtime::process::main::<Args, Settings, _, _>(
        "service-controller",
        Settings::from_args,
        |s| s.common.telemetry(),
        |settings, shutdown| async move {
            service_controller::start(settings, shutdown)
                .await?
                .wait()
                .await
        },
    )
}
