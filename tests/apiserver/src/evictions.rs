//! Pod evictions (`POST pods/NAME/eviction`, a `policy/v1` Eviction), as
//! kube-apiserver answers them: the pod is deleted only where the
//! PodDisruptionBudget that selects it allows one more disruption, else
//! 429 naming the budget. No disruption controller runs here, so a
//! budget's allowance is worked out at the eviction, from the pods it
//! selects, as that controller works out `status.disruptionsAllowed`: the
//! healthy ones (Ready, not being deleted) less those the budget wants
//! kept (`minAvailable`, or all but `maxUnavailable`; a percentage of the
//! selected pods, rounded up). An unhealthy pod may go while the budget
//! is met (upstream's default `IfHealthyBudget`); a finished pod always
//! may.

use serde_json::{Value, json};

use super::resources;
use super::store::{ApiError, Store};

/// Evicts the pod `namespace/name`, or says why not.
pub fn evict(
    store: &Store,
    namespace: &str,
    name: &str,
    eviction: &Value,
) -> Result<Value, ApiError> {
    if eviction["kind"] != "Eviction" {
        return Err(ApiError::bad_request(format!(
            "an eviction is a policy/v1 Eviction, not {}",
            eviction["kind"]
        )));
    }
    if let Some(named) = eviction["metadata"]["name"].as_str()
        && named != name
    {
        return Err(ApiError::bad_request(format!(
            "name in URL does not match name in Eviction object: {name} and {named}"
        )));
    }
    let pods = resources::find("", "v1", "pods").expect("pods are served");
    let pod = store.get(pods, namespace, name)?;
    let finished = matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if !finished {
        check_budgets(store, namespace, &pod)?;
    }
    let pre = &eviction["deleteOptions"]["preconditions"];
    store.delete(
        pods,
        namespace,
        name,
        (
            pre["uid"].as_str().map(str::to_owned),
            pre["resourceVersion"].as_str().map(str::to_owned),
        ),
    )?;
    Ok(json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Success", "code": 201,
    }))
}

/// Refuses the eviction of `pod` where its budget would not allow it.
fn check_budgets(store: &Store, namespace: &str, pod: &Value) -> Result<(), ApiError> {
    let budgets = resources::find("policy", "v1", "poddisruptionbudgets").expect("served");
    let pods = resources::find("", "v1", "pods").expect("served");
    let (all_budgets, _) = store.list(budgets, Some(namespace));
    let covering: Vec<&Value> = all_budgets
        .iter()
        .filter(|b| selects(&b["spec"]["selector"], &pod["metadata"]["labels"]))
        .collect();
    let budget = match covering.as_slice() {
        [] => return Ok(()),
        [one] => *one,
        _ => {
            return Err(ApiError::new(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    let (namespace_pods, _) = store.list(pods, Some(namespace));
    let selected: Vec<&Value> = namespace_pods
        .iter()
        .filter(|p| selects(&budget["spec"]["selector"], &p["metadata"]["labels"]))
        .collect();
    let healthy = selected.iter().filter(|p| is_healthy(p)).count();
    let desired = desired_healthy(&budget["spec"], selected.len());
    let allowed = if is_healthy(pod) {
        healthy > desired
    } else {
        healthy >= desired
    };
    if allowed {
        return Ok(());
    }
    let budget_name = budget["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError {
        details: Some(json!({"causes": [{
            "reason": "DisruptionBudget",
            "message": format!(
                "The disruption budget {budget_name} needs {desired} healthy pods and has {healthy} currently"
            ),
        }]})),
        ..ApiError::new(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        )
    })
}

/// Ready, and not on its way out.
fn is_healthy(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// How many of `expected` pods the budget `spec` wants healthy.
fn desired_healthy(spec: &Value, expected: usize) -> usize {
    // An integer, or a percentage of the expected pods rounded up.
    let count = |v: &Value| -> Option<usize> {
        match v {
            Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
            Value::String(s) => {
                let percent: usize = s.strip_suffix('%')?.parse().ok()?;
                Some((expected * percent).div_ceil(100))
            }
            _ => None,
        }
    };
    if let Some(min) = count(&spec["minAvailable"]) {
        return min;
    }
    match count(&spec["maxUnavailable"]) {
        Some(max) => expected.saturating_sub(max),
        // A budget that says neither protects nothing.
        None => 0,
    }
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects
/// `labels`; an empty one selects every pod, a missing one none.
fn selects(selector: &Value, labels: &Value) -> bool {
    if !selector.is_object() {
        return false;
    }
    let label = |key: &str| labels[key].as_str();
    let by_labels = selector["matchLabels"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| label(k) == v.as_str()));
    let by_expressions = selector["matchExpressions"].as_array().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values: Vec<&str> = e["values"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e["operator"].as_str().unwrap_or_default() {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => label(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                _ => false,
            }
        })
    });
    by_labels && by_expressions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_want_what_their_spec_says_of_the_pods_they_select() {
        assert_eq!(desired_healthy(&json!({"minAvailable": 2}), 3), 2);
        assert_eq!(desired_healthy(&json!({"minAvailable": "50%"}), 3), 2);
        assert_eq!(desired_healthy(&json!({"maxUnavailable": 1}), 3), 2);
        assert_eq!(desired_healthy(&json!({"maxUnavailable": "100%"}), 3), 0);
        assert_eq!(desired_healthy(&json!({}), 3), 0);
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = json!({"app": "web", "tier": "front"});
        assert!(selects(&json!({}), &labels));
        assert!(!selects(&Value::Null, &labels));
        assert!(selects(&json!({"matchLabels": {"app": "web"}}), &labels));
        assert!(!selects(&json!({"matchLabels": {"app": "db"}}), &labels));
        assert!(selects(
            &json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]}),
            &labels
        ));
        assert!(!selects(
            &json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}),
            &labels
        ));
    }
}
