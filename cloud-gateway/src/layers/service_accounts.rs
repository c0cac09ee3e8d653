//! Callers inside a cluster authenticate with their projected ServiceAccount
//! tokens. The gateway asks the Kubernetes API (TokenReview) whether a
//! token is valid for its audience and whose it is, and maps the
//! ServiceAccount to a role from its configuration. Answers are cached
//! briefly and concurrent reviews of one token are shared, so a controller
//! starting 32 workers causes one review, not 32.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use tokio::sync::{OnceCell, Semaphore};
use tonic::Status;

use ccm_runtime::names::{is_dns_label, is_dns_subdomain};

use crate::identity::{Caller, Role};
use crate::metrics::{Metrics, ReviewLabels};

/// How long a refusal is remembered, so a client with a bad token cannot
/// turn every call into an API request.
const REFUSAL_TTL: Duration = Duration::from_secs(5);
/// Past this many remembered tokens of a kind, expired ones are dropped.
const MAX_CACHED: usize = 4096;
/// A bearer token longer than this is refused unread (ServiceAccount
/// tokens are about a kilobyte).
const MAX_TOKEN: usize = 16 * 1024;
/// Reviews of tokens accepted before (re-reviews after the cache TTL) run
/// beside the unknown ones, at most this many at once: a flood of bad
/// tokens never delays a caller the gateway already knows.
const KNOWN_IN_FLIGHT: usize = 4;
/// At most one "token refused" log line per this interval.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// ServiceAccount authentication settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceAccountAuth {
    /// `system:serviceaccount:<namespace>:<name>` → role.
    pub roles: HashMap<String, Role>,
    /// The audience tokens must be bound to.
    pub audience: String,
    /// How long an accepted token is trusted; one in use is reviewed again
    /// in the background in the last fifth of it.
    pub cache_ttl: Duration,
    /// The kubeconfig to reach the API with; in-cluster config without it.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Reviews of tokens not seen accepted before, per second (the burst
    /// is twice as many); past it such calls are `UNAVAILABLE`.
    pub reviews_per_second: f64,
    /// Reviews of such tokens in flight at once.
    pub reviews_in_flight: usize,
}

impl ServiceAccountAuth {
    /// Parses `namespace/name=role,...` into the role map, reporting each
    /// bad entry.
    pub fn parse_roles(text: &str) -> Result<HashMap<String, Role>, Vec<String>> {
        let mut roles = HashMap::new();
        let mut problems = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let parsed = entry
                .split_once('=')
                .and_then(|(account, role)| Some((account.split_once('/')?, role)))
                .filter(|((ns, name), _)| is_dns_label(ns) && is_dns_subdomain(name));
            let Some(((ns, name), role)) = parsed else {
                problems.push(format!(
                    "{entry:?}: use <namespace>/<serviceaccount>=<role>"
                ));
                continue;
            };
            match role.parse::<Role>() {
                Ok(role) => {
                    if roles
                        .insert(format!("system:serviceaccount:{ns}:{name}"), role)
                        .is_some()
                    {
                        problems.push(format!("{ns}/{name} appears twice"));
                    }
                }
                Err(e) => problems.push(format!("{entry:?}: {e}")),
            }
        }
        if problems.is_empty() {
            Ok(roles)
        } else {
            Err(problems)
        }
    }
}

/// A token's SHA-256: the cache never holds a token itself.
type Digest = [u8; 32];

fn digest(token: &[u8]) -> Digest {
    let mut out = [0; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token).as_ref());
    out
}

