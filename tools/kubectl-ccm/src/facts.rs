//! Reading what a verdict needs, through the Kubernetes API server only,
//! as the person running the plugin: the object, its controller's Lease,
//! the release's diagnostics API (`diagnostics.cloudgateway.io/v1`, which
//! asks the leader and the gateway) and the object's events.

use ccm_runtime::names;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Service};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use serde_json::Value;

use crate::verdict::{Answer, Condition, EventLine, Leader, NodeFacts, ServiceFacts};

/// The most events shown.
const EVENTS: usize = 5;
/// The most events read for them.
const EVENTS_READ: u32 = 100;

/// Where the cloud controller manager runs: its namespace and the base of
/// its objects' names (the chart's `fullnameOverride`, else the release).
#[derive(Clone, Debug)]
pub struct Install {
    pub namespace: String,
    pub release: String,
}

impl Install {
    fn lease(&self, controller: &str) -> String {
        format!("{}-{controller}", self.release)
    }
}

/// Why a request failed, as a person reads it.
pub fn explain(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "forbidden: {} (bind the ccm-viewer roles to this user: see the chart's viewer.subjects)",
            s.message
        ),
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    }
}

fn secs_since(t: Timestamp) -> f64 {
    let d = Timestamp::now().duration_since(t);
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// Who holds `controller`'s Lease.
pub async fn leader(
    client: &kube::Client,
    install: &Install,
    controller: &str,
) -> Result<Leader, String> {
    let name = install.lease(controller);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &install.namespace);
    let mut leader = Leader {
        controller: controller.into(),
        lease: format!("{}/{name}", install.namespace),
        ..Leader::default()
    };
    let Some(lease) = leases.get_opt(&name).await.map_err(|e| explain(&e))? else {
        return Ok(leader);
    };
    leader.found = true;
    let spec = lease.spec.unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let renewed = spec.renew_time.map(|t| t.0);
    let duration = f64::from(spec.lease_duration_seconds.unwrap_or(15));
    leader.renewed = renewed.map(|t| t.to_string());
    leader.renewed_ago_s = renewed.map(secs_since);
    leader.expired = renewed
        .and_then(|t| {
            t.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
                duration as i64,
            ))
            .ok()
        })
        .map(|t| t.to_string());
    leader.held_for_s = spec.acquire_time.map(|t| secs_since(t.0));
    leader.valid = holder.is_some() && leader.renewed_ago_s.is_some_and(|ago| ago <= duration);
    leader.pod = holder
        .as_deref()
        .map(|h| h.rsplit_once('_').map_or(h, |(pod, _)| pod).to_owned());
    leader.holder = holder;
    Ok(leader)
}

/// `GET path` through the API server, as JSON. The client's read timeout
/// bounds a server that takes the connection and never answers.
async fn get_json(client: &kube::Client, path: &str) -> Answer {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| explain(&e))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "not JSON ({e}): {}",
            text.chars().take(200).collect::<String>()
        )
    })
}

fn encode(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Where the release's diagnostics API is served (an aggregated API).
const DIAGNOSTICS: &str = "/apis/diagnostics.cloudgateway.io/v1";

/// `GET path` of the diagnostics API; a 404 means the API is not there.
async fn diagnostics(client: &kube::Client, path: &str) -> Answer {
    get_json(client, &format!("{DIAGNOSTICS}{path}"))
        .await
        .map_err(|why| {
            if why.starts_with("404 ") {
                format!(
                    "{why} (is the diagnostics API installed? kubectl get apiservice v1.diagnostics.cloudgateway.io)"
                )
            } else {
                why
            }
        })
}

/// The field `name` of a diagnosis or component: what the process asked
/// answered, or why there is no answer.
fn field(object: &Answer, name: &str) -> Answer {
    let object = object.as_ref().map_err(Clone::clone)?;
    match (&object[name]["answer"], object[name]["error"].as_str()) {
        (_, Some(why)) => Err(why.to_owned()),
        (Value::Null, None) => Err(format!("the diagnostics API gave no {name}")),
        (answer, None) => Ok(answer.clone()),
    }
}

/// The newest events of the object `kind`/`name` in `namespace`, or why
/// they could not be read.
async fn events(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    name: &str,
) -> Result<Vec<EventLine>, String> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params = kube::api::ListParams::default()
        .fields(&format!(
            "involvedObject.kind={kind},involvedObject.name={name}"
        ))
        .limit(EVENTS_READ);
    let list = api.list(&params).await.map_err(|e| explain(&e))?;
    let mut mine: Vec<_> = list
        .items
        .into_iter()
        .map(|e| {
            // The last time it happened, as kubectl's LAST SEEN reads it:
            // a series' last observation, else the core/v1 timestamp,
            // else when it was first seen.
            let at = e
                .series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| t.0)
                .or(e.last_timestamp.as_ref().map(|t| t.0))
                .or(e.event_time.as_ref().map(|t| t.0))
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
            (at, e)
        })
        .collect();
    mine.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    Ok(mine
        .into_iter()
        .take(EVENTS)
        .map(|(at, e)| EventLine {
            age_s: at.map(secs_since),
            type_: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
        })
        .collect())
}

