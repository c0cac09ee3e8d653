//! Where the diagnostics API's answers come from: each controller's leader
//! (named by its Lease, reached at its Pod's IP and `admin` port) and the
//! gateway (its Service's endpoints, `admin` port), asked for their
//! `/debug/status` and `/debug/object`. A question for this very process
//! is answered from its own [`Inspection`], with no request.
//!
//! Every failure is an answer too (`Err` with why), so one dead leader
//! leaves the rest of a diagnosis readable.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Pod};
use kube::Api;
use serde::Serialize;
use serde_json::Value;

use crate::inspect::Inspection;

/// What a process answered, or why there is no answer.
pub type Answer = Result<Value, String>;

/// How long a peer has to answer, connection included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The most a peer's answer may hold.
const MAX_ANSWER: usize = 4 << 20;

/// The admin port's name in the chart's Pods and the gateway's Service.
const ADMIN_PORT: &str = "admin";

/// What a process is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// `/debug/status`.
    Status,
    /// `/debug/object?key=...`.
    Object(String),
}

impl Ask {
    fn path(&self) -> String {
        match self {
            Ask::Status => "/debug/status".into(),
            Ask::Object(key) => format!(
                "/debug/object?{}",
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("key", key)
                    .finish()
            ),
        }
    }
}

/// Who holds a controller's Lease, as the diagnosis reports it.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderRef {
    pub controller: String,
    /// `namespace/name`.
    pub lease: String,
    /// The Lease's holder identity; `None` when it is free or missing.
    pub holder: Option<String>,
    /// The holder's Pod (the identity up to its last `_`).
    pub pod: Option<String>,
    /// Why the Lease could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How this process proves itself to a peer, and knows the peer.
#[derive(Clone, Debug)]
pub struct Trust {
    /// The CA bundle that signed the leaders' admin certificates; `None`:
    /// no leader is asked.
    pub ca: Option<std::path::PathBuf>,
    /// The CA bundle this process verifies the gateway's gRPC certificate
    /// by, which serves its admin port too; `None`: `ca`.
    pub gateway_ca: Option<std::path::PathBuf>,
    /// The file of the token shown to the peers, bound to
    /// [`crate::admin::access::PEER_AUDIENCE`]: one the API server refuses,
    /// so a peer (or whoever answers in its place) gains no API access by
    /// it. Read at each use, as the kubelet rotates it.
    pub token: Option<std::path::PathBuf>,
}

/// A TLS client configuration that verifies servers by a CA bundle file
/// (read again when it changes), or why there is none.
type ClientTls = Result<Arc<rustls::ClientConfig>, String>;

