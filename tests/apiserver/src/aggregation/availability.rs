//! Each APIService's `Available` condition, kept as kube-aggregator's
//! availability controller keeps it: every interval, each APIService with
//! a Service is checked (the Service, its port, its endpoints, then a GET
//! of `/apis/<group>/<version>` with the front proxy's certificate as
//! `system:kube-aggregator` in `system:masters`; any endpoint answering
//! 2xx within [`CHECK_TIMEOUT`] passes), and a local one is always
//! available. The status is written only when the condition changes, so
//! watchers and resourceVersions do not churn; `lastTransitionTime` moves
//! only when the condition's status flips.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::{JoinHandle, JoinSet};

use super::backend::{self, ServiceRef};
use super::{api_services, upstream};
use crate::Shared;
use crate::front_proxy::{GROUP_HEADER, USER_HEADER};
use crate::store::now;

/// How long one endpoint has to answer a check, connection included.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Whether requests may be sent.
    pub available: bool,
    /// `Local`, `Passed`, `ServiceNotFound`, `ServicePortError`,
    /// `MissingEndpoints` or `FailedDiscoveryCheck`.
    pub reason: &'static str,
    /// Why, in words.
    pub message: String,
}

impl Verdict {
    /// What a local APIService always is.
    pub(crate) fn local() -> Self {
        Self {
            available: true,
            reason: "Local",
            message: "Local APIServices are always available".into(),
        }
    }

    fn failed(message: String) -> Self {
        Self {
            available: false,
            reason: "FailedDiscoveryCheck",
            message,
        }
    }
}

/// The `Available` condition a verdict makes, new as of `now`.
pub(crate) fn condition(verdict: &Verdict, now: &str) -> Value {
    json!({
        "type": "Available",
        "status": if verdict.available { "True" } else { "False" },
        "lastTransitionTime": now,
        "reason": verdict.reason,
        "message": verdict.message,
    })
}

/// The status an APIService whose status is `old` gets from `verdict`,
/// or `None` when its `Available` condition says that already. Other
/// conditions stay; the transition time is kept unless the condition's
/// status flips.
pub(crate) fn next_status(old: &Value, verdict: &Verdict, now: &str) -> Option<Value> {
    let conditions = old["conditions"].as_array().cloned().unwrap_or_default();
    let previous = conditions.iter().find(|c| c["type"] == "Available");
    let mut new = condition(verdict, now);
    if let Some(previous) = previous
        && previous["status"] == new["status"]
    {
        new["lastTransitionTime"] = previous["lastTransitionTime"].clone();
    }
    if previous == Some(&new) {
        return None;
    }
    let mut status = if old.is_object() {
        old.clone()
    } else {
        json!({})
    };
    let mut conditions: Vec<Value> = conditions
        .into_iter()
        .filter(|c| c["type"] != "Available")
        .collect();
    conditions.push(new);
    status["conditions"] = json!(conditions);
    Some(status)
}

/// Checks every APIService every `interval` until the task is aborted.
pub(crate) fn spawn(shared: Arc<Shared>, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            check_all(&shared).await;
        }
    })
}

/// Checks every APIService at once and writes what changed.
async fn check_all(shared: &Arc<Shared>) {
    let (listed, _) = shared.store.list(api_services(), None);
    let mut checks = JoinSet::new();
    for api_service in listed {
        let shared = shared.clone();
        checks.spawn(async move {
            let verdict = check(&shared, &api_service).await;
            (api_service, verdict)
        });
    }
    while let Some(done) = checks.join_next().await {
        let Ok((api_service, verdict)) = done else {
            continue;
        };
        record(shared, &api_service, &verdict);
    }
}

/// Writes `verdict` into the status of `api_service`, if it changes it
/// and the object is still the one checked.
fn record(shared: &Shared, api_service: &Value, verdict: &Verdict) {
    let name = api_service["metadata"]["name"].as_str().unwrap_or_default();
    let uid = &api_service["metadata"]["uid"];
    let written = shared
        .store
        .update(api_services(), "", name, true, |current| {
            let same_object = &current["metadata"]["uid"] == uid;
            match next_status(&current["status"], verdict, &now()) {
                Some(status) if same_object => {
                    let mut new = current.clone();
                    new["status"] = status;
                    Ok(new)
                }
                _ => Ok(current.clone()),
            }
        });
    if let Err(e) = written {
        tracing::debug!(%name, error = %e.message, "APIService status not written");
    }
}

