//! Who may call: a caller without a valid token is turned away, and a role
//! only reaches the services it is allowed.

use ccm_proto::{Error, TokenSource, reason};

use crate::checks::fixtures::{new_uid, service};
use crate::context::Context;
use crate::outcome::{Outcome, fail};

pub(crate) async fn no_token(cx: &Context) -> Result<Outcome, String> {
    let client = cx.target.client_with(
        TokenSource::Static("not-a-token".into()),
        &cx.target.cluster,
    )?;
    match client.provider_info().await {
        Err(Error::Unauthenticated { .. }) => Ok(Outcome::Pass),
        other => fail(format!("expected UNAUTHENTICATED, got {other:?}")),
    }
}

pub(crate) async fn wrong_role(cx: &Context) -> Result<Outcome, String> {
    let client = cx.client("route")?;
    match client.get_load_balancer(service(&new_uid())).await {
        Err(Error::PermissionDenied { reason: r, .. }) if r == reason::ROLE_NOT_ALLOWED => {
            Ok(Outcome::Pass)
        }
        other => fail(format!(
            "expected PERMISSION_DENIED ({}), got {other:?}",
            reason::ROLE_NOT_ALLOWED
        )),
    }
}
