//! Who may read an admin endpoint, as upstream's controller managers
//! decide it: the always-allowed paths (`/healthz`, `/readyz`, `/livez` by
//! default, as `--authorization-always-allow-paths`) answer anyone; every
//! other path needs a bearer token that passes a check: for a process with
//! a Kubernetes API, a TokenReview of the token and a SubjectAccessReview
//! of the path (a non-resource URL, verb `get`) for the whole identity the
//! review found (user, uid, groups, extra), each answer kept for
//! [`CACHE_FOR`]. No token, or one that is not valid: 401; a valid one
//! without the grant: 403.
//!
//! Anyone who reaches the port can send tokens, so what a stranger costs
//! the API server is bounded, as the gateway bounds its own reviews: a
//! token not seen accepted before is reviewed only within a rate and a
//! number in flight ([`ReviewLimits`]), else the request is answered 429
//! and counted (`ccm_admin_token_reviews_total{result="limited"}`);
//! concurrent requests with one token share one review; answers are kept
//! in caches that forget the least recently used first. A caller the API
//! server accepted before is never held to those limits.
//!
//! Tokens are reviewed for the API server's own audiences, as upstream's
//! are, or for [`PEER_AUDIENCE`], the audience of the tokens the
//! diagnostics API sends its peers, which the API server itself refuses.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use hashlink::LruCache;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::{OnceCell, Semaphore};

/// How long a review's answer is kept, allowed or not (upstream's
/// delegated authentication and authorisation keep theirs 10 s).
pub const CACHE_FOR: Duration = Duration::from_secs(10);

/// Answers kept at most, of each kind; past it the least recently used
/// goes.
const CACHE_ENTRIES: usize = 4096;

/// The audience of the tokens the diagnostics API shows the admin ports of
/// its peers (the leaders, the gateway): one the API server does not
/// accept, so a token a peer receives, or an impostor captures, calls no
/// Kubernetes API.
pub const PEER_AUDIENCE: &str = "diagnostics.cloudgateway.io";

/// A bearer token longer than this is refused unread (ServiceAccount
/// tokens are about a kilobyte).
const MAX_TOKEN: usize = 16 * 1024;

/// How many TokenReviews of tokens not seen accepted before a port may
/// ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct ReviewLimits {
    /// Per second; twice as many in a burst.
    pub per_second: f64,
    /// In flight at once.
    pub in_flight: usize,
}

impl Default for ReviewLimits {
    fn default() -> Self {
        Self {
            per_second: 5.0,
            in_flight: 4,
        }
    }
}

/// The label of [`ReviewCounts`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// `accepted`, `refused`, `limited` (not asked: past the limits; the
    /// request was answered 429) or `unavailable` (the API server could
    /// not answer).
    pub result: &'static str,
}

/// The admin port's TokenReviews by result.
pub type ReviewCounts = Family<ReviewLabels, Counter>;

const RESULTS: [&str; 4] = ["accepted", "refused", "limited", "unavailable"];

/// Registers `ccm_admin_token_reviews_total{result}`, every result listed
/// from the start, and returns the counts to hand to [`Reviews::new`].
pub fn register(registry: &mut Registry) -> ReviewCounts {
    let counts = ReviewCounts::default();
    for result in RESULTS {
        // Listed at zero, so a query of a result never seen still matches.
        let _ = counts.get_or_create(&ReviewLabels { result });
    }
    registry.register(
        "ccm_admin_token_reviews",
        "Bearer tokens the admin port had reviewed, by result (limited: refused with 429, the API server not asked)",
        crate::metrics::Listed(counts.clone()),
    );
    counts
}

/// The paths anyone may read unless configured otherwise.
pub const DEFAULT_ALWAYS_ALLOW: &[&str] = &["/healthz", "/readyz", "/livez"];

/// What a check says of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// 401: the token is not valid (the reason).
    Unauthenticated(String),
    /// 403: the caller may not read the path (the reason).
    Forbidden(String),
    /// 503: the check could not be made now.
    Unavailable(String),
    /// 429: too many unknown tokens are being reviewed; ask again shortly.
    TooManyRequests(String),
}

