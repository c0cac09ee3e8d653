//! A Kubernetes API server for tests: it speaks the real wire protocol for
//! what the controllers and kubectl use (see `resources` for what is
//! served), keeps everything in memory, and runs in-process on loopback or
//! as the `kube-test-apiserver` binary. [`fixtures`] builds the Nodes and
//! Services that tests and the sandbox put in it. `pods/proxy` and
//! `services/proxy` reach HTTP servers on loopback through the Pods and
//! Endpoints a test creates (see the `proxy` module). API groups that
//! other servers serve are aggregated as kube-apiserver aggregates them
//! (see the `aggregation` module), through a front proxy whose
//! certificates the server makes (see [`front_proxy`]).
//!
//! It serves HTTPS only, as kube-apiserver has since its insecure port
//! went: a certificate of the cluster's own CA (see [`pki`]), bearer
//! tokens (a tokens file's, or ServiceAccount tokens it mints: see
//! `tokens`) and client certificates of that CA.

pub mod accounting;
mod aggregation;
mod events;
mod evictions;
pub mod fixtures;
pub mod front_proxy;
mod http;
mod journal;
mod openapi;
pub mod patch;
pub mod pki;
pub mod protobuf;
mod proxy;
pub mod rbac;
pub mod resources;
mod reviews;
pub mod schema;
pub mod selectors;
mod services;
pub mod store;
pub mod table;
mod tokens;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use self::front_proxy::FrontProxy;
pub use self::pki::ClusterPki;
pub use self::store::{ApiError, Store};

/// A user a bearer token stands for, as TokenReview reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenUser {
    pub username: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub groups: Vec<String>,
    /// The audiences the token is bound to; empty means the server's own.
    #[serde(default)]
    pub audiences: Vec<String>,
}

impl TokenUser {
    /// A ServiceAccount's token bound to `audiences` (the API server's
    /// own when empty), with the groups a real server gives it.
    pub fn service_account(namespace: &str, name: &str, audiences: &[&str]) -> Self {
        Self {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: format!("{namespace}-{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
            ],
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
        }
    }
}

/// One entry of a tokens file (`--tokens`).
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
pub struct TokenEntry {
    pub token: String,
    #[serde(flatten)]
    pub user: TokenUser,
}

/// Every document of a multi-document YAML (or JSON) text; lists
/// (`kind: List`) are opened up.
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).map_err(|e| e.to_string())?;
        match v {
            Value::Null => {}
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => {
                out.extend(o["items"].as_array().cloned().unwrap_or_default())
            }
            v => out.push(v),
        }
    }
    Ok(out)
}

/// The audience tokens get when none is named.
pub const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// The token of the `admin` user (group `system:masters`) in the
/// kubeconfigs the server writes.
pub const ADMIN_TOKEN: &str = "test-admin";

/// A kubeconfig for `server`, trusting the CA `ca_pem`, that presents
/// `token` as `user`.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, token: &str) -> String {
    let ca = data_encoding::BASE64.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: {user}\n    namespace: default\ncurrent-context: test\n"
    )
}

/// Settings of a test server.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen; port 0 picks one.
    pub listen: SocketAddr,
    /// How many changes are kept for watches to resume from.
    pub max_history: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Where the store keeps its state (see `journal`), so a server
    /// started again on it has every object it had; in memory only when
    /// unset. The front proxy's certificates are kept there too (see
    /// [`front_proxy`]).
    pub state_dir: Option<std::path::PathBuf>,
    /// How often each APIService's availability is checked (see the
    /// `aggregation` module).
    pub aggregation_check_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_history: 100_000,
            bookmark_interval: Duration::from_secs(5),
            state_dir: None,
            aggregation_check_interval: Duration::from_secs(2),
        }
    }
}

