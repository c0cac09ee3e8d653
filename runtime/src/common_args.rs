//! The flags every controller shares, flattened into each binary's own
//! arguments: logging, Kubernetes, the admin server, the cloud gateway and
//! leader election. Values are strings until [`CommonArgs::resolve`] checks
//! them all, so one run reports every problem.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::config_checks::{Problems, check_file, duration_within};
pub use crate::leader::LeaseSettings;
use crate::telemetry::LogFormat;

/// Flags shared by every controller.
#[derive(Args, Clone, Debug)]
pub struct CommonArgs {
    /// Config file (YAML or TOML) with settings named as the flags; flags and environment win over it.
    #[arg(long, env = "CCM_CONFIG")]
    pub config: Option<String>,
    /// Kubeconfig to use; without it, the in-cluster config or $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<String>,
    /// The cluster's name; cloud resources are tagged with it.
    #[arg(long, env = "CCM_CLUSTER_NAME", default_value = "kubernetes")]
    pub cluster_name: String,
    /// Address of the admin HTTP server (/livez, /readyz, /metrics).
    #[arg(long, env = "CCM_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// The cloud gateway's gRPC address: https://host:port, or http:// to this machine only.
    #[arg(
        long,
        env = "CCM_GATEWAY_ADDRESS",
        default_value = "http://127.0.0.1:7400"
    )]
    pub gateway_address: String,
    /// File holding the bearer token for the gateway; read again when it rotates.
    #[arg(long, env = "CCM_GATEWAY_TOKEN_FILE")]
    pub gateway_token_file: Option<String>,
    /// PEM client certificate shown to the gateway instead of a token
    /// (mutual TLS: the gateway maps its identity to a role); with
    /// --gateway-client-key-file and an https:// address. Read at start.
    #[arg(long, env = "CCM_GATEWAY_CLIENT_CERT_FILE")]
    pub gateway_client_cert_file: Option<String>,
    /// The PEM key of --gateway-client-cert-file.
    #[arg(long, env = "CCM_GATEWAY_CLIENT_KEY_FILE")]
    pub gateway_client_key_file: Option<String>,
    /// PEM CA bundle the gateway's certificate is verified against; required with https://, read again when it changes.
    #[arg(long, env = "CCM_GATEWAY_CA_FILE")]
    pub gateway_ca_file: Option<String>,
    /// The name the gateway's certificate must carry, when the address does not give it (an IP address).
    #[arg(long, env = "CCM_GATEWAY_SERVER_NAME")]
    pub gateway_server_name: Option<String>,
    /// Deadline of each gateway call.
    #[arg(long, env = "CCM_GATEWAY_TIMEOUT", default_value = "10s")]
    pub gateway_timeout: String,
    /// Run only while holding the leader lease: true or false.
    #[arg(long, env = "CCM_LEADER_ELECT", default_value = "true", num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: String,
    /// How long a lease lasts without renewal before another replica may take it.
    #[arg(long, default_value = "15s")]
    pub leader_elect_lease_duration: String,
    /// How long a leader keeps trying to renew before it stops work.
    #[arg(long, default_value = "10s")]
    pub leader_elect_renew_deadline: String,
    /// How often to try to acquire or renew the lease.
    #[arg(long, default_value = "2s")]
    pub leader_elect_retry_period: String,
    /// Name of the lease; each controller has its own default.
    #[arg(long)]
    pub leader_elect_resource_name: Option<String>,
    /// Namespace of the lease.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
    /// Log format: plain or json.
    #[arg(long, env = "CCM_LOG_FORMAT", default_value = "plain")]
    pub log_format: String,
    /// Log filter, e.g. info or info,node_controller=debug; RUST_LOG wins.
    #[arg(long, env = "CCM_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Send traces over OTLP/gRPC to this collector, e.g.
    /// http://otel-collector:4317; off when unset.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Serve the diagnostics API (diagnostics.cloudgateway.io, aggregated
    /// by kube-apiserver) on this address, e.g. 0.0.0.0:7412; off when unset.
    #[arg(long, env = "CCM_DIAGNOSTICS_LISTEN")]
    pub diagnostics_listen: Option<String>,
    /// The diagnostics API's serving certificate (PEM, read again while serving).
    #[arg(long)]
    pub diagnostics_tls_cert: Option<String>,
    /// The diagnostics API's private key (PEM).
    #[arg(long)]
    pub diagnostics_tls_key: Option<String>,
    /// The CA bundle that signs kube-apiserver's front-proxy client
    /// certificate; default: kube-system/extension-apiserver-authentication.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<String>,
    /// Common names the front-proxy certificate may carry, comma-separated
    /// (empty: any the CA signed); only with --requestheader-client-ca-file.
    #[arg(long)]
    pub requestheader_allowed_names: Option<String>,
    /// The base of the release's object names (<base>-<component>): the
    /// diagnostics API finds the other controllers' Leases and the
    /// gateway's Endpoints by it.
    #[arg(long, env = "CCM_RELEASE_NAME", default_value = "ccm")]
    pub release_name: String,
    /// The CA bundle that signed the leaders' and the gateway's admin
    /// certificates, which the diagnostics API verifies before it sends them
    /// its token (by <release>-diagnostics.<namespace>.svc and
    /// <release>-gateway.<namespace>.svc).
    #[arg(long)]
    pub diagnostics_peer_ca_file: Option<String>,
    /// The token the diagnostics API shows the leaders' and the gateway's
    /// admin ports: a ServiceAccount token bound to the audience
    /// diagnostics.cloudgateway.io (a projected volume), which the API
    /// server refuses, read at each use; required with
    /// --diagnostics-peer-ca-file. The process's own API token is never sent.
    #[arg(long, env = "CCM_DIAGNOSTICS_PEER_TOKEN_FILE")]
    pub diagnostics_peer_token_file: Option<String>,
    #[command(flatten)]
    pub admin: crate::admin::AdminArgs,
}