/// A check of `(token, path)`.
pub type Check = Arc<dyn Fn(String, String) -> BoxFuture<'static, Decision> + Send + Sync>;

/// Who may read what on an admin port; clones share the check.
#[derive(Clone)]
pub struct Access {
    always_allow: Vec<String>,
    check: Option<Check>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("always_allow", &self.always_allow)
            .field("checked", &self.check.is_some())
            .finish()
    }
}

impl Access {
    /// `always_allow` open to anyone (a path, or a prefix ending in `*`);
    /// the rest by `check`, or to no one without one.
    pub fn new(always_allow: Vec<String>, check: Option<Check>) -> Self {
        Self {
            always_allow,
            check,
        }
    }

    /// Whether `path` answers anyone.
    pub fn always_allowed(&self, path: &str) -> bool {
        self.always_allow
            .iter()
            .any(|allowed| match allowed.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => path == allowed,
            })
    }

    /// The decision on a request for `path` with `token` (the bearer
    /// token, if any).
    pub async fn decide(&self, path: &str, token: Option<&str>) -> Decision {
        if self.always_allowed(path) {
            return Decision::Allow;
        }
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return Decision::Unauthenticated(format!(
                "{path} needs a bearer token (only {} answer without one)",
                self.always_allow.join(", ")
            ));
        };
        match &self.check {
            Some(check) => check(token.to_owned(), path.to_owned()).await,
            None => Decision::Forbidden(
                "this process has no way to check credentials; only the always-allowed paths answer"
                    .into(),
            ),
        }
    }
}

/// The user a TokenReview found: the whole identity a SubjectAccessReview
/// asks about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Reviewed {
    username: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

