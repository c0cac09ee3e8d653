//! Who may call what. Every RPC needs a client certificate whose identity
//! is mapped to a role, or a bearer token; each maps to an identity with a
//! role, and each role may call only its services. Health
//! checks and server reflection are open, so probes and tools such as
//! grpcurl work without a token. Tokens are never logged.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};

use ccm_proto::reason;
use serde::Deserialize;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tower::{Layer, Service};

use super::client_certs::{CertIdentity, ClientCertRoles};
use super::service_accounts::TokenReviewer;
use super::tls::ConnInfo;
use crate::identity::{Caller, Role, allowed_roles};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    token: String,
    role: String,
    #[serde(default)]
    name: Option<String>,
}

/// The known tokens.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<(Vec<u8>, Caller)>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the tokens themselves.
        f.debug_struct("Tokens")
            .field(
                "callers",
                &self.entries.iter().map(|(_, c)| c).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The shortest token accepted; shorter ones are too easy to guess.
const MIN_TOKEN_LEN: usize = 16;

impl Tokens {
    /// Reads a tokens file (YAML: `tokens: [{token, role, name}]`),
    /// reporting every problem in it at once.
    pub fn from_file(path: &Path) -> Result<Self, Vec<String>> {
        ccm_runtime::config_checks::check_file(&path.display().to_string())
            .map_err(|problem| vec![format!("tokens file {problem}")])?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| vec![format!("tokens file {}: {e}", path.display())])?;
        Self::parse(&text).map_err(|problems| {
            problems
                .into_iter()
                .map(|p| format!("tokens file {}: {p}", path.display()))
                .collect()
        })
    }

    fn parse(text: &str) -> Result<Self, Vec<String>> {
        let file: TokensFile = serde_norway::from_str(text).map_err(|e| vec![e.to_string()])?;
        let mut problems = Vec::new();
        let mut entries: Vec<(Vec<u8>, Caller)> = Vec::new();
        for (i, entry) in file.tokens.into_iter().enumerate() {
            let role = match entry.role.parse::<Role>() {
                Ok(role) => Some(role),
                Err(e) => {
                    problems.push(format!("tokens[{i}].role: {e}"));
                    None
                }
            };
            if entry.token.len() < MIN_TOKEN_LEN {
                problems.push(format!(
                    "tokens[{i}].token: shorter than {MIN_TOKEN_LEN} characters"
                ));
            } else if entry.token.chars().any(|c| !c.is_ascii_graphic()) {
                problems.push(format!(
                    "tokens[{i}].token: only visible ASCII characters are allowed"
                ));
            } else if entries.iter().any(|(t, _)| t == entry.token.as_bytes()) {
                problems.push(format!("tokens[{i}].token: the same token appears twice"));
            }
            if let Some(role) = role {
                let name = entry
                    .name
                    .unwrap_or_else(|| format!("{}-{i}", role.as_str()));
                entries.push((entry.token.into_bytes(), Caller { name, role }));
            }
        }
        if entries.is_empty() && problems.is_empty() {
            problems.push("no tokens: every call would be refused".into());
        }
        if problems.is_empty() {
            Ok(Self { entries })
        } else {
            Err(problems)
        }
    }

    /// Generates one token per role into `dir` (reusing tokens already
    /// there, so restarts keep them) and returns them with the file paths.
    pub fn generate(dir: &Path) -> std::io::Result<(Self, Vec<PathBuf>)> {
        std::fs::create_dir_all(dir)?;
        let mut tokens = Self::default();
        let mut paths = Vec::new();
        for role in Role::ALL {
            let path = dir.join(format!("{}.token", role.as_str()));
            let token = match std::fs::read_to_string(&path) {
                Ok(t) if t.trim().len() >= MIN_TOKEN_LEN => {
                    keep_private(&path);
                    t.trim().to_owned()
                }
                _ => {
                    let token = random_token()?;
                    write_private(&path, &token)?;
                    token
                }
            };
            tokens.entries.push((
                token.into_bytes(),
                Caller {
                    name: format!("generated-{}", role.as_str()),
                    role,
                },
            ));
            paths.push(path);
        }
        Ok((tokens, paths))
    }

    /// The caller a presented token belongs to.
    pub fn caller(&self, token: &[u8]) -> Option<&Caller> {
        // Compare against every entry in constant time per entry, so the
        // time taken says nothing about how much of a token matched.
        let mut found = None;
        for (known, caller) in &self.entries {
            if constant_time_eq(known, token) {
                found = Some(caller);
            }
        }
        found
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Makes a kept token file readable by its owner only, if an older
/// release left it readable by others; one that cannot be changed (a
/// read-only disk) is named in the log and still used.
fn keep_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let loose = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0);
    if loose && let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
    {
        tracing::warn!(file = %path.display(), error = %e, "a token file others may read could not be made private");
    }
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    ccm_runtime::files::write_private(path, format!("{contents}\n").as_bytes())
}

