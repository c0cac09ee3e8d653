//! What an operator can ask a process about its work, served by the admin
//! server as JSON: `/debug/status` (the process at a glance) and
//! `/debug/object?key=...` (one object). The diagnostics API (see
//! `diagnostics`) reads them for `kubectl ccm`. Every answer is
//! bounded in size and holds nothing secret: object keys, states, error
//! messages and times.
//!
//! Times are given twice: as RFC 3339 and as seconds relative to the
//! answer (`*_ago_s`, `*_in_s`), so a reader whose clock differs from the
//! process's still reads the right durations.

use std::hash::Hash;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use ccm_proto::{GatewayClient, Reach};
use serde_json::{Value, json};

use crate::leader::Leadership;
use crate::queue::{KeyStatus, Trouble, WorkQueue};

/// The most troubled keys a status lists.
pub const MAX_LISTED: usize = 50;

/// What a process answers under `/debug/`.
pub trait Inspect: Send + Sync {
    /// The process at a glance.
    fn status(&self) -> Value;
    /// One object, by the key an operator writes (`namespace/name`, a
    /// node's name, ...); an error says why the key is not one.
    fn object(&self, key: &str) -> Result<Value, String>;
}

/// Where the admin server finds the process's [`Inspect`], set once the
/// process has built it (after the admin server started).
#[derive(Clone, Default)]
pub struct Inspection(Arc<OnceLock<Arc<dyn Inspect>>>);

impl Inspection {
    /// An empty slot: `/debug/` answers 503 until [`Self::set`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Fills the slot; later calls change nothing.
    pub fn set(&self, inspect: Arc<dyn Inspect>) {
        let _ = self.0.set(inspect);
    }

    /// What the slot holds.
    pub fn get(&self) -> Option<&Arc<dyn Inspect>> {
        self.0.get()
    }
}

/// A time as RFC 3339.
pub fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Seconds from `t` to now (negative when `t` is ahead), to 0.1 s.
pub fn ago_s(t: SystemTime) -> f64 {
    let secs = match SystemTime::now().duration_since(t) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    (secs * 10.0).round() / 10.0
}

/// A trouble as JSON.
pub fn trouble_json(t: &Trouble) -> Value {
    json!({
        "failures": t.failures,
        "waiting": t.waiting,
        "kind": t.kind,
        "message": t.message,
        "since": t.since.map(rfc3339),
        "since_ago_s": t.since.map(ago_s),
        "next_try": t.next_try.map(rfc3339),
        "next_try_in_s": t.next_try.map(|n| -ago_s(n)),
    })
}

/// A key's queue state as JSON.
pub fn key_status_json(s: &KeyStatus) -> Value {
    json!({
        "queued": s.queued,
        "in_flight": s.in_flight,
        "trouble": s.trouble.as_ref().map(trouble_json),
    })
}

/// Whether the gateway answers, as JSON.
pub fn reach_json(r: &Reach) -> Value {
    json!({
        "reachable": !r.unreachable(),
        "last_answer": r.last_answer.map(rfc3339),
        "last_answer_ago_s": r.last_answer.map(ago_s),
        "last_no_answer": r.last_no_answer.as_ref().map(|(at, why)| json!({
            "at": rfc3339(*at),
            "ago_s": ago_s(*at),
            "message": why,
        })),
    })
}

/// How a controller's keys read: parsed from an operator's text (an error
/// says why the text names none), and shown as an operator writes them.
pub type Keys<K> = (fn(&str) -> Result<K, String>, fn(&K) -> String);

/// A controller's own fields in its status.
pub type Extra = Box<dyn Fn() -> Value + Send + Sync>;

/// A controller's own fields of one object.
pub type ObjectExtra<K> = Box<dyn Fn(&K) -> Value + Send + Sync>;