/// One review's outcome.
#[derive(Clone, Debug)]
enum Outcome {
    Accepted(Caller),
    Refused(String),
    /// Not reviewed: the API could not be asked, or the review budget was
    /// spent. Nothing is remembered; the client retries.
    Unavailable(&'static str),
}

#[derive(Default)]
struct Cache {
    /// Tokens the API accepted, by digest, with when. Kept past the TTL:
    /// a stale entry marks a known caller, whose re-review goes first.
    accepted: HashMap<Digest, (Instant, Caller)>,
    /// Tokens refused, with when and why.
    refused: HashMap<Digest, (Instant, String)>,
    /// Reviews under way, shared by every call with the same token.
    pending: HashMap<Digest, Arc<OnceCell<Outcome>>>,
}

/// A token bucket for reviews of unknown tokens.
struct Rate {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Rate {
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

/// Reviews tokens against the Kubernetes API.
pub struct TokenReviewer {
    api: Api<TokenReview>,
    settings: ServiceAccountAuth,
    cache: Mutex<Cache>,
    rate: Mutex<Rate>,
    unknown: Arc<Semaphore>,
    known: Arc<Semaphore>,
    metrics: Metrics,
    /// When a refusal was last logged, and how many went unlogged since.
    logged: Mutex<(Option<Instant>, u64)>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn bounded<V>(map: &mut HashMap<Digest, (Instant, V)>, ttl: Duration) {
    if map.len() >= MAX_CACHED {
        map.retain(|_, (at, _)| at.elapsed() < ttl);
    }
    if map.len() >= MAX_CACHED {
        map.clear();
    }
}

impl TokenReviewer {
    /// Reviews tokens through `client`, counting outcomes in `metrics`.
    pub fn new(client: kube::Client, settings: ServiceAccountAuth, metrics: Metrics) -> Self {
        let per_second = settings.reviews_per_second;
        Self {
            api: Api::all(client),
            unknown: Arc::new(Semaphore::new(settings.reviews_in_flight)),
            known: Arc::new(Semaphore::new(KNOWN_IN_FLIGHT)),
            rate: Mutex::new(Rate {
                per_second,
                burst: (per_second * 2.0).max(1.0),
                tokens: (per_second * 2.0).max(1.0),
                last: Instant::now(),
            }),
            settings,
            cache: Mutex::new(Cache::default()),
            metrics,
            logged: Mutex::new((None, 0)),
        }
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .token_reviews
            .get_or_create(&ReviewLabels { result })
            .inc();
    }

    /// The caller a token stands for: `UNAUTHENTICATED` for a token the API
    /// rejects or a ServiceAccount without a role, `UNAVAILABLE` when the API
    /// cannot be asked or unknown tokens are coming faster than reviews are
    /// allowed (then nothing is remembered and the client retries).
    ///
    /// A known caller never waits for its re-review: a token used in the
    /// last fifth of its time in the cache is reviewed again in the
    /// background while the cached answer serves.
    pub async fn caller(self: &Arc<Self>, token: &[u8]) -> Result<Caller, Status> {
        if token.len() > MAX_TOKEN {
            self.count("refused");
            return Err(Status::unauthenticated("the bearer token is too long"));
        }
        let key = digest(token);
        let ttl = self.settings.cache_ttl;
        let (cell, known) = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, caller)) = cache.accepted.get(&key)
                && at.elapsed() < ttl
            {
                let caller = caller.clone();
                if at.elapsed() >= ttl - ttl / 5 && !cache.pending.contains_key(&key) {
                    let cell = cache.pending.entry(key).or_default().clone();
                    let (reviewer, token) = (self.clone(), token.to_vec());
                    tokio::spawn(async move {
                        let outcome = cell.get_or_init(|| reviewer.review(&token, true)).await;
                        reviewer.record(key, &cell, outcome);
                    });
                }
                return Ok(caller);
            }
            if let Some((at, why)) = cache.refused.get(&key)
                && at.elapsed() < self.refusal_ttl()
            {
                return Err(Status::unauthenticated(why.clone()));
            }
            let known = cache.accepted.contains_key(&key);
            let cell = cache.pending.entry(key).or_default().clone();
            (cell, known)
        };
        let outcome = cell.get_or_init(|| self.review(token, known)).await.clone();
        self.record(key, &cell, &outcome);
        match outcome {
            Outcome::Accepted(caller) => Ok(caller),
            Outcome::Refused(why) => Err(Status::unauthenticated(why)),
            Outcome::Unavailable(why) => Err(Status::unavailable(why)),
        }
    }

    /// How long a refusal is remembered: never longer than an acceptance.
    fn refusal_ttl(&self) -> Duration {
        REFUSAL_TTL.min(self.settings.cache_ttl)
    }

    /// Remembers what the review in `cell` said of the token `key`, unless a
    /// later review has taken its place. A refusal ends an acceptance at
    /// once.
    fn record(&self, key: Digest, cell: &Arc<OnceCell<Outcome>>, outcome: &Outcome) {
        let ttl = self.settings.cache_ttl;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if !cache
            .pending
            .get(&key)
            .is_some_and(|c| Arc::ptr_eq(c, cell))
        {
            return;
        }
        cache.pending.remove(&key);
        match outcome {
            Outcome::Accepted(caller) => {
                bounded(&mut cache.accepted, ttl);
                cache.accepted.insert(key, (Instant::now(), caller.clone()));
            }
            Outcome::Refused(why) => {
                cache.accepted.remove(&key);
                bounded(&mut cache.refused, self.refusal_ttl());
                cache.refused.insert(key, (Instant::now(), why.clone()));
            }
            Outcome::Unavailable(_) => {}
        }
    }

