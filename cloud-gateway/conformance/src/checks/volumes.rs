//! Volumes: idempotent creates, one cluster's volumes out of another's
//! sight, deletes of what is gone, and device names with one owner per
//! instance.

use ccm_proto::Error;
use ccm_proto::v1::{
    AttachVolumeRequest, CreateVolumeRequest, DeleteVolumeRequest, DetachVolumeRequest,
    GetVolumeRequest,
};

use crate::context::Context;
use crate::outcome::{Outcome, fail};

const GIB: i64 = 1 << 30;

/// The volume role's client, or the skip of a run given no token for it.
fn volume_client(cx: &Context) -> Result<ccm_proto::GatewayClient, Outcome> {
    cx.client("volume")
        .map_err(|why| Outcome::Skip(format!("{why}: name one with --token volume=PATH")))
}

fn create(name: &str, size_bytes: i64, zone: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        size_bytes,
        zones: if zone.is_empty() {
            Vec::new()
        } else {
            vec![zone.to_owned()]
        },
        ..Default::default()
    }
}

fn delete(volume_id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: volume_id.into(),
        ..Default::default()
    }
}

pub(crate) async fn create_idempotent(cx: &Context) -> Result<Outcome, String> {
    let c = match volume_client(cx) {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    let other = cx.other_client("volume")?;
    let name = "conformance-idempotent";
    let mut ids = Vec::new();
    for _ in 0..2 {
        let made = c
            .create_volume(create(name, GIB, ""))
            .await
            .map_err(|e| format!("create {name}: {e}"))?;
        ids.push(made.volume.map(|v| v.id).unwrap_or_default());
    }
    let other_size = c.create_volume(create(name, 3 * GIB, "")).await;
    let seen = other
        .get_volume(GetVolumeRequest {
            volume_id: ids[0].clone(),
            ..Default::default()
        })
        .await;
    let _ = c.delete_volume(delete(&ids[0])).await;
    if ids[0].is_empty() || ids[0] != ids[1] {
        return fail(format!("two creates of {name} answered {ids:?}"));
    }
    if !matches!(other_size, Err(Error::AlreadyExists { .. })) {
        return fail(format!(
            "{name} again with another size answered {other_size:?}, not ALREADY_EXISTS"
        ));
    }
    match seen {
        Err(Error::NotFound { .. }) => Ok(Outcome::Pass),
        Err(Error::Other {
            code: tonic::Code::FailedPrecondition,
            ..
        }) => Ok(Outcome::Pass),
        other => fail(format!(
            "another cluster asked for volume {} and got {other:?}",
            ids[0]
        )),
    }
}

pub(crate) async fn delete_missing(cx: &Context) -> Result<Outcome, String> {
    let c = match volume_client(cx) {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    match c.delete_volume(delete("vol-0c0fe0ab5e0ce0000")).await {
        Ok(_) => Ok(Outcome::Pass),
        Err(e) => fail(format!("delete of a missing volume: {e}")),
    }
}

pub(crate) async fn one_device_owner(cx: &Context) -> Result<Outcome, String> {
    let Some(instance) = cx.made_instance() else {
        return Ok(Outcome::Skip(
            "no admin hook to make an instance to attach to".into(),
        ));
    };
    let c = match volume_client(cx) {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    let mut ids = Vec::new();
    for name in ["conformance-device-a", "conformance-device-b"] {
        let made = c
            .create_volume(create(name, GIB, &instance.zone))
            .await
            .map_err(|e| format!("create {name} in {}: {e}", instance.zone))?;
        ids.push(made.volume.map(|v| v.id).unwrap_or_default());
    }
    let attach = |volume_id: String| {
        let (c, instance_id) = (c.clone(), instance.id.clone());
        async move {
            c.attach_volume(AttachVolumeRequest {
                volume_id,
                instance_id,
                ..Default::default()
            })
            .await
            .map(|a| a.device)
        }
    };
    let (a, b) = tokio::join!(attach(ids[0].clone()), attach(ids[1].clone()));
    let again = attach(ids[0].clone()).await;
    let in_use = c.delete_volume(delete(&ids[0])).await;
    for id in &ids {
        for _ in 0..2 {
            let _ = c
                .detach_volume(DetachVolumeRequest {
                    volume_id: id.clone(),
                    instance_id: instance.id.clone(),
                    ..Default::default()
                })
                .await;
        }
    }
    let detached_twice = c
        .detach_volume(DetachVolumeRequest {
            volume_id: ids[0].clone(),
            instance_id: instance.id.clone(),
            ..Default::default()
        })
        .await;
    for id in &ids {
        let _ = c.delete_volume(delete(id)).await;
    }
    let (a, b) = (
        a.map_err(|e| format!("attach: {e}"))?,
        b.map_err(|e| format!("attach: {e}"))?,
    );
    if a.is_empty() || a == b {
        return fail(format!(
            "two volumes attached to {} at once got devices {a:?} and {b:?}",
            instance.id
        ));
    }
    if again.as_ref().ok() != Some(&a) {
        return fail(format!("attaching again answered {again:?}, not {a:?}"));
    }
    if !matches!(
        in_use,
        Err(Error::Other {
            code: tonic::Code::FailedPrecondition,
            ..
        })
    ) {
        return fail(format!(
            "deleting an attached volume answered {in_use:?}, not FAILED_PRECONDITION"
        ));
    }
    match detached_twice {
        Ok(_) => Ok(Outcome::Pass),
        Err(e) => fail(format!("detaching a detached volume: {e}")),
    }
}
