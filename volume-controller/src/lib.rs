//! The volume controller: CSI's controller half with no cloud credentials.
//! It serves CSI's Identity and Controller services on a unix socket to
//! upstream's sidecars in its pod (external-provisioner, -attacher,
//! -resizer, -snapshotter), and forwards each call to the cloud gateway's
//! Volumes service, which owns what needs one owner (idempotency, device
//! names, the budget). It keeps no cloud state and holds no lease: the
//! sidecars elect their own leaders.

pub mod args;
pub mod csi;
pub mod metrics;
pub mod socket;

use anyhow::Context as _;
use ccm_proto::csi::controller_server::ControllerServer;
use ccm_proto::csi::identity_server::IdentityServer;
use ccm_runtime::controller::Base;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use crate::args::Settings;
use crate::csi::{ControllerService, Driver, IdentityService};
use crate::metrics::Metrics;

/// The name events and logs report as.
pub const CONTROLLER_NAME: &str = "volume_controller";

pub use ccm_runtime::controller::Running;

/// Binds the socket and starts serving once the gateway says what its
/// provider's volumes are; runs until `shutdown`.
pub async fn start(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<Running> {
    let base = Base::start(
        &settings.common,
        CONTROLLER_NAME,
        Metrics::register,
        &shutdown,
    )
    .await?;
    let listener = socket::bind(&settings.csi_socket)?;
    let task = tokio::spawn({
        let (gateway, metrics, readiness) = (
            base.gateway.clone(),
            base.metrics.clone(),
            base.readiness.clone(),
        );
        let socket = settings.csi_socket.clone();
        async move {
            let info = ccm_runtime::gateway::provider_info(&gateway, &shutdown).await?;
            let Some(info) = info else {
                return Ok(());
            };
            if !info.volumes {
                anyhow::bail!(
                    "the cloud provider behind the gateway ({}) has no volumes",
                    info.name
                );
            }
            let offer = info.volume_offer.unwrap_or_default();
            tracing::info!(
                socket = %socket.display(),
                driver = offer.csi_driver,
                "serving CSI"
            );
            let driver = Driver::new(gateway, offer, metrics);
            readiness.set(true);
            let served = tonic::transport::Server::builder()
                .add_service(IdentityServer::new(IdentityService(driver.clone())))
                .add_service(ControllerServer::new(ControllerService(driver)))
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(listener),
                    shutdown.cancelled(),
                )
                .await;
            let _ = std::fs::remove_file(&socket);
            served.context("serve CSI")
        }
    });
    Ok(base.running(task))
}