    /// One review, within the limits: known callers have their own small
    /// share; unknown tokens take from the rate and the in-flight bound and
    /// are not reviewed at all past them.
    async fn review(&self, token: &[u8], known: bool) -> Outcome {
        let _permit = if known {
            match self.known.clone().acquire_owned().await {
                Ok(permit) => permit,
                Err(_) => return Outcome::Unavailable("token reviews stopped"),
            }
        } else {
            let allowed = self.rate.lock().unwrap_or_else(|e| e.into_inner()).take();
            match self.unknown.clone().try_acquire_owned() {
                Ok(permit) if allowed => permit,
                _ => {
                    self.count("limited");
                    return Outcome::Unavailable(
                        "too many unknown tokens to review now; retry shortly",
                    );
                }
            }
        };
        let Ok(token) = String::from_utf8(token.to_vec()) else {
            self.count("refused");
            return Outcome::Refused("the bearer token is not UTF-8".into());
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token),
                audiences: Some(vec![self.settings.audience.clone()]),
            },
            ..Default::default()
        };
        let answer = match self.api.create(&PostParams::default(), &review).await {
            Ok(answer) => answer,
            Err(e) => {
                self.count("unavailable");
                tracing::warn!(error = %e, "TokenReview failed; callers are asked to retry");
                return Outcome::Unavailable("cannot review the token with the Kubernetes API now");
            }
        };
        match self.judge(answer.status.unwrap_or_default()) {
            Ok(caller) => {
                self.count("accepted");
                Outcome::Accepted(caller)
            }
            Err(why) => {
                self.count("refused");
                self.log_refusal(&why);
                Outcome::Refused(why)
            }
        }
    }

    /// Logs a refusal, at most one line a second with a count of the rest.
    fn log_refusal(&self, why: &str) {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let due = logged.0.is_none_or(|at| at.elapsed() >= LOG_INTERVAL);
        if due {
            let more = std::mem::take(&mut logged.1);
            logged.0 = Some(Instant::now());
            tracing::info!(reason = %why, more_since_last_line = more, "ServiceAccount token refused");
        } else {
            logged.1 += 1;
        }
    }

    /// Decides on a TokenReview's status.
    fn judge(
        &self,
        status: k8s_openapi::api::authentication::v1::TokenReviewStatus,
    ) -> Result<Caller, String> {
        if status.authenticated != Some(true) {
            return Err(format!(
                "the Kubernetes API did not accept the token: {}",
                status.error.unwrap_or_else(|| "no reason given".into())
            ));
        }
        // The API answers with the audiences the token is valid for among
        // those asked; an answer without ours must not be trusted.
        if !status
            .audiences
            .unwrap_or_default()
            .contains(&self.settings.audience)
        {
            return Err(format!(
                "the token is not bound to the audience {:?}",
                self.settings.audience
            ));
        }
        let username = status.user.and_then(|u| u.username).unwrap_or_default();
        let role = self
            .settings
            .roles
            .get(&username)
            .copied()
            .ok_or_else(|| format!("{username} has no role at this gateway"))?;
        let name = username
            .strip_prefix("system:serviceaccount:")
            .map(|rest| rest.replacen(':', "/", 1))
            .unwrap_or(username);
        Ok(Caller { name, role })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_map_entries_are_checked_one_by_one() {
        let roles = ServiceAccountAuth::parse_roles(
            "kube-system/ccm-node=node, kube-system/ccm-svc=service",
        )
        .unwrap();
        assert_eq!(
            roles.get("system:serviceaccount:kube-system:ccm-node"),
            Some(&Role::Node)
        );
        let problems = ServiceAccountAuth::parse_roles(
            "kube-system/a=node,nonamespace=node,kube-system/b=wizard,Kube/c=node,kube-system/a=route",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("nonamespace"), "{problems:?}");
        assert!(problems[1].contains("wizard"), "{problems:?}");
        assert!(problems[2].contains("Kube/c"), "{problems:?}");
        assert!(problems[3].contains("twice"), "{problems:?}");
    }
}
