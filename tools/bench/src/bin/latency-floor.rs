//! `latency-floor`: the floor under the gateway's latency. A bare tonic
//! server on the same runtime as the gateway (tokio's multi-threaded
//! default) that answers `GetInstances` with a fixed instance of the size
//! the gateway's cache answers with: no auth, no layers, no cache, no
//! metrics. What a call costs here is what HTTP/2, tonic, the runtime and
//! the operating system cost on this machine; the benchmark reports the
//! gateway against it (scenario 6).

use std::net::SocketAddr;

use ccm_proto::v1::instances_server::{Instances, InstancesServer};
use ccm_proto::v1::{
    GetInstancesRequest, GetInstancesResponse, Instance, InstanceResult, InstanceState,
    NodeAddress, NodeAddressType, TagInstancesRequest, TagInstancesResponse,
};
use clap::Parser;
use tonic::{Request, Response, Status};

/// A bare gRPC server answering GetInstances with a fixed instance.
#[derive(Parser)]
#[command(name = "latency-floor", version = ccm_runtime::version::LONG)]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:50099")]
    listen: SocketAddr,
}

struct Fixed;

#[tonic::async_trait]
impl Instances for Fixed {
    async fn get_instances(
        &self,
        request: Request<GetInstancesRequest>,
    ) -> Result<Response<GetInstancesResponse>, Status> {
        let results = request
            .into_inner()
            .nodes
            .into_iter()
            .map(|node| InstanceResult {
                instance: Some(Instance {
                    provider_id: format!("sim://zone-a/{}", node.name),
                    instance_type: "sim.standard-2".into(),
                    zone: "zone-a".into(),
                    region: "region-1".into(),
                    addresses: vec![
                        NodeAddress {
                            r#type: NodeAddressType::InternalIp as i32,
                            address: "10.0.0.10".into(),
                        },
                        NodeAddress {
                            r#type: NodeAddressType::Hostname as i32,
                            address: node.name.clone(),
                        },
                    ],
                    additional_labels: Default::default(),
                }),
                node: Some(node),
                state: InstanceState::Running as i32,
                cached: true,
            })
            .collect();
        Ok(Response::new(GetInstancesResponse { results }))
    }

    async fn tag_instances(
        &self,
        _request: Request<TagInstancesRequest>,
    ) -> Result<Response<TagInstancesResponse>, Status> {
        Err(Status::unimplemented("the latency floor only looks up"))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(InstancesServer::new(Fixed))
        .serve_with_shutdown(args.listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
