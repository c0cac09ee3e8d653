//! The `main` the gateway and every controller share: parse flags (with a config
//! file under them), check them all, start logging, run until SIGTERM.
//! Invalid settings exit with code 2 and list every problem.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::config_checks::Problems;
use crate::telemetry;

/// How long a process may drain after the first shutdown signal: inside
/// Kubernetes' default grace period of 30 s.
const DRAIN: Duration = Duration::from_secs(10);

/// Runs a binary: `resolve` checks the parsed flags into settings, `log`
/// says how to log and where to send traces, `run` does the work until the
/// token is cancelled.
pub fn main<A, S, R, Fut>(
    name: &str,
    resolve: impl FnOnce(&A) -> Result<S, Problems>,
    log: impl FnOnce(&S) -> telemetry::Options,
    run: R,
) -> ExitCode
where
    A: Parser,
    R: FnOnce(S, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let settings =
        match crate::layered_config::resolve_from::<A, S>(std::env::args_os().collect(), resolve) {
            Ok(settings) => settings,
            Err(problems) => {
                eprint!("{name}: {problems}");
                return ExitCode::from(2);
            }
        };
    install_crypto_provider();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{name}: start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    {
        // The trace exporter's connection is made on this runtime.
        let _inside = runtime.enter();
        let mut options = log(&settings);
        if options.service.is_empty() {
            options.service = name.to_owned();
        }
        telemetry::init(&options);
    }
    let result = runtime.block_on(async {
        let shutdown = crate::shutdown::on_signals()?;
        let run = run(settings, shutdown.clone());
        // Draining is bounded: whatever still waits after DRAIN (a call
        // whose client went away, a cloud request that hangs) is dropped.
        let deadline = async {
            shutdown.cancelled().await;
            tokio::time::sleep(DRAIN).await;
        };
        tokio::select! {
            result = run => result,
            _ = deadline => {
                tracing::warn!("still draining {DRAIN:?} after the shutdown signal; exiting");
                Ok(())
            }
        }
    });
    // Spans still buffered go out before the runtime their connection
    // runs on stops.
    {
        let _inside = runtime.enter();
        telemetry::flush();
    }
    // Tasks left running are dropped; nothing blocks the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => {
            tracing::info!("{name} stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "{name} failed");
            ExitCode::FAILURE
        }
    }
}

/// Installs ring as the process's one rustls crypto provider. kube, tonic
/// and the AWS SDK all use rustls; should two providers ever be compiled
/// in, rustls would refuse to pick one and panic at the first TLS
/// connection. Calling it again is harmless.
pub fn install_crypto_provider() {
    // An error means a provider is installed already, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