/// The checked shared settings.
#[derive(Clone, Debug)]
pub struct Common {
    pub kubeconfig: Option<PathBuf>,
    pub cluster_name: String,
    pub admin_listen: SocketAddr,
    /// The admin port's certificate and open paths.
    pub admin: crate::admin::AdminSettings,
    pub gateway: ccm_proto::ClientConfig,
    pub lease: LeaseSettings,
    pub log_format: LogFormat,
    pub log_level: String,
    pub otlp_endpoint: Option<String>,
    /// How the diagnostics API is served; `None`: it is not.
    pub diagnostics: Option<crate::diagnostics::Settings>,
}

impl Common {
    /// How the process logs and traces.
    pub fn telemetry(&self) -> crate::telemetry::Options {
        crate::telemetry::Options {
            format: self.log_format,
            directives: self.log_level.clone(),
            otlp_endpoint: self.otlp_endpoint.clone(),
            service: String::new(),
        }
    }
}

impl CommonArgs {
    /// Checks every shared setting; `default_admin` and `default_lease`
    /// are the controller's own defaults.
    pub fn resolve(
        &self,
        p: &mut Problems,
        default_admin: &str,
        default_lease: &str,
    ) -> Option<Common> {
        if !crate::names::is_cluster_name(&self.cluster_name) {
            p.push(
                "cluster-name",
                format!(
                    "{:?} is not a cluster name ({})",
                    self.cluster_name,
                    crate::names::CLUSTER_NAME_RULE
                ),
            );
        }
        let admin = self.admin_listen.as_deref().unwrap_or(default_admin);
        let admin_listen = p.parse("admin-listen", admin, str::parse::<SocketAddr>);
        match ccm_proto::check_transport(
            &self.gateway_address,
            self.gateway_ca_file.is_some(),
        ) {
            Ok(true) if self.gateway_ca_file.is_none() => p.push(
                "gateway-ca-file",
                "is required with an https:// gateway address: the CA bundle that signed the gateway's certificate",
            ),
            Ok(false) if self.gateway_server_name.is_some() => p.push(
                "gateway-server-name",
                "only with an https:// gateway address",
            ),
            Ok(false) if self.gateway_client_cert_file.is_some() => p.push(
                "gateway-client-cert-file",
                "only with an https:// gateway address: a client certificate is shown in the TLS handshake",
            ),
            Ok(_) => {}
            Err(problem) => p.push("gateway-address", problem),
        }
        let file = |p: &mut Problems, key: &str, path: &str| match check_file(path) {
            Ok(()) => Some(PathBuf::from(path)),
            Err(problem) => {
                p.push(key, problem);
                None
            }
        };
        let client_cert = match (
            &self.gateway_client_cert_file,
            &self.gateway_client_key_file,
        ) {
            (Some(cert), Some(key)) => {
                let cert = file(p, "gateway-client-cert-file", cert);
                let key = file(p, "gateway-client-key-file", key);
                Some(cert.zip(key))
            }
            (Some(_), None) => {
                p.push(
                    "gateway-client-key-file",
                    "is required with --gateway-client-cert-file",
                );
                Some(None)
            }
            (None, Some(_)) => {
                p.push(
                    "gateway-client-cert-file",
                    "is required with --gateway-client-key-file",
                );
                Some(None)
            }
            (None, None) => None,
        };
        let token = match (&self.gateway_token_file, &client_cert) {
            (Some(_), Some(_)) => {
                p.push(
                    "gateway-token-file",
                    "not with --gateway-client-cert-file: the gateway knows a caller by its token or by its certificate, not both",
                );
                None
            }
            (Some(path), None) => {
                file(p, "gateway-token-file", path).map(ccm_proto::TokenSource::File)
            }
            (None, Some(_)) => Some(ccm_proto::TokenSource::None),
            (None, None) => {
                p.push(
                    "gateway-token-file",
                    "is required (or --gateway-client-cert-file): the gateway refuses calls without a token or a client certificate",
                );
                None
            }
        };
        if let Some(Err(problem)) = self.gateway_ca_file.as_deref().map(check_file) {
            p.push("gateway-ca-file", problem);
        }
        let timeout = p.parse(
            "gateway-timeout",
            &self.gateway_timeout,
            duration_within(Duration::from_millis(100), Duration::from_secs(300)),
        );
        let enabled = p.parse("leader-elect", &self.leader_elect, |s| {
            s.parse::<bool>().map_err(|_| "use true or false")
        });
        let lease_duration = p.parse(
            "leader-elect-lease-duration",
            &self.leader_elect_lease_duration,
            duration_within(Duration::from_secs(1), Duration::from_secs(3600)),
        );
        let renew_deadline = p.parse(
            "leader-elect-renew-deadline",
            &self.leader_elect_renew_deadline,
            duration_within(Duration::from_millis(100), Duration::from_secs(3600)),
        );
        let retry_period = p.parse(
            "leader-elect-retry-period",
            &self.leader_elect_retry_period,
            duration_within(Duration::from_millis(100), Duration::from_secs(600)),
        );
        if let (Some(lease), Some(renew), Some(retry)) =
            (lease_duration, renew_deadline, retry_period)
        {
            // The same rules upstream's leader election enforces.
            if lease <= renew {
                p.push(
                    "leader-elect-lease-duration",
                    "must be greater than leader-elect-renew-deadline",
                );
            }
            if renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
                p.push(
                    "leader-elect-renew-deadline",
                    "must be greater than 1.2 x leader-elect-retry-period",
                );
            }
        }
        let log_format = p.parse("log-format", &self.log_format, str::parse::<LogFormat>);
        p.parse("log-level", &self.log_level, crate::telemetry::parse_filter);
        let otlp_endpoint = match &self.otlp_endpoint {
            Some(endpoint) => p
                .parse(
                    "otlp-endpoint",
                    endpoint,
                    crate::telemetry::parse_otlp_endpoint,
                )
                .map(Some),
            None => Some(None),
        };
        if let Some(Err(problem)) = self.kubeconfig.as_deref().map(check_file) {
            p.push("kubeconfig", problem);
        }
        let diagnostics = self.diagnostics(p);
        let admin = self.admin.resolve(p);
        let mut gateway = ccm_proto::ClientConfig::new(
            self.gateway_address.clone(),
            self.cluster_name.clone(),
            token?,
        );
        gateway.client_cert = client_cert.flatten();
        gateway.timeout = timeout?;
        gateway.tls_ca = self.gateway_ca_file.as_ref().map(PathBuf::from);
        gateway.tls_server_name = self.gateway_server_name.clone();
        Some(Common {
            kubeconfig: self.kubeconfig.as_ref().map(PathBuf::from),
            cluster_name: self.cluster_name.clone(),
            admin_listen: admin_listen?,
            admin: admin?,
            gateway,
            lease: LeaseSettings {
                enabled: enabled?,
                name: self
                    .leader_elect_resource_name
                    .clone()
                    .unwrap_or_else(|| default_lease.to_owned()),
                namespace: self.leader_elect_resource_namespace.clone(),
                lease_duration: lease_duration?,
                renew_deadline: renew_deadline?,
                retry_period: retry_period?,
            },
            log_format: log_format?,
            log_level: self.log_level.clone(),
            otlp_endpoint: otlp_endpoint?,
            diagnostics: diagnostics?,
        })
    }

    /// The diagnostics API's settings, checked; `Some(None)` when it is
    /// not served.
    fn diagnostics(&self, p: &mut Problems) -> Option<Option<crate::diagnostics::Settings>> {
        let file = |p: &mut Problems, key: &str, value: &Option<String>| {
            let path = value.as_deref()?;
            match check_file(path) {
                Ok(()) => Some(PathBuf::from(path)),
                Err(problem) => {
                    p.push(key, problem);
                    None
                }
            }
        };
        if !crate::names::is_dns_label(&self.release_name) {
            p.push(
                "release-name",
                format!("{:?} is not a DNS label", self.release_name),
            );
        }
        let ca = file(
            p,
            "requestheader-client-ca-file",
            &self.requestheader_client_ca_file,
        );
        let peer_ca = file(
            p,
            "diagnostics-peer-ca-file",
            &self.diagnostics_peer_ca_file,
        );
        let peer_token = file(
            p,
            "diagnostics-peer-token-file",
            &self.diagnostics_peer_token_file,
        );
        match (
            &self.diagnostics_peer_ca_file,
            &self.diagnostics_peer_token_file,
        ) {
            (Some(_), None) => p.push(
                "diagnostics-peer-token-file",
                format!(
                    "is required with --diagnostics-peer-ca-file: the peers are shown a token bound to the audience {}, never this process's API token",
                    crate::admin::access::PEER_AUDIENCE
                ),
            ),
            (None, Some(_)) => p.push(
                "diagnostics-peer-token-file",
                "only with --diagnostics-peer-ca-file (without it no peer is asked)",
            ),
            _ => {}
        }
        if self.requestheader_allowed_names.is_some() && self.requestheader_client_ca_file.is_none()
        {
            p.push(
                "requestheader-allowed-names",
                "only with --requestheader-client-ca-file (else both come from kube-apiserver's ConfigMap)",
            );
        }
        let Some(listen) = &self.diagnostics_listen else {
            for (key, set) in [
                ("diagnostics-tls-cert", self.diagnostics_tls_cert.is_some()),
                ("diagnostics-tls-key", self.diagnostics_tls_key.is_some()),
                (
                    "requestheader-client-ca-file",
                    self.requestheader_client_ca_file.is_some(),
                ),
            ] {
                if set {
                    p.push(key, "only with --diagnostics-listen");
                }
            }
            return Some(None);
        };
        let listen = p.parse("diagnostics-listen", listen, str::parse::<SocketAddr>);
        let required = |p: &mut Problems, key: &str, value: &Option<String>| {
            if value.is_none() {
                p.push(
                    key,
                    "is required with --diagnostics-listen: the API is served over TLS only",
                );
            }
            file(p, key, value)
        };
        let cert = required(p, "diagnostics-tls-cert", &self.diagnostics_tls_cert);
        let key = required(p, "diagnostics-tls-key", &self.diagnostics_tls_key);
        let allowed: Vec<String> = self
            .requestheader_allowed_names
            .iter()
            .flat_map(|names| names.split(','))
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        Some(Some(crate::diagnostics::Settings {
            listen: listen?,
            cert: cert?,
            key: key?,
            request_header: match (&self.requestheader_client_ca_file, ca) {
                (None, _) => None,
                (Some(_), ca) => Some((ca?, allowed)),
            },
            release: self.release_name.clone(),
            namespace: self.leader_elect_resource_namespace.clone(),
            peer_ca: match (&self.diagnostics_peer_ca_file, peer_ca) {
                (None, _) => None,
                (Some(_), ca) => Some(ca?),
            },
            peer_token: match (&self.diagnostics_peer_token_file, peer_token) {
                (None, _) => None,
                (Some(_), token) => Some(token?),
            },
            gateway_ca: self.gateway_ca_file.as_ref().map(PathBuf::from),
        }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Bin {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn resolve(args: &[&str]) -> Result<Common, Problems> {
        let bin = Bin::try_parse_from(std::iter::once("bin").chain(args.iter().copied())).unwrap();
        let mut p = Problems::new();
        let common = bin.common.resolve(&mut p, "127.0.0.1:9000", "ccm-test");
        p.finish(|| common.expect("no problems means a value"))
    }

    #[test]
    fn defaults_follow_upstream_leader_election() {
        let token = std::env::temp_dir().join(format!("ccm-args-{}.token", std::process::id()));
        std::fs::write(&token, "t").unwrap();
        let common = resolve(&["--gateway-token-file", token.to_str().unwrap()]).unwrap();
        assert_eq!(common.lease.lease_duration, Duration::from_secs(15));
        assert_eq!(common.lease.renew_deadline, Duration::from_secs(10));
        assert_eq!(common.lease.retry_period, Duration::from_secs(2));
        assert_eq!(common.lease.name, "ccm-test");
        assert!(common.lease.enabled);
        let off = resolve(&[
            "--gateway-token-file",
            token.to_str().unwrap(),
            "--leader-elect=false",
        ])
        .unwrap();
        assert!(!off.lease.enabled);
        std::fs::remove_file(token).unwrap();
    }

    #[test]
    fn every_problem_is_listed() {
        let problems = resolve(&[
            "--cluster-name",
            "bad name",
            "--gateway-address",
            "localhost:1",
            "--leader-elect-renew-deadline",
            "20s",
            "--log-format",
            "xml",
            "--admin-listen",
            "x",
        ])
        .unwrap_err();
        let text = problems.to_string();
        for key in [
            "cluster-name",
            "gateway-address",
            "gateway-token-file",
            "leader-elect-lease-duration",
            "log-format",
            "admin-listen",
        ] {
            assert!(text.contains(key), "{key} missing: {text}");
        }
    }

    #[test]
    fn the_gateway_is_reached_over_tls_or_on_this_machine_only() {
        let token = std::env::temp_dir().join(format!("ccm-tls-{}.token", std::process::id()));
        std::fs::write(&token, "t").unwrap();
        let token = token.to_str().unwrap();
        let problem = |args: &[&str]| {
            let mut all = vec!["--gateway-token-file", token];
            all.extend(args);
            resolve(&all).err().map(|p| p.to_string())
        };
        assert_eq!(
            problem(&["--gateway-address", "http://127.0.0.1:7400"]),
            None
        );
        let clear = problem(&["--gateway-address", "http://10.0.0.7:7400"]).unwrap();
        assert!(clear.contains("plaintext only to this machine"), "{clear}");
        let no_ca = problem(&["--gateway-address", "https://gateway:7400"]).unwrap();
        assert!(no_ca.contains("gateway-ca-file"), "{no_ca}");
        let mixed = problem(&[
            "--gateway-address",
            "http://127.0.0.1:7400",
            "--gateway-ca-file",
            token,
        ])
        .unwrap();
        assert!(mixed.contains("use https://"), "{mixed}");
        assert_eq!(
            problem(&[
                "--gateway-address",
                "https://10.96.0.12:7400",
                "--gateway-ca-file",
                token,
                "--gateway-server-name",
                "ccm-gateway.kube-system.svc",
            ]),
            None
        );
    }

    #[test]
    fn a_client_certificate_stands_for_the_token_and_never_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, "x").unwrap();
            path.to_str().unwrap().to_owned()
        };
        let (ca, cert, key, token) = (file("ca"), file("cert"), file("key"), file("token"));
        let tls = [
            "--gateway-address",
            "https://gateway:7400",
            "--gateway-ca-file",
            &ca,
        ];
        let with = |more: &[&str]| {
            let mut all = tls.to_vec();
            all.extend(more);
            resolve(&all)
        };
        let common = with(&[
            "--gateway-client-cert-file",
            &cert,
            "--gateway-client-key-file",
            &key,
        ])
        .unwrap();
        assert_eq!(
            common.gateway.client_cert,
            Some((cert.clone().into(), key.clone().into()))
        );
        assert!(matches!(common.gateway.token, ccm_proto::TokenSource::None));
        let problem = |more: &[&str]| with(more).err().map(|p| p.to_string()).unwrap_or_default();
        let both = problem(&[
            "--gateway-token-file",
            &token,
            "--gateway-client-cert-file",
            &cert,
            "--gateway-client-key-file",
            &key,
        ]);
        assert!(both.contains("not both"), "{both}");
        let alone = problem(&["--gateway-client-cert-file", &cert]);
        assert!(alone.contains("gateway-client-key-file"), "{alone}");
        let missing = problem(&[
            "--gateway-client-cert-file",
            "/nonexistent/cert",
            "--gateway-client-key-file",
            &key,
        ]);
        assert!(missing.contains("no such file"), "{missing}");
        let clear = resolve(&[
            "--gateway-client-cert-file",
            &cert,
            "--gateway-client-key-file",
            &key,
        ])
        .err()
        .map(|p| p.to_string())
        .unwrap_or_default();
        assert!(clear.contains("only with an https://"), "{clear}");
        let neither = resolve(&[])
            .err()
            .map(|p| p.to_string())
            .unwrap_or_default();
        assert!(neither.contains("gateway-client-cert-file"), "{neither}");
    }

    #[test]
    fn the_peers_are_shown_a_token_of_their_own_and_reviews_are_bounded() {
        let file = std::env::temp_dir().join(format!("ccm-peer-{}.token", std::process::id()));
        std::fs::write(&file, "t").unwrap();
        let file = file.to_str().unwrap();
        let problem = |args: &[&str]| {
            let mut all = vec!["--gateway-token-file", file];
            all.extend(args);
            resolve(&all).err().map(|p| p.to_string())
        };
        let no_token = problem(&["--diagnostics-peer-ca-file", file]).unwrap();
        assert!(
            no_token.contains("diagnostics-peer-token-file")
                && no_token.contains("diagnostics.cloudgateway.io"),
            "{no_token}"
        );
        let no_ca = problem(&["--diagnostics-peer-token-file", file]).unwrap();
        assert!(
            no_ca.contains("only with --diagnostics-peer-ca-file"),
            "{no_ca}"
        );
        let bounds = problem(&[
            "--admin-token-reviews-per-second",
            "0",
            "--admin-token-reviews-in-flight",
            "none",
        ])
        .unwrap();
        assert!(
            bounds.contains("admin-token-reviews-per-second")
                && bounds.contains("admin-token-reviews-in-flight"),
            "{bounds}"
        );
        let common = resolve(&[
            "--gateway-token-file",
            file,
            "--diagnostics-peer-ca-file",
            file,
            "--diagnostics-peer-token-file",
            file,
        ])
        .unwrap();
        assert_eq!(
            common.admin.reviews,
            crate::admin::access::ReviewLimits::default()
        );
        std::fs::remove_file(file).unwrap();
    }
}