pub(crate) struct Shared {
    pub store: Store,
    pub address: String,
    pub bookmark_interval: Duration,
    /// Bumped to end every open watch.
    pub disconnect: tokio::sync::watch::Sender<u64>,
    tokens: Mutex<HashMap<String, TokenUser>>,
    token_reviews: std::sync::atomic::AtomicU64,
    /// Enforced once policy is loaded; until then every request passes.
    rbac: Mutex<Option<rbac::Rbac>>,
    /// What each caller asked and was sent.
    pub accounting: accounting::Accounting,
    /// The certificate requests to aggregated API servers are sent with.
    pub front_proxy: FrontProxy,
    /// The cluster CA and the key tokens are signed with.
    pki: ClusterPki,
    /// Which endpoint of an aggregated API server the next request tries
    /// first, so that requests are spread over them.
    pub next_backend: std::sync::atomic::AtomicUsize,
}

impl Shared {
    /// The name of the user a request authenticates as (see
    /// [`Self::token_user`]), RBAC enforced or not (`anonymous` without
    /// known credentials).
    pub fn user_name(&self, headers: &axum::http::HeaderMap, cert: Option<&TokenUser>) -> String {
        self.token_user(headers, cert)
            .map_or_else(|| "anonymous".to_owned(), |u| u.username)
    }

    /// Who sent a request: `Ok(None)` while RBAC is off (everyone may do
    /// anything), 401 for a missing or unknown token once it is on. Only
    /// tokens bound to the API server's own audience count here.
    pub fn authenticate(
        &self,
        headers: &axum::http::HeaderMap,
        cert: Option<&TokenUser>,
    ) -> Result<Option<rbac::User>, ApiError> {
        if self
            .rbac
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
        {
            return Ok(None);
        }
        let user = self
            .token_user(headers, cert)
            .ok_or_else(|| ApiError::new(401, "Unauthorized", "Unauthorized"))?;
        let mut groups = user.groups;
        groups.push("system:authenticated".into());
        Ok(Some(rbac::User {
            username: user.username,
            groups,
        }))
    }

