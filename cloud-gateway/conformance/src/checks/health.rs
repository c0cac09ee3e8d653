//! Health and reflection: both answer without a token, for the server
//! and each service the provider offers.

use std::time::Duration;

use ccm_proto::TokenSource;
use ccm_proto::v1::GetProviderInfoResponse;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::context::Context;
use crate::outcome::{Outcome, fail};

pub(crate) async fn serving(cx: &Context) -> Result<Outcome, String> {
    let channel = cx
        .target
        .client_with(TokenSource::Static(String::new()), &cx.target.cluster)?
        .channel();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let mut services = vec![String::new()];
    services.extend(offered_services(cx.info.as_ref()));
    for service in services {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.clone(),
            })
            .await
            .map_err(|e| format!("health of {service:?}: {e}"))?;
        if answer.get_ref().status
            != tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        {
            return fail(format!("{service:?} is not SERVING"));
        }
    }
    Ok(Outcome::Pass)
}

pub(crate) async fn reflection(cx: &Context) -> Result<Outcome, String> {
    let channel = cx
        .target
        .client_with(TokenSource::Static(String::new()), &cx.target.cluster)?
        .channel();
    let request = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        let mut stream = ServerReflectionClient::new(channel)
            .server_reflection_info(tokio_stream::once(request))
            .await?
            .into_inner();
        stream.message().await
    })
    .await
    .map_err(|_| "no reflection answer in 10 s".to_owned())?
    .map_err(|e| format!("reflection: {e}"))?;
    let listed: Vec<String> = match answer.and_then(|a| a.message_response) {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => return fail(format!("expected a list of services, got {other:?}")),
    };
    let expected = offered_services(cx.info.as_ref());
    let missing: Vec<String> = expected
        .into_iter()
        .filter(|e| !listed.contains(e))
        .collect();
    if missing.is_empty() {
        Ok(Outcome::Pass)
    } else {
        fail(format!("reflection does not list {missing:?}"))
    }
}

/// The gRPC names of Provider and each service the provider offers.
fn offered_services(info: Option<&GetProviderInfoResponse>) -> Vec<String> {
    let mut names = vec!["cloudgateway.v1.Provider".to_owned()];
    if let Some(i) = info {
        for (offered, name) in [
            (i.instances, "Instances"),
            (i.load_balancers, "LoadBalancers"),
            (i.routes, "Routes"),
            (i.volumes, "Volumes"),
        ] {
            if offered {
                names.push(format!("cloudgateway.v1.{name}"));
            }
        }
    }
    names
}
