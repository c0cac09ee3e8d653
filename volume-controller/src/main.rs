use std::process::ExitCode;

use volume_controller::args::{Args, Settings};

fn main() -> ExitCode {
    ccm_runtime::process::main::<Args, Settings, _, _>(
        "volume-controller",
        Settings::from_args,
        |s| s.common.telemetry(),
        |settings, shutdown| async move {
            volume_controller::start(settings, shutdown)
                .await?
                .wait()
                .await
        },
    )
}