    /// The user a request authenticates as, RBAC enforced or not: the
    /// one its connection's client certificate names (`cert`, verified by
    /// the cluster CA), else its bearer token's, if that is known and
    /// bound to the API server's own audience.
    pub fn token_user(
        &self,
        headers: &axum::http::HeaderMap,
        cert: Option<&TokenUser>,
    ) -> Option<TokenUser> {
        if let Some(user) = cert {
            return Some(user.clone());
        }
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))?;
        self.bearer(token)
            .filter(|u| u.audiences.is_empty() || u.audiences.iter().any(|a| a == DEFAULT_AUDIENCE))
    }

    /// Whom `token` stands for: a tokens file's entry, or a ServiceAccount
    /// token minted here that is still good (see `tokens`).
    fn bearer(&self, token: &str) -> Option<TokenUser> {
        let known = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned();
        known.or_else(|| tokens::verify(&self.store, &self.pki.signing_key, token))
    }

    /// Checks `a` for `user` against the loaded policy (403 if refused).
    /// Who a request acts as: the authenticated user, or whom it
    /// impersonates (`Impersonate-User`, `Impersonate-Group`: kubectl's
    /// `--as`, `--as-group`) when that user may impersonate them, as on a
    /// real server. Without RBAC any authenticated caller may impersonate
    /// anyone; an anonymous one, never.
    pub fn caller(
        &self,
        headers: &axum::http::HeaderMap,
        cert: Option<&TokenUser>,
    ) -> Result<Option<rbac::User>, ApiError> {
        let real = self.authenticate(headers, cert)?;
        let Some(name) = headers
            .get("impersonate-user")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
        else {
            return Ok(real);
        };
        if real.is_none() && self.token_user(headers, cert).is_none() {
            return Err(ApiError::new(
                401,
                "Unauthorized",
                "impersonation needs an authenticated caller",
            ));
        }
        let groups: Vec<String> = headers
            .get_all("impersonate-group")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect();
        let may = |resource: &str, target: &str| {
            self.authorize(
                real.as_ref(),
                &rbac::Attributes {
                    verb: "impersonate".into(),
                    group: String::new(),
                    resource: resource.into(),
                    namespace: None,
                    name: Some(target.into()),
                    path: None,
                },
            )
        };
        may("users", name)?;
        for group in &groups {
            may("groups", group)?;
        }
        let mut groups = groups;
        groups.push("system:authenticated".into());
        Ok(Some(rbac::User {
            username: name.to_owned(),
            groups,
        }))
    }

    pub fn authorize(
        &self,
        user: Option<&rbac::User>,
        a: &rbac::Attributes,
    ) -> Result<(), ApiError> {
        let mut guard = self.rbac.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(user), Some(policy)) = (user, guard.as_mut()) else {
            return Ok(());
        };
        if policy.authorize(user, a) {
            return Ok(());
        }
        tracing::warn!(user = %user.username, verb = %a.verb, resource = %a.resource, namespace = ?a.namespace, name = ?a.name, "forbidden");
        Err(ApiError::new(
            403,
            "Forbidden",
            rbac::forbidden_message(user, a),
        ))
    }

    /// What the authorizer in force says of `a` for `user`: whether it is
    /// allowed, and why. Nothing is recorded: a review asks, it does not
    /// act, so it is neither a refusal nor a use of a grant in the RBAC
    /// report. Without RBAC everyone may do anything.
    pub fn check(&self, user: &rbac::User, a: &rbac::Attributes) -> (bool, String) {
        match self.rbac.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(policy) => policy.check(user, a),
            None => (true, String::new()),
        }
    }

    /// What `user` may do in `namespace`, as a SelfSubjectRulesReview's
    /// status says it; everything while RBAC is off. Records nothing.
    pub fn rules(&self, user: Option<&rbac::User>, namespace: &str) -> Value {
        let guard = self.rbac.lock().unwrap_or_else(|e| e.into_inner());
        match (guard.as_ref(), user) {
            (Some(policy), Some(user)) => policy.rules_for(user, namespace),
            _ => {
                let (resource, non_resource) = rbac::everything();
                json!({"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": false})
            }
        }
    }

    /// Every Role, ClusterRole and binding the API holds.
    fn rbac_objects(&self) -> Vec<Value> {
        rbac::PLURALS
            .iter()
            .filter_map(|plural| resources::find(rbac::GROUP, "v1", plural))
            .flat_map(|r| self.store.list(r, None).0)
            .collect()
    }

    /// Applies the RBAC objects the API holds now, if RBAC is on.
    pub fn reload_rbac(&self) {
        let objects = self.rbac_objects();
        let mut guard = self.rbac.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(policy) = guard.as_mut() {
            *policy = policy.reloaded(&objects);
        }
    }

    /// The RBAC report (see [`rbac::Rbac::report`]), if RBAC is on.
    pub fn rbac_report(&self) -> Option<Value> {
        self.rbac
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(rbac::Rbac::report)
    }

    /// Answers a TokenReview: the tokens file's tokens and those minted
    /// here are known.
    pub fn token_review(&self, mut review: Value) -> Value {
        self.token_reviews
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = review["spec"]["token"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let wanted: Vec<String> = review["spec"]["audiences"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let status = match self.bearer(&token) {
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
            Some(user) => {
                let has: Vec<String> = if user.audiences.is_empty() {
                    vec![DEFAULT_AUDIENCE.to_owned()]
                } else {
                    user.audiences.clone()
                };
                let wanted = if wanted.is_empty() {
                    vec![DEFAULT_AUDIENCE.to_owned()]
                } else {
                    wanted
                };
                let common: Vec<&String> = has.iter().filter(|a| wanted.contains(a)).collect();
                if common.is_empty() {
                    json!({"authenticated": false, "error": "token audiences are invalid for this request"})
                } else {
                    json!({
                        "authenticated": true,
                        "user": {"username": user.username, "uid": user.uid, "groups": user.groups},
                        "audiences": common,
                    })
                }
            }
        };
        review["apiVersion"] = json!("authentication.k8s.io/v1");
        review["kind"] = json!("TokenReview");
        review["metadata"] = json!({"creationTimestamp": null});
        review["status"] = status;
        review
    }
}

/// A running test server.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    /// The APIServices' availability checks (see `aggregation`).
    availability: JoinHandle<()>,
}