/// What a controller answers: what every controller has (identity,
/// leadership, the gateway's reach, its queue and the keys in trouble),
/// and what its own `extra` and `object_extra` add.
pub struct ControllerInspector<K> {
    /// The controller's name, as its events say.
    pub controller: &'static str,
    /// The lease it leads by.
    pub lease: String,
    pub leadership: Leadership,
    pub gateway: GatewayClient,
    pub queue: WorkQueue<K>,
    /// The key an operator's text names; `Err` says why it names none.
    pub parse: fn(&str) -> Result<K, String>,
    /// A key as an operator writes it.
    pub show: fn(&K) -> String,
    /// The controller's own fields in its status.
    pub extra: Extra,
    /// The controller's own fields of one object.
    pub object_extra: ObjectExtra<K>,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Inspect for ControllerInspector<K> {
    fn status(&self) -> Value {
        let stats = self.queue.stats();
        let (troubled, total) = self.queue.troubled(MAX_LISTED);
        let mut status = json!({
            "controller": self.controller,
            "build": crate::version::json(),
            "identity": self.leadership.identity(),
            "lease": self.lease,
            "leading": self.leadership.is_leader(),
            "gateway": reach_json(&self.gateway.reach()),
            "queue": {
                "depth": stats.depth,
                "in_flight": stats.in_flight,
                "failing": stats.failing,
                "failing_repeatedly": stats.failing_repeatedly,
                "waiting": stats.waiting,
                // This term's first pass: every key it started with tried.
                "first_pass_s": stats.first_pass.map(|d| d.as_secs_f64()),
            },
            "troubled": troubled.iter().map(|(k, t)| {
                let mut entry = trouble_json(t);
                entry["key"] = (self.show)(k).into();
                entry
            }).collect::<Vec<_>>(),
            "troubled_total": total,
        });
        merge(&mut status, (self.extra)());
        status
    }

    fn object(&self, key: &str) -> Result<Value, String> {
        let parsed = (self.parse)(key)?;
        let mut object = json!({
            "controller": self.controller,
            "key": (self.show)(&parsed),
            "identity": self.leadership.identity(),
            "leading": self.leadership.is_leader(),
            "gateway": reach_json(&self.gateway.reach()),
            "queue": key_status_json(&self.queue.status(&parsed)),
        });
        merge(&mut object, (self.object_extra)(&parsed));
        Ok(object)
    }
}

/// Adds `extra`'s fields to `into` (both objects; anything else is
/// ignored).
fn merge(into: &mut Value, extra: Value) {
    if let (Some(into), Value::Object(extra)) = (into.as_object_mut(), extra) {
        into.extend(extra);
    }
}

/// Parses `namespace/name`.
pub fn namespaced_key(key: &str) -> Result<(String, String), String> {
    match key.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{key:?} is not namespace/name")),
    }
}

/// Parses a cluster-scoped name.
pub fn cluster_key(key: &str) -> Result<String, String> {
    if key.is_empty() || key.contains('/') {
        Err(format!("{key:?} is not a name"))
    } else {
        Ok(key.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::queue::Backoff;

    fn inspector() -> ControllerInspector<(String, String)> {
        let gateway = GatewayClient::new(ccm_proto::ClientConfig::new(
            "http://127.0.0.1:1",
            "kubernetes",
            ccm_proto::TokenSource::Static("t".into()),
        ))
        .unwrap();
        ControllerInspector {
            controller: "service-controller",
            lease: "ccm-service-controller".into(),
            leadership: Leadership::always(),
            gateway,
            queue: WorkQueue::new(Backoff {
                base: Duration::from_secs(5),
                max: Duration::from_secs(300),
            }),
            parse: namespaced_key,
            show: |(ns, name)| format!("{ns}/{name}"),
            extra: Box::new(|| json!({"classes": ["default"]})),
            object_extra: Box::new(|(_, name)| json!({"provisioning": name == "web"})),
        }
    }

    #[tokio::test]
    async fn a_status_names_the_leader_the_queue_and_the_keys_in_trouble() {
        let i = inspector();
        let errors = crate::metrics::ErrorCounts::default();
        i.queue.retry_failed(
            ("default".into(), "api".into()),
            &errors,
            "unavailable",
            "gateway: unavailable: the cloud is down".into(),
        );
        let status = i.status();
        assert_eq!(status["leading"], true);
        assert_eq!(status["queue"]["failing"], 1);
        assert_eq!(status["troubled"][0]["key"], "default/api");
        assert_eq!(status["troubled"][0]["kind"], "unavailable");
        let next = status["troubled"][0]["next_try_in_s"].as_f64().unwrap();
        assert!((4.0..=5.0).contains(&next), "{next}");
        assert_eq!(status["classes"][0], "default");
        assert_eq!(status["gateway"]["reachable"], true, "nothing tried yet");
    }

    #[tokio::test]
    async fn an_object_has_its_queue_state_and_the_controllers_own_fields() {
        let i = inspector();
        i.queue.wait(
            ("default".into(), "web".into()),
            "provisioning",
            "ready in 30s".into(),
            Duration::from_secs(5),
        );
        let web = i.object("default/web").unwrap();
        assert_eq!(web["queue"]["trouble"]["kind"], "provisioning");
        assert_eq!(web["queue"]["trouble"]["waiting"], true);
        assert_eq!(web["provisioning"], true);
        assert_eq!(
            i.object("default/other").unwrap()["queue"]["trouble"],
            Value::Null
        );
        assert!(i.object("no-namespace").is_err());
    }
}
