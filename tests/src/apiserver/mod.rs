//! A Kubernetes API server for tests: it speaks the real wire protocol for
//! what the controllers and kubectl use (see `resources` for what is
//! served), keeps everything in memory, and runs in-process on loopback or
//! as the `kube-test-apiserver` binary.

mod events;
mod http;
pub mod patch;
pub mod resources;
pub mod schema;
pub mod selectors;
pub mod store;
pub mod table;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use self::store::{ApiError, Store};

/// A user a bearer token stands for, as TokenReview reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenUser {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// The audiences the token is bound to; empty means the server's own.
    pub audiences: Vec<String>,
}

/// The audience tokens get when none is named.
pub const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Settings of a test server.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen; port 0 picks one.
    pub listen: SocketAddr,
    /// How many changes are kept for watches to resume from.
    pub max_history: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_history: 100_000,
            bookmark_interval: Duration::from_secs(5),
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
}

impl Shared {
    /// Answers a TokenReview from the registered tokens.
    pub fn token_review(&self, mut review: Value) -> Value {
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
        let user = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&token)
            .cloned();
        let status = match user {
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
        let store = Store::new(config.max_history);
        let namespaces = resources::find("", "v1", "namespaces").expect("namespaces are served");
        for ns in NAMESPACES {
            store
                .create(namespaces, "", json!({"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}))
                .expect("a fresh store takes the namespaces");
        }
        let shared = Arc::new(Shared {
            store,
            address: addr.to_string(),
            bookmark_interval: config.bookmark_interval,
            disconnect: tokio::sync::watch::channel(0).0,
            tokens: Mutex::new(HashMap::new()),
        });
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "test API server stopped");
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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

    /// Makes TokenReview accept `token` as `user`.
    pub fn register_token(&self, token: impl Into<String>, user: TokenUser) {
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.into(), user);
    }

    /// A kubeconfig for this server, as YAML.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\nusers:\n- name: admin\n  user:\n    token: test-admin\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n    namespace: default\ncurrent-context: test\n",
            self.url()
        )
    }

    /// Writes [`Self::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// A kube client for this server.
    pub async fn client(&self) -> kube::Result<kube::Client> {
        let config = kube::Config::new(self.url().parse().expect("valid URL"));
        kube::Client::try_from(config)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