/// The namespaces a new cluster has.
const NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

impl ApiServer {
    /// Starts a server on loopback with default settings.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(Config::default()).await
    }

    /// Starts a server.
    pub async fn start_with(config: Config) -> std::io::Result<Self> {
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let (store, loaded) = match &config.state_dir {
            Some(dir) => Store::open(config.max_history, dir)?,
            None => (Store::new(config.max_history), false),
        };
        let namespaces = resources::find("", "v1", "namespaces").expect("namespaces are served");
        for ns in NAMESPACES.iter().filter(|_| !loaded) {
            store
                .create(namespaces, "", json!({"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}))
                .expect("a fresh store takes the namespaces");
        }
        let front_proxy = FrontProxy::load_or_generate(config.state_dir.as_deref())?;
        let pki = ClusterPki::load_or_generate(config.state_dir.as_deref())?;
        let tls = ccm_runtime::tls::ServerTls::fixed(pki.server_config(addr)?);
        let listener = ccm_runtime::https::TlsListener::new(listener, tls)?;
        publish_front_proxy(&store, &front_proxy);
        aggregation::register_local(&store);
        let shared = Arc::new(Shared {
            store,
            address: addr.to_string(),
            bookmark_interval: config.bookmark_interval,
            disconnect: tokio::sync::watch::channel(0).0,
            tokens: Mutex::new(HashMap::from([(
                ADMIN_TOKEN.to_owned(),
                TokenUser {
                    username: "admin".into(),
                    uid: "admin".into(),
                    groups: vec!["system:masters".into()],
                    audiences: Vec::new(),
                },
            )])),
            token_reviews: Default::default(),
            rbac: Mutex::new(None),
            accounting: Default::default(),
            front_proxy,
            pki,
            next_backend: Default::default(),
        });
        let availability =
            aggregation::availability::spawn(shared.clone(), config.aggregation_check_interval);
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let app = app.into_make_service_with_connect_info::<ccm_runtime::https::Peer>();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "test API server stopped");
            }
        });
        Ok(Self {
            addr,
            shared,
            task,
            availability,
        })
    }

    /// The front proxy's CA and client certificate: what an aggregated API
    /// server trusts (the CA, published in the ConfigMap
    /// `kube-system/extension-apiserver-authentication`), and what a test
    /// presents to forge a request from this server.
    pub fn front_proxy(&self) -> &FrontProxy {
        &self.shared.front_proxy
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://addr`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The cluster CA: what clients verify the server with, and what signs
    /// the client certificates it accepts.
    pub fn pki(&self) -> &ClusterPki {
        &self.shared.pki
    }

    /// The store, for tests that need to look behind the API.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Ends every open watch, as an API server restart or a load balancer
    /// in front of it would; clients must watch again.
    pub fn disconnect_watches(&self) {
        self.shared.disconnect.send_modify(|n| *n += 1);
    }

    /// Makes TokenReview refuse `token` from now on, as when its pod or
    /// ServiceAccount is deleted.
    pub fn revoke_token(&self, token: &str) {
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token);
    }

    /// How many TokenReviews were answered.
    pub fn token_reviews(&self) -> u64 {
        self.shared
            .token_reviews
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes TokenReview accept `token` as `user`.
    pub fn register_token(&self, token: impl Into<String>, user: TokenUser) {
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.into(), user);
    }

    /// Turns RBAC on with the Roles, ClusterRoles and bindings among
    /// `objects`, written into the API as `kubectl apply` would (each
    /// created, or replacing one of its name), beside any already there:
    /// from now on every request needs a known token, and only
    /// `system:masters` (the admin token) or a granted rule gets through.
    /// Rules written later apply from the next request on.
    pub fn enforce_rbac(&self, objects: &[Value]) {
        let store = &self.shared.store;
        for o in objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            let Some(resource) = resources::RESOURCES
                .iter()
                .find(|r| r.group == rbac::GROUP && r.kind == kind)
            else {
                continue;
            };
            let namespace = if resource.namespaced {
                o["metadata"]["namespace"].as_str().unwrap_or("default")
            } else {
                ""
            };
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let mut object = o.clone();
            object["apiVersion"] = json!(format!("{}/v1", rbac::GROUP));
            let written = match store.get(resource, namespace, name) {
                Ok(_) => store
                    .update(resource, namespace, name, false, |old| {
                        let mut new = object.clone();
                        new["metadata"]["resourceVersion"] =
                            old["metadata"]["resourceVersion"].clone();
                        Ok(new)
                    })
                    .map(drop),
                Err(_) => store.create(resource, namespace, object).map(drop),
            };
            if let Err(e) = written {
                tracing::warn!(kind, name, error = %e.message, "RBAC object not loaded");
            }
        }
        let policy = rbac::Rbac::from_objects(&self.shared.rbac_objects());
        *self.shared.rbac.lock().unwrap_or_else(|e| e.into_inner()) = Some(policy);
    }

    /// What RBAC refused and which grants went unused; `None` while off.
    pub fn rbac_report(&self) -> Option<Value> {
        self.shared.rbac_report()
    }

    /// A kubeconfig for this server with the admin token, as YAML.
    pub fn kubeconfig(&self) -> String {
        kubeconfig(&self.url(), &self.shared.pki.ca_pem, "admin", ADMIN_TOKEN)
    }

    /// Writes [`Self::kubeconfig`] to `path`, readable by its owner only
    /// (it holds the admin token).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        // Whole or not at all: a server started again rewrites it while
        // clients may be reading it.
        ccm_runtime::files::write_private(path, self.kubeconfig().as_bytes())
    }

    /// A kube client for this server, as the admin.
    pub async fn client(&self) -> kube::Result<kube::Client> {
        kube::Client::try_from(self.client_config(Some(ADMIN_TOKEN)))
    }

    /// A kube client configuration for this server that trusts its CA and
    /// presents `token`, if one is given.
    pub fn client_config(&self, token: Option<&str>) -> kube::Config {
        client_config(&self.url(), &self.shared.pki, token)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
        self.availability.abort();
    }
}

