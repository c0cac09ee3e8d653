//! Routes: idempotent create and delete, each cluster seeing only its own,
//! and blackholes once a target instance is gone.

use ccm_proto::Error;

use crate::checks::fixtures::host;
use crate::context::{Context, no_node};
use crate::outcome::{Outcome, fail};

pub(crate) async fn delete_missing(cx: &Context) -> Result<Outcome, String> {
    let Some(node) = &cx.node else {
        return Ok(no_node());
    };
    let c = cx.client("route")?;
    let route = ccm_proto::v1::Route {
        name: format!("{}-10.255.0.0/24", cx.target.cluster),
        target_node: node.clone(),
        destination_cidr: "10.255.0.0/24".into(),
        ..Default::default()
    };
    match c.delete_route(route).await {
        Ok(()) => Ok(Outcome::Pass),
        Err(e) => fail(format!("delete of a missing route: {e}")),
    }
}

pub(crate) async fn create_idempotent(cx: &Context) -> Result<Outcome, String> {
    let Some(node) = &cx.node else {
        return Ok(no_node());
    };
    let c = cx.client("route")?;
    let other = cx.other_client("route")?;
    for cidr in ["10.254.7.0/24", "fd00:254:7::/64"] {
        let route = ccm_proto::v1::Route {
            target_node: node.clone(),
            destination_cidr: cidr.into(),
            ..Default::default()
        };
        let mut created = None;
        for _ in 0..2 {
            created = Some(
                c.create_route(format!("conformance-{}", cidr.len()), route.clone())
                    .await
                    .map_err(|e| format!("create {cidr}: {e}"))?,
            );
        }
        let listed = c.list_routes().await.map_err(|e| format!("list: {e}"))?;
        let n = listed.iter().filter(|r| r.destination_cidr == cidr).count();
        // A cluster the cloud is not set up for sees nothing either.
        let seen = match other.list_routes().await {
            Ok(routes) => routes.iter().any(|r| r.destination_cidr == cidr),
            Err(Error::Other {
                code: tonic::Code::FailedPrecondition,
                ..
            }) => false,
            Err(e) => return fail(format!("list in the other cluster: {e}")),
        };
        if let Some(r) = created {
            let _ = c.delete_route(r).await;
        }
        if n != 1 {
            return fail(format!("{n} routes for {cidr} after two creates"));
        }
        if seen {
            return fail(format!("another cluster lists the route for {cidr}"));
        }
    }
    Ok(Outcome::Pass)
}

pub(crate) async fn blackhole(cx: &Context) -> Result<Outcome, String> {
    let hook = match &cx.hook {
        Ok(hook) => hook,
        Err(why) => return Ok(Outcome::Skip(why.clone())),
    };
    let instance = hook.create("conformance-route").await?;
    let target_host = host(&cx.target, &instance.name).await;
    let c = cx.client("route")?;
    let cidr = "10.253.9.0/24";
    let created = match target_host {
        Ok(h) => {
            c.create_route(
                "conformance-blackhole",
                ccm_proto::v1::Route {
                    target_node: instance.name.clone(),
                    destination_cidr: cidr.into(),
                    target_provider_id: h.provider_id,
                    target_node_addresses: h.addresses,
                    ..Default::default()
                },
            )
            .await
        }
        Err(why) => {
            let _ = hook.end(&instance, true).await;
            return fail(why);
        }
    };
    hook.end(&instance, true).await?;
    let created = created.map_err(|e| format!("create {cidr}: {e}"))?;
    let listed = c.list_routes().await.map_err(|e| format!("list: {e}"))?;
    let blackhole = listed
        .iter()
        .find(|r| r.destination_cidr == cidr)
        .map(|r| r.blackhole);
    let deleted = c.delete_route(created).await;
    let left = c
        .list_routes()
        .await
        .map_err(|e| format!("list: {e}"))?
        .iter()
        .any(|r| r.destination_cidr == cidr);
    match (blackhole, deleted, left) {
        (Some(true), Ok(()), false) => Ok(Outcome::Pass),
        (Some(false), ..) => {
            fail("the route is listed without blackhole though its instance is gone")
        }
        (None, ..) => fail("the route is not listed once its instance is gone"),
        (_, Err(e), _) => fail(format!("delete of the blackhole route: {e}")),
        (_, Ok(()), true) => fail("the blackhole route is still listed after delete"),
    }
}
