//! The Kubernetes client every process builds the same way.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// A client from `kubeconfig`, or else the in-cluster config or
/// `$KUBECONFIG`, as kubectl would find it.
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    Ok(kube::Client::try_from(config(kubeconfig).await?)?)
}

async fn config(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("read kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    })
}