/// The configuration to reach admin ports signed by the CA in `ca` with.
fn client_tls(ca: &Path) -> ClientTls {
    let verifier = ccm_proto::tls::CaFile::new(ca.to_owned())?;
    let mut config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The release's processes, as this one reaches them.
#[derive(Clone)]
pub struct Peers {
    client: kube::Client,
    trust: Trust,
    /// How the leaders' admin ports are verified (`trust.ca`); `None`:
    /// they are not asked.
    leader_tls: Option<ClientTls>,
    /// How the gateway's admin port is verified (`trust.gateway_ca`, else
    /// `trust.ca`).
    gateway_tls: Option<ClientTls>,
    /// The release's namespace: Leases, Pods, the gateway's Endpoints.
    pub namespace: String,
    /// The base of the release's object names (`<release>-<component>`).
    pub release: String,
    /// This process's Lease identity, and what it tells of its work.
    own_identity: String,
    own: Inspection,
}

impl Peers {
    pub fn new(
        client: kube::Client,
        namespace: String,
        release: String,
        trust: Trust,
        own_identity: String,
        own: Inspection,
    ) -> Self {
        let leader_tls = trust.ca.as_deref().map(client_tls);
        let gateway_tls = match &trust.gateway_ca {
            Some(ca) => Some(client_tls(ca)),
            None => leader_tls.clone(),
        };
        Self {
            client,
            trust,
            leader_tls,
            gateway_tls,
            namespace,
            release,
            own_identity,
            own,
        }
    }

    /// This process's Lease identity.
    pub fn own_identity(&self) -> &str {
        &self.own_identity
    }

    /// Who holds `controller`'s Lease.
    pub async fn leader(&self, controller: &str) -> LeaderRef {
        let name = format!("{}-{controller}", self.release);
        let mut leader = LeaderRef {
            controller: controller.into(),
            lease: format!("{}/{name}", self.namespace),
            ..LeaderRef::default()
        };
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        match leases.get_opt(&name).await {
            Ok(lease) => {
                leader.holder = lease
                    .and_then(|l| l.spec?.holder_identity)
                    .filter(|h| !h.is_empty());
                leader.pod = leader
                    .holder
                    .as_deref()
                    .map(|h| h.rsplit_once('_').map_or(h, |(pod, _)| pod).to_owned());
            }
            Err(e) => leader.error = Some(format!("read Lease {}: {e}", leader.lease)),
        }
        leader
    }

    /// `ask`, put to `leader`'s holder.
    pub async fn from_leader(&self, leader: &LeaderRef, ask: &Ask) -> Answer {
        if let Some(error) = &leader.error {
            return Err(error.clone());
        }
        let (Some(holder), Some(pod)) = (&leader.holder, &leader.pod) else {
            return Err("no replica holds the Lease".into());
        };
        if *holder == self.own_identity {
            return self.ask_own(ask);
        }
        let addr = self.pod_admin(pod).await?;
        let name = format!("{}-diagnostics.{}.svc", self.release, self.namespace);
        self.fetch(addr, self.leader_tls.as_ref(), &name, &ask.path())
            .await
    }

    /// `ask`, put to the gateway: its endpoints in turn until one answers
    /// (a replica gone but still listed is skipped).
    pub async fn from_gateway(&self, ask: &Ask) -> Answer {
        let name = format!("{}-gateway", self.release);
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &self.namespace);
        let endpoints = api
            .get_opt(&name)
            .await
            .map_err(|e| format!("read Endpoints {}/{name}: {e}", self.namespace))?
            .ok_or_else(|| format!("no Endpoints {}/{name}: no gateway Service", self.namespace))?;
        let mut addrs = Vec::new();
        for subset in endpoints.subsets.unwrap_or_default() {
            let Some(port) = subset
                .ports
                .unwrap_or_default()
                .into_iter()
                .find(|p| p.name.as_deref() == Some(ADMIN_PORT))
            else {
                continue;
            };
            for address in subset.addresses.unwrap_or_default() {
                if let (Ok(ip), Ok(port)) = (address.ip.parse::<IpAddr>(), u16::try_from(port.port))
                {
                    addrs.push(SocketAddr::new(ip, port));
                }
            }
        }
        let mut last = format!(
            "no ready gateway endpoint with an {ADMIN_PORT:?} port in {}/{name}",
            self.namespace
        );
        let server = format!("{name}.{}.svc", self.namespace);
        for addr in addrs {
            match self
                .fetch(addr, self.gateway_tls.as_ref(), &server, &ask.path())
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(why) => last = why,
            }
        }
        Err(last)
    }

    fn ask_own(&self, ask: &Ask) -> Answer {
        let Some(inspect) = self.own.get() else {
            return Err("the process is still starting".into());
        };
        match ask {
            Ask::Status => Ok(inspect.status()),
            Ask::Object(key) => inspect.object(key),
        }
    }

    /// The admin address of the Pod `name`: its first IP and the container
    /// port named `admin`.
    async fn pod_admin(&self, name: &str) -> Result<SocketAddr, String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let pod = pods
            .get_opt(name)
            .await
            .map_err(|e| format!("read Pod {}/{name}: {e}", self.namespace))?
            .ok_or_else(|| format!("the leader's Pod {}/{name} does not exist", self.namespace))?;
        let status = pod.status.unwrap_or_default();
        let ip = status
            .pod_ips
            .and_then(|ips| ips.into_iter().next())
            .map(|ip| ip.ip)
            .or(status.pod_ip)
            .ok_or_else(|| format!("the leader's Pod {name} has no IP"))?;
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("the leader's Pod {name} has no valid IP ({ip:?})"))?;
        let port = pod
            .spec
            .unwrap_or_default()
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(ADMIN_PORT))
            .map(|p| p.container_port)
            .ok_or_else(|| format!("the leader's Pod {name} declares no {ADMIN_PORT:?} port"))?;
        let port = u16::try_from(port).map_err(|_| format!("port {port} of Pod {name}"))?;
        Ok(SocketAddr::new(ip, port))
    }
}

impl Peers {
    /// `GET path` from the admin server at `addr`, verified by `tls` as
    /// `server_name`, as JSON, within [`FETCH_TIMEOUT`].
    async fn fetch(
        &self,
        addr: SocketAddr,
        tls: Option<&ClientTls>,
        server_name: &str,
        path: &str,
    ) -> Answer {
        let url = format!("https://{addr}{path}");
        let Some(tls) = tls else {
            return Err(format!(
                "{url}: not asked: without a CA bundle (--diagnostics-peer-ca-file) its certificate cannot be verified"
            ));
        };
        let exchange = async {
            let config = tls.clone()?;
            let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
                .map_err(|e| format!("{server_name}: {e}"))?;
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("dial {addr}: {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("{url}: TLS as {server_name}: {e}"))?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            tokio::spawn(connection);
            let mut request = http::Request::get(path)
                .header(http::header::HOST, server_name)
                .header(http::header::ACCEPT, "application/json");
            let token = match &self.trust.token {
                Some(file) => std::fs::read_to_string(file)
                    .map_err(|e| format!("{url}: not asked: read {}: {e}", file.display()))?,
                None => {
                    return Err(format!(
                        "{url}: not asked: no peer token (--diagnostics-peer-token-file)"
                    ));
                }
            };
            request = request.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            );
            let request = request
                .body(Empty::<Bytes>::new())
                .map_err(|e| format!("{url}: {e}"))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| format!("{url}: {e}"))?
                .to_bytes();
            if !status.is_success() {
                let text = String::from_utf8_lossy(&body);
                return Err(format!("{url}: {status}: {}", text.trim()));
            }
            serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
        };
        tokio::time::timeout(FETCH_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| Err(format!("{url}: no answer within {FETCH_TIMEOUT:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_key_is_sent_encoded() {
        assert_eq!(Ask::Status.path(), "/debug/status");
        assert_eq!(
            Ask::Object("default/web app".into()).path(),
            "/debug/object?key=default%2Fweb+app"
        );
    }
}
