//! The provider's own word on itself: its name and capabilities, and
//! UNIMPLEMENTED for every capability it lacks.

use ccm_proto::Error;

use crate::context::Context;
use crate::outcome::{Outcome, fail};

pub(crate) async fn info(cx: &Context) -> Result<Outcome, String> {
    match &cx.info {
        Some(i) if !i.name.is_empty() => Ok(Outcome::Pass),
        Some(_) => fail("the provider's name is empty"),
        None => fail("GetProviderInfo failed"),
    }
}

pub(crate) async fn unimplemented(cx: &Context) -> Result<Outcome, String> {
    let Some(i) = &cx.info else {
        return fail("no provider info");
    };
    let mut tried = 0;
    if !i.load_balancers {
        tried += 1;
        let c = cx.client("service")?;
        if !matches!(
            c.list_load_balancers().await,
            Err(Error::Unimplemented { .. })
        ) {
            return fail("LoadBalancers is not UNIMPLEMENTED though not offered");
        }
    }
    if !i.routes {
        tried += 1;
        let c = cx.client("route")?;
        if !matches!(c.list_routes().await, Err(Error::Unimplemented { .. })) {
            return fail("Routes is not UNIMPLEMENTED though not offered");
        }
    }
    Ok(if tried == 0 {
        Outcome::Skip("the provider offers every capability".into())
    } else {
        Outcome::Pass
    })
}
