//! Who may read an admin endpoint, as upstream's controller managers
//! decide it: the always-allowed paths (`/healthz`, `/readyz`, `/livez` by
//! default, as `--authorization-always-allow-paths`) answer anyone; every
//! other path needs a bearer token that passes a check: for a process with
//! a Kubernetes API, a TokenReview of the token and a SubjectAccessReview
//! of the path (a non-resource URL, verb `get`), each answer kept for
//! [`CACHE_FOR`]. No token, or one that is not valid: 401; a valid one
//! without the grant: 403.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;

/// How long a review's answer is kept, allowed or not (upstream's
/// delegated authentication and authorisation keep theirs 10 s).
pub const CACHE_FOR: Duration = Duration::from_secs(10);

/// Answers kept at most; the oldest half goes when full.
const CACHE_ENTRIES: usize = 4096;

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

/// The user a TokenReview found.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reviewed {
    username: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// Answers by question, each with when it was given.
type Cache<K, V> = Mutex<HashMap<K, (Instant, V)>>;

/// TokenReview and SubjectAccessReview through the API server, answers
/// kept for [`CACHE_FOR`].
pub struct Reviews {
    client: kube::Client,
    /// By the token's SHA-256: who it is, or why it is no one.
    tokens: Cache<[u8; 32], Result<Reviewed, String>>,
    /// By user and path: allowed or why not.
    grants: Cache<(String, String), Result<(), String>>,
}

impl Reviews {
    /// Reviews with `client` (the process's own ServiceAccount, which
    /// `system:auth-delegator` lets create both reviews).
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            tokens: Mutex::default(),
            grants: Mutex::default(),
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

    async fn decide(&self, token: &str, path: &str) -> Decision {
        let user = match self.who(token).await {
            Ok(Ok(user)) => user,
            Ok(Err(why)) => return Decision::Unauthenticated(why),
            Err(why) => return Decision::Unavailable(why),
        };
        match self.may_get(&user, path).await {
            Ok(Ok(())) => Decision::Allow,
            Ok(Err(why)) => Decision::Forbidden(why),
            Err(why) => Decision::Unavailable(why),
        }
    }

    /// Who `token` is (`Ok(Err)`: no one, and why); `Err` when the API
    /// server could not say.
    async fn who(&self, token: &str) -> Result<Result<Reviewed, String>, String> {
        let digest: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        if let Some(answer) = cached(&self.tokens, &digest) {
            return Ok(answer);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answered = kube::Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("TokenReview: {e}"))?;
        let status = answered.status.unwrap_or_default();
        let answer = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Ok(Reviewed {
                username: user.username.unwrap_or_default(),
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }),
            _ => Err(status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "the token is not valid".into())),
        };
        keep(&self.tokens, digest, answer.clone());
        Ok(answer)
    }

    /// Whether `user` may `get` `path`.
    async fn may_get(&self, user: &Reviewed, path: &str) -> Result<Result<(), String>, String> {
        let key = (user.username.clone(), path.to_owned());
        if let Some(answer) = cached(&self.grants, &key) {
            return Ok(answer);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".into()),
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
        keep(&self.grants, key, answer.clone());
        Ok(answer)
    }
}

fn cached<K: std::hash::Hash + Eq, V: Clone>(cache: &Cache<K, V>, key: &K) -> Option<V> {
    let cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .get(key)
        .filter(|(at, _)| at.elapsed() < CACHE_FOR)
        .map(|(_, v)| v.clone())
}

fn keep<K: std::hash::Hash + Eq, V>(cache: &Cache<K, V>, key: K, value: V) {
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= CACHE_ENTRIES {
        cache.retain(|_, (at, _)| at.elapsed() < CACHE_FOR);
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
    }
    cache.insert(key, (Instant::now(), value));
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
}
