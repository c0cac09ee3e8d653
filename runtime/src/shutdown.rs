//! Graceful shutdown: the first SIGTERM or SIGINT cancels the returned
//! token (stop taking work, finish what is in flight, report not ready); a
//! second signal exits at once.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Exit code of a process stopped by a second signal.
const FORCED_EXIT_CODE: i32 = 130;

/// Starts listening for SIGTERM and SIGINT and returns the token the first
/// one cancels.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received; draining (a second signal exits at once)");
        cancel.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second shutdown signal; exiting now");
        std::process::exit(FORCED_EXIT_CODE);
    });
    Ok(token)
}

/// Runs `work` until it finishes or `shutdown` is cancelled, whichever
/// comes first: `None` when shutdown came first. Every wait of unknown
/// length (for the gateway, the API server, a cache to sync) goes through
/// it, so the first SIGTERM ends it.
pub async fn or_shutdown<F: std::future::Future>(
    shutdown: &CancellationToken,
    work: F,
) -> Option<F::Output> {
    tokio::select! {
        out = work => Some(out),
        _ = shutdown.cancelled() => None,
    }
}
