//! The gateway client every controller builds the same way, and the check
//! controllers make at start that the provider has their capability.

use ccm_proto::GatewayClient;

/// Which capability a controller needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    Instances,
    LoadBalancers,
    Routes,
}

/// Builds the client.
pub fn client(config: &ccm_proto::ClientConfig) -> anyhow::Result<GatewayClient> {
    Ok(GatewayClient::new(config.clone())?)
}

/// Whether the provider behind the gateway has `capability`; waits for the
/// gateway to answer (it may start after the controller), or `None` when
/// `shutdown` comes first.
pub async fn supports(
    client: &GatewayClient,
    capability: Capability,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<Option<bool>> {
    Ok(provider_info(client, shutdown)
        .await?
        .map(|info| match capability {
            Capability::Instances => info.instances,
            Capability::LoadBalancers => info.load_balancers,
            Capability::Routes => info.routes,
        }))
}

/// What the provider behind the gateway is and has; waits for the gateway
/// to answer, or `None` when `shutdown` comes first.
pub async fn provider_info(
    client: &GatewayClient,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<Option<ccm_proto::v1::GetProviderInfoResponse>> {
    crate::shutdown::or_shutdown(shutdown, ask(client))
        .await
        .transpose()
}

async fn ask(client: &GatewayClient) -> anyhow::Result<ccm_proto::v1::GetProviderInfoResponse> {
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        match client.provider_info().await {
            Ok(info) => return Ok(info),
            // The gateway refused the token itself. A cloud that refused
            // the gateway's own credentials (CLOUD_PERMISSION_DENIED, e.g.
            // reading the cloud's limits) is waited for like any outage.
            Err(e @ ccm_proto::Error::Unauthenticated { .. }) => {
                anyhow::bail!("the gateway refused this controller's token: {e}");
            }
            Err(ccm_proto::Error::PermissionDenied { reason, message })
                if reason != ccm_proto::reason::CLOUD_PERMISSION_DENIED =>
            {
                anyhow::bail!(
                    "the gateway refused this controller's token: permission denied: {message}"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "waiting for the cloud gateway");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(10));
            }
        }
    }
}

/// The provider's limits on load balancer hosts, as `info` states them.
pub fn host_limits(
    info: &ccm_proto::v1::GetProviderInfoResponse,
) -> Vec<ccm_values::host_limits::HostLimits> {
    info.host_limits
        .iter()
        .map(|l| ccm_values::host_limits::HostLimits {
            kind: l.kind.clone(),
            annotation: l.annotation.clone(),
            values: l.values.clone(),
            per_load_balancer: l.per_load_balancer,
            per_zone: l.per_zone,
            cross_zone_annotation: l.cross_zone_annotation.clone(),
            source: l.source.clone(),
        })
        .collect()
}