/// A SubjectAccessReview's question: who (all of it), what verb, which
/// path.
type Question = (Reviewed, &'static str, String);

/// A token's SHA-256: the caches never hold a token itself.
type Digest = [u8; 32];

/// What one TokenReview said.
#[derive(Clone, Debug)]
enum Review {
    /// Who the token is, or why it is no one; kept.
    Answered(Result<Reviewed, String>),
    /// The API server could not answer; not kept.
    Unavailable(String),
    /// Not asked: past the limits; not kept.
    Limited,
}

/// A token bucket.
#[derive(Debug)]
struct Rate {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Rate {
    fn new(per_second: f64) -> Self {
        let burst = (per_second * 2.0).max(1.0);
        Self {
            per_second,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct State {
    /// By digest: who the token is, or why no one, with when.
    tokens: LruCache<Digest, (Instant, Result<Reviewed, String>)>,
    /// By question: allowed or why not, with when.
    grants: LruCache<Question, (Instant, Result<(), String>)>,
    /// TokenReviews under way, shared by every request with the token.
    pending: HashMap<Digest, Arc<OnceCell<Review>>>,
    rate: Rate,
}

/// TokenReview and SubjectAccessReview through the API server, answers
/// kept for [`CACHE_FOR`], reviews of unknown tokens within
/// [`ReviewLimits`].
pub struct Reviews {
    client: kube::Client,
    state: Mutex<State>,
    unknown: Arc<Semaphore>,
    counts: ReviewCounts,
}

impl Reviews {
    /// Reviews with `client` (the process's own ServiceAccount, which
    /// `system:auth-delegator` lets create both reviews) within `limits`,
    /// counting in `counts` (from [`register`]).
    pub fn new(client: kube::Client, limits: &ReviewLimits, counts: ReviewCounts) -> Arc<Self> {
        Arc::new(Self {
            client,
            state: Mutex::new(State {
                tokens: LruCache::new(CACHE_ENTRIES),
                grants: LruCache::new(CACHE_ENTRIES),
                pending: HashMap::new(),
                rate: Rate::new(limits.per_second),
            }),
            unknown: Arc::new(Semaphore::new(limits.in_flight.max(1))),
            counts,
        })
    }

    /// These reviews as an [`Access`] check.
    pub fn check(self: &Arc<Self>) -> Check {
        let this = self.clone();
        Arc::new(move |token, path| {
            let this = this.clone();
            Box::pin(async move { this.decide(&token, &path).await })
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, result: &'static str) {
        self.counts.get_or_create(&ReviewLabels { result }).inc();
    }

    async fn decide(&self, token: &str, path: &str) -> Decision {
        let user = match self.who(token).await {
            Review::Answered(Ok(user)) => user,
            Review::Answered(Err(why)) => return Decision::Unauthenticated(why),
            Review::Unavailable(why) => return Decision::Unavailable(why),
            Review::Limited => {
                return Decision::TooManyRequests(
                    "too many unknown tokens to review now; retry shortly".into(),
                );
            }
        };
        match self.may_get(user, path).await {
            Ok(Ok(())) => Decision::Allow,
            Ok(Err(why)) => Decision::Forbidden(why),
            Err(why) => Decision::Unavailable(why),
        }
    }

    /// Who `token` is: from the cache, from a review under way for it, or
    /// from a review of its own.
    async fn who(&self, token: &str) -> Review {
        if token.len() > MAX_TOKEN {
            self.count("refused");
            return Review::Answered(Err("the bearer token is too long".into()));
        }
        let digest: Digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        let (cell, known) = {
            let mut state = self.state();
            let known = match state.tokens.get(&digest) {
                Some((at, answer)) if at.elapsed() < CACHE_FOR => {
                    return Review::Answered(answer.clone());
                }
                // Accepted before: a caller the API server knows, whose
                // review again is not held to the limits.
                Some((_, answer)) => answer.is_ok(),
                None => false,
            };
            (state.pending.entry(digest).or_default().clone(), known)
        };
        let review = cell.get_or_init(|| self.review(token, known)).await.clone();
        let mut state = self.state();
        if state
            .pending
            .get(&digest)
            .is_some_and(|c| Arc::ptr_eq(c, &cell))
        {
            state.pending.remove(&digest);
            if let Review::Answered(answer) = &review {
                state
                    .tokens
                    .insert(digest, (Instant::now(), answer.clone()));
            }
        }
        review
    }

    /// One TokenReview, unless `token` is unknown and the limits are
    /// reached.
    async fn review(&self, token: &str, known: bool) -> Review {
        let _permit = if known {
            None
        } else {
            let allowed = self.state().rate.take();
            match self.unknown.clone().try_acquire_owned() {
                Ok(permit) if allowed => Some(permit),
                _ => {
                    self.count("limited");
                    return Review::Limited;
                }
            }
        };
        let audience = peer_audience(token);
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: audience.map(|a| vec![a.to_owned()]),
            },
            ..TokenReview::default()
        };
        let answered = match kube::Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(answered) => answered,
            Err(e) => {
                self.count("unavailable");
                return Review::Unavailable(format!("TokenReview: {e}"));
            }
        };
        let status = answered.status.unwrap_or_default();
        let bound = audience.is_none_or(|a| {
            status
                .audiences
                .as_ref()
                .is_some_and(|got| got.iter().any(|g| g == a))
        });
        let answer = match (status.authenticated, status.user) {
            (Some(true), Some(user)) if bound => Ok(Reviewed {
                username: user.username.unwrap_or_default(),
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }),
            (Some(true), Some(_)) => Err(format!("the token is not bound to {PEER_AUDIENCE:?}")),
            _ => Err(status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "the token is not valid".into())),
        };
        self.count(if answer.is_ok() {
            "accepted"
        } else {
            "refused"
        });
        Review::Answered(answer)
    }

    /// Whether `user` may `get` `path`, asked of the API server for the
    /// whole identity (two users of one name and other groups are two
    /// questions).
    async fn may_get(&self, user: Reviewed, path: &str) -> Result<Result<(), String>, String> {
        let question: Question = (user, "get", path.to_owned());
        if let Some((at, answer)) = self.state().grants.get(&question)
            && at.elapsed() < CACHE_FOR
        {
            return Ok(answer.clone());
        }
        let (user, verb, _) = &question;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some((*verb).into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answered = kube::Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        let status = answered.status.unwrap_or_default();
        let answer = if status.allowed {
            Ok(())
        } else {
            Err(format!(
                "user {:?} may not get {path}{}",
                user.username,
                status
                    .reason
                    .filter(|r| !r.is_empty())
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ))
        };
        self.state()
            .grants
            .insert(question, (Instant::now(), answer.clone()));
        Ok(answer)
    }
}

/// [`PEER_AUDIENCE`] when `token` is a JWT that says it is bound to it: it
/// is then reviewed for that audience (the API server verifies the claim;
/// one that lies is refused), else for the API server's own.
fn peer_audience(token: &str) -> Option<&'static str> {
    let payload = token.split('.').nth(1)?;
    let bytes = data_encoding::BASE64URL_NOPAD
        .decode(payload.trim_end_matches('=').as_bytes())
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let names = |aud: &serde_json::Value| match aud {
        serde_json::Value::String(a) => a == PEER_AUDIENCE,
        serde_json::Value::Array(list) => list.iter().any(|a| a == PEER_AUDIENCE),
        _ => false,
    };
    names(&claims["aud"]).then_some(PEER_AUDIENCE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn always(decision: Decision) -> Check {
        Arc::new(move |_, _| {
            let decision = decision.clone();
            Box::pin(async move { decision })
        })
    }

    #[tokio::test]
    async fn probes_answer_anyone_and_the_rest_needs_a_token_that_passes() {
        let open = |d| {
            Access::new(
                vec![
                    "/healthz".into(),
                    "/readyz".into(),
                    "/livez".into(),
                    "/open/*".into(),
                ],
                Some(always(d)),
            )
        };
        let access = open(Decision::Allow);
        assert_eq!(access.decide("/livez", None).await, Decision::Allow);
        assert_eq!(access.decide("/open/anything", None).await, Decision::Allow);
        assert!(matches!(
            access.decide("/metrics", None).await,
            Decision::Unauthenticated(_)
        ));
        assert!(matches!(
            access.decide("/metrics", Some("")).await,
            Decision::Unauthenticated(_)
        ));
        assert_eq!(access.decide("/metrics", Some("t")).await, Decision::Allow);
        let refusing = open(Decision::Forbidden("no".into()));
        assert_eq!(
            refusing.decide("/debug/status", Some("t")).await,
            Decision::Forbidden("no".into())
        );
        assert_eq!(refusing.decide("/readyz", None).await, Decision::Allow);
        let unchecked = Access::new(vec!["/livez".into()], None);
        assert!(matches!(
            unchecked.decide("/metrics", Some("t")).await,
            Decision::Forbidden(_)
        ));
    }

    #[test]
    fn a_token_saying_it_is_for_the_peers_is_reviewed_for_them() {
        let jwt = |claims: serde_json::Value| {
            let part = |v: &serde_json::Value| {
                data_encoding::BASE64URL_NOPAD.encode(v.to_string().as_bytes())
            };
            format!(
                "{}.{}.sig",
                part(&serde_json::json!({"alg": "RS256"})),
                part(&claims)
            )
        };
        assert_eq!(
            peer_audience(&jwt(serde_json::json!({"aud": [PEER_AUDIENCE]}))),
            Some(PEER_AUDIENCE)
        );
        assert_eq!(
            peer_audience(&jwt(serde_json::json!({"aud": PEER_AUDIENCE}))),
            Some(PEER_AUDIENCE)
        );
        for other in [
            jwt(serde_json::json!({"aud": ["https://kubernetes.default.svc"]})),
            jwt(serde_json::json!({})),
            "an opaque token".to_owned(),
            "a.b!.c".to_owned(),
        ] {
            assert_eq!(peer_audience(&other), None, "{other}");
        }
    }

    #[test]
    fn the_bucket_gives_a_burst_of_twice_the_rate_then_the_rate() {
        let mut rate = Rate::new(5.0);
        let burst = (0..100).filter(|_| rate.take()).count();
        assert_eq!(burst, 10);
        rate.last -= Duration::from_millis(400);
        assert_eq!((0..100).filter(|_| rate.take()).count(), 2);
    }
}
