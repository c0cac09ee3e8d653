use std::process::ExitCode;

use clap::Parser;
use cloud_gateway::settings::Settings;
use cloud_gateway::{Args, Gateway};

fn main() -> ExitCode {
    let args = Args::parse();
    let settings = match Settings::from_args(&args) {
        Ok(settings) => settings,
        Err(problems) => {
            eprint!("cloud-gateway: {problems}");
            return ExitCode::from(2);
        }
    };
    ccm_runtime::telemetry::init(settings.log_format, &settings.log_level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cloud-gateway: start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "cloud-gateway failed");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    let shutdown = ccm_runtime::shutdown::on_signals()?;
    let gateway = Gateway::start(settings, shutdown).await?;
    gateway.wait().await?;
    tracing::info!("cloud-gateway stopped");
    Ok(())
}