/// Whether `api_service` is available now.
async fn check(shared: &Shared, api_service: &Value) -> Verdict {
    let Some(service) = ServiceRef::of(api_service) else {
        return Verdict::local();
    };
    let addresses = match backend::addresses(&shared.store, &service) {
        Ok(addresses) => addresses,
        Err(missing) => {
            return Verdict {
                available: false,
                reason: missing.reason,
                message: missing.message,
            };
        }
    };
    let spec = &api_service["spec"];
    let path = format!(
        "/apis/{}/{}",
        spec["group"].as_str().unwrap_or_default(),
        spec["version"].as_str().unwrap_or_default()
    );
    let tls = match backend::trust(api_service)
        .and_then(|trust| shared.front_proxy.client_config(trust))
    {
        Ok(tls) => tls,
        Err(why) => return Verdict::failed(why),
    };
    let mut failures = Vec::new();
    for addr in &addresses {
        let url = format!("https://{addr}{path}");
        let attempt = async {
            let (stream, _) = backend::connect(
                tls.clone(),
                &service.server_name(),
                std::slice::from_ref(addr),
                0,
            )
            .await?;
            let request = upstream::Request {
                method: "GET",
                target: &path,
                headers: vec![
                    ("Accept", b"application/json"),
                    (USER_HEADER, b"system:kube-aggregator"),
                    (GROUP_HEADER, b"system:masters"),
                ],
                body: b"",
            };
            upstream::exchange_over(stream, &addr.to_string(), &request).await
        };
        match tokio::time::timeout(CHECK_TIMEOUT, attempt).await {
            Ok(Ok(answer)) if answer.status.is_success() => {
                return Verdict {
                    available: true,
                    reason: "Passed",
                    message: "all checks passed".into(),
                };
            }
            Ok(Ok(answer)) => {
                failures.push(format!("bad status from {url}: {}", answer.status.as_u16()))
            }
            Ok(Err(why)) => failures.push(format!("failing or missing response from {url}: {why}")),
            Err(_) => failures.push(format!(
                "failing or missing response from {url}: no answer within {CHECK_TIMEOUT:?}"
            )),
        }
    }
    Verdict::failed(failures.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passed() -> Verdict {
        Verdict {
            available: true,
            reason: "Passed",
            message: "all checks passed".into(),
        }
    }

    fn missing() -> Verdict {
        Verdict {
            available: false,
            reason: "MissingEndpoints",
            message: "no endpoints".into(),
        }
    }

    #[test]
    fn the_condition_is_written_when_it_changes_and_its_time_only_when_it_flips() {
        let first = next_status(&Value::Null, &passed(), "t1").unwrap();
        assert_eq!(
            first["conditions"],
            json!([{"type": "Available", "status": "True", "lastTransitionTime": "t1",
                    "reason": "Passed", "message": "all checks passed"}])
        );
        assert_eq!(
            next_status(&first, &passed(), "t2"),
            None,
            "no change, no write"
        );
        let down = next_status(&first, &missing(), "t3").unwrap();
        assert_eq!(down["conditions"][0]["lastTransitionTime"], "t3");
        assert_eq!(down["conditions"][0]["status"], "False");
        let failing = Verdict {
            reason: "FailedDiscoveryCheck",
            message: "refused".into(),
            ..missing()
        };
        let still_down = next_status(&down, &failing, "t4").unwrap();
        assert_eq!(
            still_down["conditions"][0]["lastTransitionTime"], "t3",
            "a new reason is not a transition"
        );
        assert_eq!(
            still_down["conditions"][0]["reason"],
            "FailedDiscoveryCheck"
        );
        let others = json!({"conditions": [{"type": "Other", "status": "True"}]});
        let kept = next_status(&others, &passed(), "t5").unwrap();
        assert_eq!(kept["conditions"][0]["type"], "Other");
        assert_eq!(kept["conditions"][1]["type"], "Available");
    }
}
