//! Instances: how nodes are found, by name and by provider ID, one by one
//! and in batches, through an instance's life.

use ccm_proto::Error;
use ccm_proto::v1::{InstanceState, LookupPurpose, NodeRef};

use crate::checks::fixtures::lookup;
use crate::context::{Context, no_node};
use crate::outcome::{Outcome, fail};

pub(crate) async fn foreign_provider_id(cx: &Context) -> Result<Outcome, String> {
    let c = cx.client("node")?;
    let node = NodeRef {
        name: "n".into(),
        provider_id: "conformance-elsewhere://zone/x".into(),
    };
    match c
        .get_instances(vec![node], LookupPurpose::Initialize, true)
        .await
    {
        Err(Error::InvalidArgument { .. }) => Ok(Outcome::Pass),
        other => fail(format!("expected INVALID_ARGUMENT, got {other:?}")),
    }
}

pub(crate) async fn not_found(cx: &Context) -> Result<Outcome, String> {
    let c = cx.client("node")?;
    let node = NodeRef {
        name: format!("conformance-missing-{}.example", fastrand::u32(..)),
        provider_id: String::new(),
    };
    match c
        .get_instances(vec![node], LookupPurpose::Initialize, true)
        .await
    {
        Ok(r) if r.len() == 1 && r[0].state == InstanceState::NotFound as i32 => Ok(Outcome::Pass),
        other => fail(format!("expected one NOT_FOUND answer, got {other:?}")),
    }
}

pub(crate) async fn found_by_name(cx: &Context) -> Result<Outcome, String> {
    let Some(name) = &cx.node else {
        return Ok(no_node());
    };
    let c = cx.client("node")?;
    let scheme = format!(
        "{}://",
        cx.info
            .as_ref()
            .map(|i| i.name.as_str())
            .unwrap_or_default()
    );
    let node = NodeRef {
        name: name.clone(),
        provider_id: String::new(),
    };
    match c
        .get_instances(vec![node], LookupPurpose::Initialize, true)
        .await
    {
        Ok(r)
            if r.len() == 1
                && r[0].state == InstanceState::Running as i32
                && r[0]
                    .instance
                    .as_ref()
                    .is_some_and(|i| i.provider_id.starts_with(&scheme)) =>
        {
            Ok(Outcome::Pass)
        }
        other => fail(format!(
            "expected a running instance with a {scheme} provider ID, got {other:?}"
        )),
    }
}

pub(crate) async fn batch_in_order(cx: &Context) -> Result<Outcome, String> {
    let Some(name) = &cx.node else {
        return Ok(no_node());
    };
    let c = cx.client("node")?;
    let found = NodeRef {
        name: name.clone(),
        provider_id: String::new(),
    };
    let missing = NodeRef {
        name: format!("conformance-missing-{}.example", fastrand::u32(..)),
        provider_id: String::new(),
    };
    let states: Vec<i32> = c
        .get_instances(
            vec![missing.clone(), found.clone()],
            LookupPurpose::Initialize,
            true,
        )
        .await
        .map_err(|e| format!("batch: {e}"))?
        .iter()
        .map(|r| r.state)
        .collect();
    if states
        != [
            InstanceState::NotFound as i32,
            InstanceState::Running as i32,
        ]
    {
        return fail(format!("answers {states:?} for [missing, found]"));
    }
    let foreign = NodeRef {
        name: "n".into(),
        provider_id: "conformance-elsewhere://zone/x".into(),
    };
    match c
        .get_instances(
            vec![found, foreign, missing],
            LookupPurpose::Initialize,
            true,
        )
        .await
    {
        Err(Error::InvalidArgument { .. }) => Ok(Outcome::Pass),
        other => fail(format!(
            "a batch with a foreign provider ID answered {other:?}"
        )),
    }
}

pub(crate) async fn lifecycle(cx: &Context) -> Result<Outcome, String> {
    let hook = match &cx.hook {
        Ok(hook) => hook,
        Err(why) => return Ok(Outcome::Skip(why.clone())),
    };
    let c = cx.client("node")?;
    let instance = hook.create("conformance-life").await?;
    let by_name = NodeRef {
        name: instance.name.clone(),
        provider_id: String::new(),
    };
    let found = lookup(&c, by_name.clone()).await?;
    let provider_id = found
        .instance
        .as_ref()
        .map(|i| i.provider_id.clone())
        .unwrap_or_default();
    if found.state != InstanceState::Running as i32 || provider_id.is_empty() {
        let _ = hook.end(&instance, true).await;
        return fail(format!("a new instance by name: {found:?}"));
    }
    let by_id = NodeRef {
        name: String::new(),
        provider_id: provider_id.clone(),
    };
    let mut states = vec![lookup(&c, by_id.clone()).await?.state];
    hook.end(&instance, false).await?;
    states.push(lookup(&c, by_id.clone()).await?.state);
    hook.end(&instance, true).await?;
    states.push(lookup(&c, by_id).await?.state);
    states.push(lookup(&c, by_name).await?.state);
    let expected = [
        InstanceState::Running as i32,
        InstanceState::Shutdown as i32,
        InstanceState::NotFound as i32,
        InstanceState::NotFound as i32,
    ];
    if states == expected {
        Ok(Outcome::Pass)
    } else {
        fail(format!(
            "states {states:?} for [by provider ID, stopped, terminated, terminated by name]; expected {expected:?}"
        ))
    }
}
