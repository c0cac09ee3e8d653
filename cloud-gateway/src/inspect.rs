//! What the gateway answers under `/debug/` ([`ccm_runtime::inspect`]):
//! its status (provider, readiness, the budget and who waits for it, the
//! instance cache's hit rate, the provider's last errors) and, per object
//! (`service/<namespace>/<name>`, `node/<name>`), its last calls with their
//! outcome and retry delay.

use std::sync::Arc;

use ccm_runtime::admin::Readiness;
use ccm_runtime::inspect::{Inspect, ago_s, rfc3339};
use serde_json::{Value, json};

use crate::cloud::Cloud;
use crate::cloud::calls::Call;
use crate::metrics::{CacheLabels, PriorityLabels};

/// The gateway's answers.
pub struct GatewayInspector {
    pub cloud: Arc<Cloud>,
    pub readiness: Readiness,
}

fn secs(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

fn call_json(c: &Call) -> Value {
    json!({
        "at": rfc3339(c.at),
        "ago_s": ago_s(c.at),
        "method": c.method,
        "priority": c.priority,
        "outcome": c.outcome,
        "reason": c.reason,
        "message": c.message,
        "retry_after_s": c.retry_after.map(secs),
        "latency_s": secs(c.latency),
    })
}

impl Inspect for GatewayInspector {
    fn status(&self) -> Value {
        let budget = self.cloud.budget().snapshot();
        let metrics = self.cloud.metrics();
        let cache = |result| {
            metrics
                .instance_cache
                .get_or_create(&CacheLabels { result })
                .get()
        };
        let (hits, misses, merged) = (cache("hit"), cache("miss"), cache("merged"));
        let lookups = hits + misses + merged;
        let rejected: u64 = ["high", "normal", "low"]
            .iter()
            .map(|priority| {
                metrics
                    .budget_rejected
                    .get_or_create(&PriorityLabels { priority })
                    .get()
            })
            .sum();
        let (objects, recorded) = self.cloud.calls().size();
        json!({
            "component": "cloud-gateway",
            "build": ccm_runtime::version::json(),
            "provider": self.cloud.name(),
            "ready": self.readiness.is_ready(),
            "budget": {
                "rate": budget.rate,
                "rate_now": (budget.rate_now * 100.0).round() / 100.0,
                "burst": budget.burst,
                "tokens": (budget.tokens * 100.0).round() / 100.0,
                "paused_for_s": secs(budget.paused_for),
                "waiting": {
                    "high": budget.waiting[0],
                    "normal": budget.waiting[1],
                    "low": budget.waiting[2],
                },
                "waiting_total": budget.waiting.iter().sum::<usize>(),
                "max_wait_s": secs(budget.max_wait),
                "throttled_total": metrics.budget_throttled.get(),
                "last_throttled": budget.last_throttled.map(rfc3339),
                "last_throttled_ago_s": budget.last_throttled.map(ago_s),
                "rejected_total": rejected,
            },
            "instance_cache": {
                "hits": hits,
                "misses": misses,
                "merged": merged,
                "hit_rate": (lookups > 0).then(|| (hits + merged) as f64 / lookups as f64),
            },
            "provider_errors": self.cloud.calls().provider_errors().iter().map(|e| json!({
                "at": rfc3339(e.at),
                "ago_s": ago_s(e.at),
                "operation": e.operation,
                "outcome": e.outcome,
                "message": e.message,
            })).collect::<Vec<_>>(),
            "calls": {"objects": objects, "recorded": recorded},
            "served": metrics
                .served
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(service, n)| (service.clone(), json!({"ok": n.ok, "failed": n.failed})))
                .collect::<serde_json::Map<_, _>>(),
        })
    }

    fn object(&self, key: &str) -> Result<Value, String> {
        let well_formed = match key.split('/').collect::<Vec<_>>().as_slice() {
            ["service", ns, name] => !ns.is_empty() && !name.is_empty(),
            ["node", name] => !name.is_empty(),
            _ => false,
        };
        if !well_formed {
            return Err(format!(
                "{key:?} is not service/<namespace>/<name> or node/<name>"
            ));
        }
        Ok(json!({
            "object": key,
            "calls": self.cloud.calls().calls(key).iter().map(call_json).collect::<Vec<_>>(),
        }))
    }
}
