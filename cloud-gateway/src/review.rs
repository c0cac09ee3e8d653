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
use tokio::sync::OnceCell;
use tonic::Status;

use ccm_runtime::names::{is_dns_label, is_dns_subdomain};

use crate::auth::{Caller, Role};

/// How long a refusal is remembered, so a client with a bad token cannot
/// turn every call into an API request.
const REFUSAL_TTL: Duration = Duration::from_secs(5);
/// Past this many remembered tokens, expired ones are dropped.
const MAX_CACHED: usize = 4096;

/// ServiceAccount authentication settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountAuth {
    /// `system:serviceaccount:<namespace>:<name>` → role.
    pub roles: HashMap<String, Role>,
    /// The audience tokens must be bound to.
    pub audience: String,
    /// How long an accepted token is trusted before it is reviewed again.
    pub cache_ttl: Duration,
    /// The kubeconfig to reach the API with; in-cluster config without it.
    pub kubeconfig: Option<std::path::PathBuf>,
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

/// One review's outcome, with when it was made.
#[derive(Clone, Debug)]
struct Reviewed {
    at: Instant,
    caller: Result<Caller, String>,
}

/// Reviews tokens against the Kubernetes API.
pub struct TokenReviewer {
    api: Api<TokenReview>,
    settings: ServiceAccountAuth,
    cache: Mutex<HashMap<Vec<u8>, Arc<OnceCell<Reviewed>>>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// Reviews tokens through `client`.
    pub fn new(client: kube::Client, settings: ServiceAccountAuth) -> Self {
        Self {
            api: Api::all(client),
            settings,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The caller a token stands for: `UNAUTHENTICATED` for a token the API
    /// rejects or a ServiceAccount without a role, `UNAVAILABLE` when the API
    /// cannot be asked (then nothing is remembered and the client retries).
    pub async fn caller(&self, token: &[u8]) -> Result<Caller, Status> {
        let cell = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let fresh = cache
                .get(token)
                .filter(|cell| cell.get().is_none_or(|r| self.fresh(r)))
                .cloned();
            match fresh {
                Some(cell) => cell,
                None => {
                    if cache.len() >= MAX_CACHED {
                        cache.retain(|_, cell| cell.get().is_some_and(|r| self.fresh(r)));
                    }
                    if cache.len() >= MAX_CACHED {
                        cache.clear();
                    }
                    let cell = Arc::new(OnceCell::new());
                    cache.insert(token.to_vec(), cell.clone());
                    cell
                }
            }
        };
        let reviewed = cell.get_or_try_init(|| self.review(token)).await?;
        reviewed.caller.clone().map_err(Status::unauthenticated)
    }

    fn fresh(&self, r: &Reviewed) -> bool {
        let ttl = if r.caller.is_ok() {
            self.settings.cache_ttl
        } else {
            REFUSAL_TTL.min(self.settings.cache_ttl)
        };
        r.at.elapsed() < ttl
    }

    async fn review(&self, token: &[u8]) -> Result<Reviewed, Status> {
        let token = String::from_utf8(token.to_vec())
            .map_err(|_| Status::unauthenticated("the bearer token is not UTF-8"))?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token),
                audiences: Some(vec![self.settings.audience.clone()]),
            },
            ..Default::default()
        };
        let answer = self
            .api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed; callers are asked to retry");
                Status::unavailable("cannot review the token with the Kubernetes API now")
            })?;
        let caller = self.judge(answer.status.unwrap_or_default());
        if let Err(why) = &caller {
            tracing::info!(reason = %why, "ServiceAccount token refused");
        }
        Ok(Reviewed {
            at: Instant::now(),
            caller,
        })
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
