//! Where an APIService's requests go, found as kube-aggregator's service
//! resolver finds it: the Service `spec.service` names, its port numbered
//! `spec.service.port` (443 if unset), then every address of every subset
//! of the Service's `Endpoints` that has a port of that port's name (an
//! unnamed port matches an unnamed one). A connection is TLS, verified
//! against `spec.caBundle` for the name `<service>.<namespace>.svc`
//! (or not at all with `insecureSkipTLSVerify`), presenting the front
//! proxy's client certificate.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::front_proxy::Trust;
use crate::resources;
use crate::store::Store;

/// How long one address has to accept a connection and finish the TLS
/// handshake before the next is tried.
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why no address was found: the Service is missing.
pub(crate) const SERVICE_NOT_FOUND: &str = "ServiceNotFound";
/// Why no address was found: the Service has no port of that number.
pub(crate) const SERVICE_PORT_ERROR: &str = "ServicePortError";
/// Why no address was found: no Endpoints, or none at that port.
pub(crate) const MISSING_ENDPOINTS: &str = "MissingEndpoints";

/// The Service an APIService names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The Service's port (not the endpoints'): 443 unless given.
    pub port: i64,
}

impl ServiceRef {
    /// The Service `api_service` names, if it names one.
    pub(crate) fn of(api_service: &Value) -> Option<Self> {
        let service = &api_service["spec"]["service"];
        let text = |field: &str| {
            service[field]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Some(Self {
            namespace: text("namespace")?,
            name: text("name")?,
            port: service["port"].as_i64().unwrap_or(443),
        })
    }

    /// The name its certificate is verified for.
    pub(crate) fn server_name(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }
}

/// Why a Service has no address to send to: a reason for the
/// `Available` condition and a message, as kube-aggregator words them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Missing {
    /// [`SERVICE_NOT_FOUND`], [`SERVICE_PORT_ERROR`] or
    /// [`MISSING_ENDPOINTS`].
    pub reason: &'static str,
    /// What is missing, naming the Service.
    pub message: String,
}

/// Every address `service` is served at, in the order its Endpoints
/// list them.
pub(crate) fn addresses(store: &Store, service: &ServiceRef) -> Result<Vec<SocketAddr>, Missing> {
    let core = |plural| resources::find("", "v1", plural).expect("served");
    let found = store
        .get(core("services"), &service.namespace, &service.name)
        .map_err(|_| Missing {
            reason: SERVICE_NOT_FOUND,
            message: format!(
                "service/{} in {:?} is not present",
                service.name, service.namespace
            ),
        })?;
    let endpoints = store
        .get(core("endpoints"), &service.namespace, &service.name)
        .ok();
    endpoint_addresses(service, &found, endpoints.as_ref())
}

/// The addresses of `endpoints` at the port of `svc` that `service`
/// names.
fn endpoint_addresses(
    service: &ServiceRef,
    svc: &Value,
    endpoints: Option<&Value>,
) -> Result<Vec<SocketAddr>, Missing> {
    let (name, namespace) = (&service.name, &service.namespace);
    let port_name = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_i64() == Some(service.port))
        .map(|p| p["name"].as_str().unwrap_or_default())
        .ok_or_else(|| Missing {
            reason: SERVICE_PORT_ERROR,
            message: format!(
                "service/{name} in {namespace:?} is not listening on port {}",
                service.port
            ),
        })?;
    let endpoints = endpoints.ok_or_else(|| Missing {
        reason: MISSING_ENDPOINTS,
        message: format!("cannot find endpoints for service/{name} in {namespace:?}"),
    })?;
    let mut out = Vec::new();
    for subset in endpoints["subsets"].as_array().into_iter().flatten() {
        let port = subset["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
            .and_then(|p| u16::try_from(p["port"].as_i64()?).ok());
        let Some(port) = port else {
            continue;
        };
        out.extend(
            subset["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a["ip"].as_str()?.parse::<IpAddr>().ok())
                .map(|ip| SocketAddr::new(ip, port)),
        );
    }
    if out.is_empty() {
        return Err(Missing {
            reason: MISSING_ENDPOINTS,
            message: format!(
                "endpoints for service/{name} in {namespace:?} have no addresses with port name {port_name:?}"
            ),
        });
    }
    Ok(out)
}

/// How `api_service`'s server is to be trusted: `spec.caBundle` (base64
/// of PEM certificates), or nothing checked with
/// `spec.insecureSkipTLSVerify`.
pub(crate) fn trust(api_service: &Value) -> Result<Trust, String> {
    let spec = &api_service["spec"];
    if spec["insecureSkipTLSVerify"] == true {
        return Ok(Trust::Anything);
    }
    let bundle = spec["caBundle"].as_str().unwrap_or_default();
    if bundle.is_empty() {
        return Err("the APIService has no caBundle to verify its server with".into());
    }
    let pem = data_encoding::BASE64
        .decode(bundle.as_bytes())
        .map_err(|e| format!("spec.caBundle is not base64: {e}"))?;
    ccm_runtime::tls::roots(&pem, "spec.caBundle")
        .map(Trust::Roots)
        .map_err(|e| format!("{e:#}"))
}

/// A TLS connection to the first of `addresses` that takes one, trying
/// them in turn from `start` (modulo their number), each for at most
/// [`DIAL_TIMEOUT`]; with the address reached. The error names every
/// attempt.
pub(crate) async fn connect(
    tls: Arc<ClientConfig>,
    server_name: &str,
    addresses: &[SocketAddr],
    start: usize,
) -> Result<(TlsStream<TcpStream>, SocketAddr), String> {
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|e| format!("{server_name:?}: {e}"))?;
    let connector = TlsConnector::from(tls);
    let mut errors = Vec::new();
    for i in 0..addresses.len() {
        let addr = addresses[(start + i) % addresses.len()];
        match tokio::time::timeout(DIAL_TIMEOUT, dial(&connector, name.clone(), addr)).await {
            Ok(Ok(stream)) => return Ok((stream, addr)),
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push(format!("dial tcp {addr}: i/o timeout")),
        }
    }
    if errors.is_empty() {
        errors.push("no addresses".into());
    }
    Err(errors.join("; "))
}

