//! `kube-test-apiserver --listen ADDR --kubeconfig FILE [--tokens FILE] [--rbac FILE]
//! [--state-dir DIR]`: a Kubernetes API server for tests, the sandbox and
//! people, in memory or on disk, over HTTPS only.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use kube_test_apiserver::{ApiServer, Config, TokenEntry, documents};

/// A Kubernetes API server in memory, for tests and the local sandbox.
#[derive(Parser)]
#[command(name = "kube-test-apiserver", version = ccm_runtime::version::LONG)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write a kubeconfig for this server (admin user).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// YAML list of bearer tokens: {token, username, uid, groups, audiences}.
    /// They authenticate requests (when bound to the server's audience) and
    /// answer TokenReviews.
    #[arg(long)]
    tokens: Option<PathBuf>,
    /// Enforce RBAC with the Roles, ClusterRoles and bindings in these
    /// manifests (multi-document YAML, e.g. a rendered Helm chart); GET
    /// /debug/rbac then reports refusals and unused grants.
    #[arg(long)]
    rbac: Option<PathBuf>,
    /// Keep the objects in this directory, so that the server started
    /// again on it (even after kill -9) has them all, as kube-apiserver
    /// has them in etcd; in memory only when unset. The cluster CA the
    /// server's HTTPS certificate and client certificates are signed by
    /// (ca.crt, ca.key), the key its ServiceAccount tokens are signed with
    /// (sa.key), and the front proxy's CA and client certificate, which
    /// aggregated API servers trust (front-proxy-ca.crt,
    /// front-proxy-client.crt, front-proxy-client.key), are kept there
    /// too, made when missing.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Start with resourceVersions moved on by this much and every
    /// earlier one compacted, as after an etcd restore with
    /// `--bump-revision N --mark-compacted`: every client must list again.
    #[arg(long, default_value_t = 0)]
    bump_resource_version: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ccm_runtime::telemetry::init(&ccm_runtime::telemetry::Options {
        directives: "info".into(),
        ..Default::default()
    });
    // Before the port opens: a SIGTERM at any moment after is a clean stop.
    let shutdown = ccm_runtime::shutdown::on_signals()?;
    let server = ApiServer::start_with(Config {
        listen: args.listen,
        state_dir: args.state_dir.clone(),
        ..Config::default()
    })
    .await
    .with_context(|| format!("serve on {}", args.listen))?;
    if args.bump_resource_version > 0 {
        server
            .store()
            .bump_resource_version(args.bump_resource_version);
        tracing::info!(
            by = args.bump_resource_version,
            "resourceVersions moved on; every watch must list again"
        );
    }
    if let Some(path) = &args.tokens {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let entries: Vec<TokenEntry> =
            serde_norway::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
        for entry in entries {
            server.register_token(entry.token, entry.user);
        }
    }
    if let Some(path) = &args.rbac {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let objects =
            documents(&text).map_err(|e| anyhow::anyhow!("parse {}: {e}", path.display()))?;
        server.enforce_rbac(&objects);
        tracing::info!(policy = %path.display(), "RBAC enforced");
    }
    if let Some(path) = &args.kubeconfig {
        server.write_kubeconfig(path)?;
        tracing::info!(kubeconfig = %path.display(), "kubeconfig written");
    }
    tracing::info!(url = %server.url(), "kube-test-apiserver serving");
    shutdown.cancelled().await;
    Ok(())
}
