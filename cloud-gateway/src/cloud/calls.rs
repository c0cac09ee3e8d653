//! What the gateway remembers of recent calls, for an operator who asks why
//! something waits (`/debug/object`, `/debug/status`): the last few calls
//! per object (`service/<namespace>/<name>`, `node/<name>`) with their
//! outcome and retry delay, and the provider's last errors. Bounded: at
//! most [`MAX_OBJECTS`] objects (the least recently called go first),
//! [`PER_OBJECT`] calls each, [`MAX_ERRORS`] errors. Nothing secret is
//! kept: object names, outcomes and the messages callers already get.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// The most objects remembered.
pub const MAX_OBJECTS: usize = 4096;
/// The most calls remembered per object.
pub const PER_OBJECT: usize = 8;
/// The most provider errors remembered.
pub const MAX_ERRORS: usize = 20;
/// The longest object name and message kept, in bytes; longer ones are
/// cut (a call is recorded before its request is validated).
pub const MAX_TEXT: usize = 1024;

/// `text` cut to [`MAX_TEXT`] bytes, on a character boundary.
fn bounded(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// One call as its caller saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub at: SystemTime,
    /// The RPC, e.g. `EnsureLoadBalancer`.
    pub method: &'static str,
    /// The budget priority it asked at.
    pub priority: &'static str,
    /// `Ok` or the gRPC code, as tonic names them (`ResourceExhausted`).
    pub outcome: String,
    /// The machine-readable reason of a failure, e.g. `CLOUD_THROTTLED`.
    pub reason: String,
    /// The failure's message; empty on success.
    pub message: String,
    /// The delay the caller was told to wait, if any.
    pub retry_after: Option<Duration>,
    pub latency: Duration,
}

/// One failed provider call.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderError {
    pub at: SystemTime,
    /// The operation, e.g. `ensure_load_balancer`.
    pub operation: &'static str,
    /// The outcome label, e.g. `throttled`.
    pub outcome: &'static str,
    pub message: String,
}

#[derive(Default)]
struct Inner {
    /// Each object's calls, with the number of the last record that
    /// touched it.
    by_object: HashMap<String, (u64, VecDeque<Call>)>,
    /// Objects in the order records touched them, each with that record's
    /// number; an entry whose object was touched again later is stale.
    order: VecDeque<(String, u64)>,
    errors: VecDeque<ProviderError>,
    records: u64,
}

/// The log; share it behind an `Arc`.
#[derive(Default)]
pub struct CallLog {
    inner: Mutex<Inner>,
}

impl CallLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers `call` for each of `objects`.
    pub fn record<'a>(&self, objects: impl IntoIterator<Item = &'a str>, mut call: Call) {
        call.message.truncate(bounded(&call.message).len());
        let mut inner = self.lock();
        inner.records += 1;
        let seq = inner.records;
        for object in objects.into_iter().map(bounded) {
            let (last, calls) = inner.by_object.entry(object.to_owned()).or_default();
            *last = seq;
            if calls.len() == PER_OBJECT {
                calls.pop_front();
            }
            calls.push_back(call.clone());
            inner.order.push_back((object.to_owned(), seq));
        }
        if inner.order.len() > MAX_OBJECTS * PER_OBJECT {
            // Mostly stale entries: keep one per object, oldest first.
            let mut live: Vec<_> = inner
                .by_object
                .iter()
                .map(|(o, (last, _))| (o.clone(), *last))
                .collect();
            live.sort_by_key(|(_, last)| *last);
            inner.order = live.into();
        }
        // The least recently touched objects go first.
        while inner.by_object.len() > MAX_OBJECTS {
            let Some((object, seq)) = inner.order.pop_front() else {
                break;
            };
            if inner
                .by_object
                .get(&object)
                .is_some_and(|(last, _)| *last == seq)
            {
                inner.by_object.remove(&object);
            }
        }
    }

    /// Remembers a failed provider call.
    pub fn provider_error(&self, mut error: ProviderError) {
        error.message.truncate(bounded(&error.message).len());
        let mut inner = self.lock();
        if inner.errors.len() == MAX_ERRORS {
            inner.errors.pop_front();
        }
        inner.errors.push_back(error);
    }

    /// The remembered calls for `object`, oldest first.
    pub fn calls(&self, object: &str) -> Vec<Call> {
        self.lock()
            .by_object
            .get(object)
            .map(|(_, c)| c.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The provider's last errors, oldest first.
    pub fn provider_errors(&self) -> Vec<ProviderError> {
        self.lock().errors.iter().cloned().collect()
    }

    /// How many objects are remembered, and calls recorded in all.
    pub fn size(&self) -> (usize, u64) {
        let inner = self.lock();
        (inner.by_object.len(), inner.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(at: u64, outcome: &str) -> Call {
        Call {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
            method: "EnsureLoadBalancer",
            priority: "high",
            outcome: outcome.into(),
            reason: String::new(),
            message: String::new(),
            retry_after: None,
            latency: Duration::ZERO,
        }
    }

    #[test]
    fn each_object_keeps_its_last_calls_in_order() {
        let log = CallLog::default();
        for i in 0..(PER_OBJECT as u64 + 3) {
            log.record(["service/default/web"], call(i, "OK"));
        }
        log.record(["node/a", "node/b"], call(100, "Unavailable"));
        let web = log.calls("service/default/web");
        assert_eq!(web.len(), PER_OBJECT);
        assert_eq!(web[0].at, call(3, "OK").at, "the oldest went first");
        assert_eq!(log.calls("node/b")[0].outcome, "Unavailable");
        assert!(log.calls("node/c").is_empty());
    }

    #[test]
    fn the_least_recently_called_objects_are_forgotten_first() {
        let log = CallLog::default();
        log.record(["service/default/old"], call(0, "OK"));
        log.record(["service/default/kept"], call(1, "OK"));
        for i in 0..MAX_OBJECTS as u64 {
            if i == MAX_OBJECTS as u64 / 2 {
                log.record(["service/default/kept"], call(2 + i, "OK"));
            }
            log.record([format!("node/n{i}").as_str()], call(2 + i, "OK"));
        }
        assert!(log.size().0 <= MAX_OBJECTS);
        assert!(log.calls("service/default/old").is_empty());
        assert_eq!(log.calls("service/default/kept").len(), 2);
    }

    #[test]
    fn long_names_and_messages_are_cut() {
        let log = CallLog::default();
        let name = format!("service/default/{}", "é".repeat(MAX_TEXT));
        let mut long = call(0, "Unavailable");
        long.message = "x".repeat(10 * MAX_TEXT);
        log.record([name.as_str()], long);
        let kept = log.lock().by_object.keys().next().cloned().unwrap();
        assert!(kept.len() <= MAX_TEXT && name.starts_with(&kept));
        assert_eq!(log.calls(&kept)[0].message.len(), MAX_TEXT);
    }

    #[test]
    fn provider_errors_are_bounded() {
        let log = CallLog::default();
        for i in 0..(MAX_ERRORS + 5) {
            log.provider_error(ProviderError {
                at: SystemTime::UNIX_EPOCH,
                operation: "get_instances",
                outcome: "throttled",
                message: format!("error {i}"),
            });
        }
        let errors = log.provider_errors();
        assert_eq!(errors.len(), MAX_ERRORS);
        assert_eq!(errors[0].message, "error 5");
    }
}
