use std::process::ExitCode;

use node_controller::args::{Args, Settings};

fn main() -> ExitCode {
    ccm_runtime::process::main::<Args, Settings, _, _>(
        "node-controller",
        Settings::from_args,
        |s| s.common.telemetry(),
        |settings, shutdown| async move {
            node_controller::start(settings, shutdown)
                .await?
                .wait()
                .await
        },
    )
}