async fn dial(
    connector: &TlsConnector,
    name: ServerName<'static>,
    addr: SocketAddr,
) -> Result<TlsStream<TcpStream>, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("dial tcp {addr}: connect: {e}"))?;
    connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls with {addr}: {e}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service_ref(port: i64) -> ServiceRef {
        ServiceRef {
            namespace: "kube-system".into(),
            name: "diag".into(),
            port,
        }
    }

    #[test]
    fn an_api_service_names_its_service_with_port_443_by_default() {
        let a = json!({"spec": {"service": {"namespace": "kube-system", "name": "diag"}}});
        let found = ServiceRef::of(&a).unwrap();
        assert_eq!(found, service_ref(443));
        assert_eq!(found.server_name(), "diag.kube-system.svc");
        let a = json!({"spec": {"service": {"namespace": "kube-system", "name": "diag", "port": 8443}}});
        assert_eq!(ServiceRef::of(&a).unwrap().port, 8443);
        assert_eq!(ServiceRef::of(&json!({"spec": {}})), None);
        assert_eq!(
            ServiceRef::of(&json!({"spec": {"service": {"name": "diag"}}})),
            None
        );
    }

    #[test]
    fn every_address_of_every_subset_with_the_service_ports_name_is_a_backend() {
        let svc = json!({"spec": {"ports": [
            {"name": "https", "port": 443, "targetPort": 8443},
            {"name": "metrics", "port": 9090},
        ]}});
        let endpoints = json!({"subsets": [
            {"addresses": [{"ip": "10.0.0.1"}, {"ip": "not-an-ip"}], "ports": [{"name": "https", "port": 8443}]},
            {"addresses": [{"ip": "10.0.0.2"}], "notReadyAddresses": [{"ip": "10.0.0.9"}],
             "ports": [{"name": "metrics", "port": 9090}, {"name": "https", "port": 9443}]},
            {"addresses": [{"ip": "10.0.0.3"}], "ports": [{"name": "metrics", "port": 9090}]},
        ]});
        let got = endpoint_addresses(&service_ref(443), &svc, Some(&endpoints)).unwrap();
        let want: Vec<SocketAddr> = ["10.0.0.1:8443", "10.0.0.2:9443"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(got, want);

        let unnamed = json!({"spec": {"ports": [{"port": 443}]}});
        let unnamed_endpoints = json!({"subsets": [
            {"addresses": [{"ip": "10.0.0.4"}], "ports": [{"name": "https", "port": 1}]},
            {"addresses": [{"ip": "10.0.0.5"}], "ports": [{"port": 8443}]},
        ]});
        assert_eq!(
            endpoint_addresses(&service_ref(443), &unnamed, Some(&unnamed_endpoints)).unwrap(),
            ["10.0.0.5:8443".parse::<SocketAddr>().unwrap()]
        );

        let reason = |port: i64, endpoints: Option<&Value>| {
            endpoint_addresses(&service_ref(port), &svc, endpoints)
                .unwrap_err()
                .reason
        };
        assert_eq!(reason(8080, Some(&endpoints)), SERVICE_PORT_ERROR);
        assert_eq!(reason(443, None), MISSING_ENDPOINTS);
        assert_eq!(
            reason(443, Some(&json!({"subsets": []}))),
            MISSING_ENDPOINTS
        );
        let missing = endpoint_addresses(&service_ref(443), &svc, Some(&json!({}))).unwrap_err();
        assert_eq!(
            missing.message,
            "endpoints for service/diag in \"kube-system\" have no addresses with port name \"https\""
        );
    }

    #[test]
    fn the_server_is_trusted_by_its_ca_bundle_or_not_checked_when_told() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca".to_owned()]).unwrap();
        let bundle = data_encoding::BASE64.encode(ca.cert.pem().as_bytes());
        assert!(matches!(
            trust(&json!({"spec": {"caBundle": bundle}})),
            Ok(Trust::Roots(_))
        ));
        assert!(matches!(
            trust(&json!({"spec": {"insecureSkipTLSVerify": true}})),
            Ok(Trust::Anything)
        ));
        let no_bundle = trust(&json!({"spec": {}})).err().unwrap();
        assert!(no_bundle.contains("no caBundle"), "{no_bundle}");
        let garbage = trust(&json!({"spec": {"caBundle": "%%%"}})).err().unwrap();
        assert!(garbage.contains("not base64"), "{garbage}");
    }
}