/// A kube client configuration for the server at `url` with the CA of
/// `pki`, presenting `token` if one is given.
pub fn client_config(url: &str, pki: &ClusterPki, token: Option<&str>) -> kube::Config {
    let mut config = kube::Config::new(url.parse().expect("valid URL"));
    config.root_cert = Some(vec![pki.ca_der()]);
    config.auth_info.token = token.map(|t| t.to_owned().into());
    config
}

/// Publishes the ConfigMap aggregated API servers learn the front proxy
/// from (see [`front_proxy`]), created or brought up to date: a store
/// kept from an earlier run may hold one naming other certificates.
fn publish_front_proxy(store: &Store, front_proxy: &FrontProxy) {
    let config_maps = resources::find("", "v1", "configmaps").expect("ConfigMaps are served");
    let (namespace, name) = (front_proxy::CONFIG_MAP_NAMESPACE, front_proxy::CONFIG_MAP);
    let data = front_proxy.config_map_data();
    let published = match store.get(config_maps, namespace, name) {
        Ok(_) => store.update(config_maps, namespace, name, false, |old| {
            let mut new = old.clone();
            new["data"] = data;
            Ok(new)
        }),
        Err(_) => store.create(config_maps, namespace, front_proxy.config_map()),
    };
    if let Err(e) = published {
        tracing::warn!(error = %e.message, "the front proxy's ConfigMap is not published");
    }
}