/// Everything `why service/NAME` reads.
pub async fn service(
    client: &kube::Client,
    install: &Install,
    namespace: &str,
    name: &str,
) -> Result<ServiceFacts, String> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let svc = services.get(name).await.map_err(|e| explain(&e))?;
    let spec = svc.spec.clone().unwrap_or_default();
    let status = svc.status.clone().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    let path = format!(
        "/namespaces/{}/servicediagnoses/{}",
        encode(namespace),
        encode(name)
    );
    let (leader, diagnosis, events) = tokio::join!(
        leader(client, install, "service-controller"),
        diagnostics(client, &path),
        events(client, namespace, "Service", name),
    );
    let leader = leader?;
    Ok(ServiceFacts {
        service: key,
        type_: spec.type_.unwrap_or_else(|| "ClusterIP".into()),
        load_balancer_class: spec.load_balancer_class,
        ingress: status
            .load_balancer
            .and_then(|lb| lb.ingress)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| i.ip.or(i.hostname))
            .collect(),
        deleting: svc.metadata.deletion_timestamp.is_some(),
        condition: status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == names::CONDITION_LB_SYNCED)
            .map(|c| Condition {
                status: c.status,
                reason: c.reason,
                message: c.message,
            }),
        leader,
        controller: field(&diagnosis, "controller"),
        queue: field(&diagnosis, "object"),
        gateway: field(&diagnosis, "gateway"),
        gateway_calls: field(&diagnosis, "gatewayCalls"),
        events,
    })
}

/// Everything `why node/NAME` reads.
pub async fn node(
    client: &kube::Client,
    install: &Install,
    name: &str,
) -> Result<NodeFacts, String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(name).await.map_err(|e| explain(&e))?;
    let spec = node.spec.clone().unwrap_or_default();
    let taints = spec.taints.unwrap_or_default();
    let tainted = |key: &str| taints.iter().any(|t| t.key == key);
    let path = format!("/nodediagnoses/{}", encode(name));
    let (leader, diagnosis, events) = tokio::join!(
        leader(client, install, "node-controller"),
        diagnostics(client, &path),
        events(client, "default", "Node", name),
    );
    let leader = leader?;
    Ok(NodeFacts {
        node: name.into(),
        provider_id: spec.provider_id,
        uninitialized: tainted(names::TAINT_UNINITIALIZED),
        shutdown: tainted(names::TAINT_SHUTDOWN),
        leader,
        controller: field(&diagnosis, "controller"),
        queue: field(&diagnosis, "object"),
        gateway: field(&diagnosis, "gateway"),
        gateway_calls: field(&diagnosis, "gatewayCalls"),
        events,
    })
}

/// One controller's state for `status`.
pub async fn controller(
    client: &kube::Client,
    install: &Install,
    name: &str,
) -> Result<(Leader, Answer), String> {
    let (leader, component) = tokio::join!(
        leader(client, install, name),
        component(client, install, name)
    );
    Ok((leader?, field(&component, "status")))
}

/// The gateway's state for `status`.
pub async fn gateway(client: &kube::Client, install: &Install) -> Answer {
    field(&component(client, install, "gateway").await, "status")
}

/// The component `name` of the release, as the diagnostics API tells it.
async fn component(client: &kube::Client, install: &Install, name: &str) -> Answer {
    diagnostics(
        client,
        &format!(
            "/namespaces/{}/components/{}",
            encode(&install.namespace),
            encode(name)
        ),
    )
    .await
}

/// The value at `pointer` in an answer, if it was read.
pub fn at<'a>(answer: &'a Answer, pointer: &str) -> Option<&'a Value> {
    answer.as_ref().ok()?.pointer(pointer)
}
