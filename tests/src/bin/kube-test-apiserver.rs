//! `kube-test-apiserver --listen ADDR --kubeconfig FILE`: a Kubernetes API
//! server for tests, the sandbox and people, in memory.

use std::net::SocketAddr;
use std::path::PathBuf;

use ccm_testkit::apiserver::{ApiServer, Config};
use clap::Parser;

/// A Kubernetes API server in memory, for tests and the local sandbox.
#[derive(Parser)]
#[command(name = "kube-test-apiserver", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write a kubeconfig for this server.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ccm_runtime::telemetry::init(ccm_runtime::telemetry::LogFormat::Plain, "info");
    let server = ApiServer::start_with(Config {
        listen: args.listen,
        ..Config::default()
    })
    .await?;
    if let Some(path) = &args.kubeconfig {
        server.write_kubeconfig(path)?;
        tracing::info!(kubeconfig = %path.display(), "kubeconfig written");
    }
    tracing::info!(url = %server.url(), "kube-test-apiserver serving");
    let shutdown = ccm_runtime::shutdown::on_signals()?;
    shutdown.cancelled().await;
    Ok(())
}