fn refuse(code: Code, reason: &str, message: String) -> Status {
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, reason::DOMAIN, []),
    )
}

/// Who is asking: a client certificate mapped to a role first, then
/// static tokens, then (when configured) the Kubernetes API for
/// ServiceAccount tokens.
#[derive(Debug)]
pub struct Authenticator {
    tokens: Tokens,
    reviewer: Option<Arc<TokenReviewer>>,
    cert_roles: ClientCertRoles,
}

impl Authenticator {
    /// Accepts `tokens`, and ServiceAccount tokens when `reviewer` is given.
    pub fn new(tokens: Tokens, reviewer: Option<TokenReviewer>) -> Self {
        Self {
            tokens,
            reviewer: reviewer.map(Arc::new),
            cert_roles: ClientCertRoles::default(),
        }
    }

    /// Also accepts client certificates whose identity `roles` maps.
    pub fn with_client_certs(mut self, roles: ClientCertRoles) -> Self {
        self.cert_roles = roles;
        self
    }

    /// Checks the caller of a request to `path` against [`allowed_roles`];
    /// `None` for the open services.
    #[tracing::instrument(target = "ccm_calls", name = "auth", skip_all, fields(caller, role))]
    pub async fn authorize(
        &self,
        path: &str,
        header: Option<&[u8]>,
        client_cert: Option<&CertIdentity>,
    ) -> Result<Option<Caller>, Status> {
        let Some(roles) = allowed_roles(path) else {
            return Ok(None);
        };
        // A certificate naming more than one identity is refused outright,
        // a token beside it or not: it is no one's.
        let mapped = match client_cert.map(|cert| self.cert_roles.caller(cert)) {
            Some(Err(why)) => return Err(Status::permission_denied(why)),
            Some(Ok(caller)) => caller,
            None => None,
        };
        let caller = match (mapped, client_cert, header) {
            (Some(caller), _, _) => caller,
            // A certificate no role is mapped to, and no token either.
            (None, Some(cert), None) => {
                return Err(Status::unauthenticated(format!(
                    "the client certificate ({}) is mapped to no role, and no bearer token was sent",
                    cert.describe()
                )));
            }
            (None, _, header) => self.token_caller(header).await?,
        };
        let span = tracing::Span::current();
        span.record("caller", caller.name.as_str());
        span.record("role", caller.role.as_str());
        if !roles.contains(&caller.role) {
            return Err(refuse(
                Code::PermissionDenied,
                reason::ROLE_NOT_ALLOWED,
                format!(
                    "{} (role {}) may not call {path}; allowed: {}",
                    caller.name,
                    caller.role.as_str(),
                    roles
                        .iter()
                        .map(|r| r.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(Some(caller))
    }

    async fn token_caller(&self, header: Option<&[u8]>) -> Result<Caller, Status> {
        let token = header
            .and_then(|h| {
                h.strip_prefix(b"Bearer ")
                    .or_else(|| h.strip_prefix(b"bearer "))
            })
            .ok_or_else(|| {
                Status::unauthenticated("missing bearer token in the authorization header")
            })?;
        match (self.tokens.caller(token), &self.reviewer) {
            (Some(caller), _) => Ok(caller.clone()),
            (None, Some(reviewer)) => reviewer.caller(token).await,
            (None, None) => Err(Status::unauthenticated("unknown bearer token")),
        }
    }
}

/// The tower layer that runs [`Authenticator::authorize`] in front of every
/// service.
#[derive(Clone)]
pub struct AuthLayer {
    auth: Arc<Authenticator>,
}

impl AuthLayer {
    /// Checks calls with `auth`.
    pub fn new(auth: Authenticator) -> Self {
        Self {
            auth: Arc::new(auth),
        }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            inner,
            auth: self.auth.clone(),
        }
    }
}

/// The service [`AuthLayer`] makes.
#[derive(Clone)]
pub struct Auth<S> {
    inner: S,
    auth: Arc<Authenticator>,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Auth<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        // The service that was polled ready serves this request; a clone
        // takes its place for the next one (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let auth = self.auth.clone();
        Box::pin(async move {
            let header = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|h| h.as_bytes().to_vec());
            let client_cert = req
                .extensions()
                .get::<ConnInfo>()
                .and_then(|c| c.client_cert.clone());
            match auth
                .authorize(req.uri().path(), header.as_deref(), client_cert.as_deref())
                .await
            {
                Ok(caller) => {
                    if let Some(caller) = caller {
                        req.extensions_mut().insert(caller);
                    }
                    inner.call(req).await
                }
                Err(status) => {
                    tracing::debug!(path = req.uri().path(), code = ?status.code(), "call refused");
                    Ok(status.into_http())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "tokens:\n  - {token: nnnnnnnnnnnnnnnnnnnn, role: node, name: node-controller}\n  - {token: vvvvvvvvvvvvvvvvvvvv, role: volume, name: volume-controller}\n  - {token: aaaaaaaaaaaaaaaaaaaa, role: admin}\n";

    #[tokio::test]
    async fn roles_reach_only_their_services() {
        let auth = Authenticator::new(Tokens::parse(FILE).unwrap(), None);
        let node = Some(&b"Bearer nnnnnnnnnnnnnnnnnnnn"[..]);
        let admin = Some(&b"Bearer aaaaaaaaaaaaaaaaaaaa"[..]);
        let volume = Some(&b"Bearer vvvvvvvvvvvvvvvvvvvv"[..]);
        let cases = [
            ("/cloudgateway.v1.Volumes/AttachVolume", volume, Ok(true)),
            ("/cloudgateway.v1.Volumes/CreateVolume", admin, Ok(true)),
            (
                "/cloudgateway.v1.Volumes/CreateVolume",
                node,
                Err(Code::PermissionDenied),
            ),
            (
                "/cloudgateway.v1.Instances/GetInstances",
                volume,
                Err(Code::PermissionDenied),
            ),
            ("/cloudgateway.v1.Instances/GetInstances", node, Ok(true)),
            ("/cloudgateway.v1.Provider/GetProviderInfo", node, Ok(true)),
            (
                "/cloudgateway.v1.LoadBalancers/EnsureLoadBalancer",
                node,
                Err(Code::PermissionDenied),
            ),
            (
                "/cloudgateway.v1.SimAdmin/SetFaults",
                node,
                Err(Code::PermissionDenied),
            ),
            ("/cloudgateway.v1.SimAdmin/SetFaults", admin, Ok(true)),
            (
                "/cloudgateway.v1.Routes/ListRoutes",
                None,
                Err(Code::Unauthenticated),
            ),
            (
                "/cloudgateway.v1.Routes/ListRoutes",
                Some(&b"Bearer wrong-token-wrong"[..]),
                Err(Code::Unauthenticated),
            ),
            ("/grpc.health.v1.Health/Check", None, Ok(false)),
            (
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                None,
                Ok(false),
            ),
        ];
        for (path, header, want) in cases {
            let got = auth
                .authorize(path, header, None)
                .await
                .map(|c| c.is_some())
                .map_err(|s| s.code());
            assert_eq!(got, want, "{path}");
        }
    }

    #[test]
    fn every_problem_in_a_tokens_file_is_reported() {
        let problems = Tokens::parse(
            "tokens:\n  - {token: short, role: node}\n  - {token: bbbbbbbbbbbbbbbbbbbb, role: wizard}\n",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("shorter"), "{problems:?}");
        assert!(problems[1].contains("wizard"), "{problems:?}");
    }

    #[test]
    fn tokens_never_show_in_debug_output() {
        let tokens = Tokens::parse(FILE).unwrap();
        let text = format!("{tokens:?}");
        assert!(!text.contains("nnnnnnnnnnnnnnnnnnnn"), "{text}");
        assert!(text.contains("node-controller"), "{text}");
    }

    #[test]
    fn generated_tokens_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (first, paths) = Tokens::generate(dir.path()).unwrap();
        let (second, _) = Tokens::generate(dir.path()).unwrap();
        assert_eq!(paths.len(), Role::ALL.len(), "one per role");
        let token = std::fs::read_to_string(&paths[0]).unwrap();
        let token = token.trim().as_bytes();
        assert_eq!(first.caller(token), second.caller(token));
        assert_eq!(first.caller(token).map(|c| c.role), Some(Role::Admin));
    }

    #[test]
    fn generated_tokens_are_readable_by_their_owner_only_even_if_left_readable() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // One an older release left readable by others, and one too short
        // to keep, which is written anew.
        let kept = dir.path().join("admin.token");
        std::fs::write(&kept, "a".repeat(40)).unwrap();
        let short = dir.path().join("node.token");
        std::fs::write(&short, "short").unwrap();
        for file in [&kept, &short] {
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let (_, paths) = Tokens::generate(dir.path()).unwrap();
        for path in &paths {
            assert_eq!(mode(path), 0o600, "{}", path.display());
        }
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "a".repeat(40));
        assert_ne!(std::fs::read_to_string(&short).unwrap().trim(), "short");
    }
}
