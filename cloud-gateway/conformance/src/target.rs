//! The gateway under test, and clients of it for each role.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ccm_proto::{ClientConfig, GatewayClient, RetryPolicy, TokenSource};

/// Where the gateway is and who may call it.
#[derive(Clone, Debug)]
pub struct Target {
    /// `http://host:port` or `https://host:port`.
    pub address: String,
    /// A PEM CA bundle for https.
    pub tls_ca: Option<PathBuf>,
    /// The token of each role (`node`, `service`, `route`, and `admin` for
    /// the admin hook).
    pub tokens: BTreeMap<String, TokenSource>,
    /// The cluster the checks act for; the cloud must be set up for it
    /// (on AWS: subnets and route tables tagged for it).
    pub cluster: String,
    /// A second cluster, which must never see the first one's resources.
    pub other_cluster: String,
    /// The name of a node whose instance exists, for checks that need one;
    /// without it, one is made through the admin hook where there is one.
    pub node: Option<String>,
    /// An annotation (key, value) the provider refuses, for the check that
    /// a refused annotation writes nothing.
    pub invalid_annotation: Option<(String, String)>,
    /// The longest any one check may wait (for provisioning, say).
    pub patience: Duration,
}

impl Target {
    /// A client with `role`'s token, acting for `cluster`, that never retries.
    pub(crate) fn client(&self, role: &str, cluster: &str) -> Result<GatewayClient, String> {
        let token = self
            .tokens
            .get(role)
            .cloned()
            .ok_or_else(|| format!("no token for the {role} role"))?;
        self.client_with(token, cluster)
    }

    /// A client with `token`, acting for `cluster`, that never retries.
    pub(crate) fn client_with(
        &self,
        token: TokenSource,
        cluster: &str,
    ) -> Result<GatewayClient, String> {
        let mut config = ClientConfig::new(self.address.clone(), cluster, token);
        config.retry = RetryPolicy::none();
        config.tls_ca = self.tls_ca.clone();
        GatewayClient::new(config).map_err(|e| e.to_string())
    }
}
