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

/// The bearer token this process's Kubernetes client sends (its
/// ServiceAccount's, in a cluster), to show another process of the release
/// who asks.
#[derive(Clone, Debug)]
pub enum OwnToken {
    /// Written in the kubeconfig.
    Fixed(secrecy::SecretString),
    /// In a file the kubelet rotates: read at each use.
    File(std::path::PathBuf),
    /// The client authenticates otherwise (a client certificate).
    None,
}

impl OwnToken {
    /// The token as of now.
    pub fn get(&self) -> Option<String> {
        use secrecy::ExposeSecret as _;
        match self {
            OwnToken::Fixed(token) => Some(token.expose_secret().to_owned()),
            OwnToken::File(path) => std::fs::read_to_string(path)
                .ok()
                .map(|t| t.trim().to_owned()),
            OwnToken::None => None,
        }
    }
}

/// The token the client from `kubeconfig` (as [`client`] finds it) sends.
pub async fn own_token(kubeconfig: Option<&Path>) -> anyhow::Result<OwnToken> {
    let config = config(kubeconfig).await?;
    Ok(
        match (config.auth_info.token, config.auth_info.token_file) {
            (_, Some(file)) => OwnToken::File(file.into()),
            (Some(token), None) => OwnToken::Fixed(token),
            (None, None) => OwnToken::None,
        },
    )
}
