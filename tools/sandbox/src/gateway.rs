//! The gateway binary as a process on loopback, for tests that need the
//! real process: its environment, its log, its memory.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

use crate::pki::{GATEWAY_NAME, Issued, Pki};
use crate::ports::free_port;

/// What a process started to listen on a port did.
pub enum Started {
    Listening,
    Exited(std::process::ExitStatus),
    /// Still running, but nothing listened within the wait.
    Silent,
}

/// Waits up to `within` for `child` to listen on loopback `port`, looking
/// every 100 ms; stops early if it exits.
pub async fn until_listening(
    child: &mut Child,
    port: u16,
    within: Duration,
) -> anyhow::Result<Started> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Started::Exited(status));
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(Started::Listening);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(Started::Silent);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The gateway binary as a process on loopback, serving gRPC over TLS
/// with a certificate from its own CA (`<dir>/pki/`), with generated
/// tokens (one per role in `<dir>/state/tokens/`) and its log in
/// `<dir>/gateway.log`.
pub struct GatewayProcess {
    /// `https://127.0.0.1:<port>` of the gRPC API.
    pub address: String,
    /// The CA that issued its certificate; it issues client certificates
    /// too.
    pub pki: Pki,
    /// Its serving certificate and key: issue another into the same files
    /// to rotate it.
    pub serving: Issued,
    /// `127.0.0.1:<port>` of the admin server.
    pub admin: SocketAddr,
    /// The log file.
    pub log: std::path::PathBuf,
    tokens: std::path::PathBuf,
    child: Child,
}

impl GatewayProcess {
    /// Starts `<bin_dir>/cloud-gateway` with `args` after its listen
    /// addresses and state directory, and `env` on top of a cleared
    /// environment (so nothing of this machine's AWS setup leaks in).
    /// `args` name the provider (`--provider sim`): the gateway has no
    /// default.
    pub async fn start(
        bin_dir: &Path,
        dir: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (grpc, admin) = (free_port()?, free_port()?);
        let admin = SocketAddr::from(([127, 0, 0, 1], admin));
        let state = dir.join("state");
        let log = dir.join("gateway.log");
        let pki = Pki::create(&dir.join("pki"), "cloud-gateway test CA")?;
        let serving = pki.serving("gateway", &["localhost", "127.0.0.1", GATEWAY_NAME])?;
        let child = Command::new(bin_dir.join("cloud-gateway"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(crate::PROCESS_ENV.iter().copied())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .arg("--listen")
            .arg(format!("127.0.0.1:{grpc}"))
            .arg("--admin-listen")
            .arg(admin.to_string())
            .arg("--state-dir")
            .arg(&state)
            .arg("--tls-cert")
            .arg(&serving.cert)
            .arg("--tls-key")
            .arg(&serving.key)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("start cloud-gateway (build it first: cargo build --bins)")?;
        let mut gateway = Self {
            address: format!("https://127.0.0.1:{grpc}"),
            pki,
            serving,
            admin,
            log,
            tokens: state.join("tokens"),
            child,
        };
        // Tokens are generated (when they are) before the port opens.
        match until_listening(&mut gateway.child, grpc, Duration::from_secs(30)).await? {
            Started::Listening => Ok(gateway),
            Started::Exited(status) => {
                anyhow::bail!("cloud-gateway exited ({status}):\n{}", gateway.log_text())
            }
            Started::Silent => {
                anyhow::bail!("cloud-gateway did not listen:\n{}", gateway.log_text())
            }
        }
    }

    /// Starts it on the sim (`--provider sim` before `args`) from
    /// `bin_dir` in `dir`, and waits until it is ready (30 s at most);
    /// the error carries its log.
    pub async fn on_the_sim(bin_dir: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let args: Vec<String> = ["--provider", "sim"]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect();
        let gateway = Self::start(bin_dir, dir, &args, &[]).await?;
        if !gateway.wait_ready(Duration::from_secs(30)).await {
            anyhow::bail!(
                "cloud-gateway not ready within 30 s:\n{}",
                gateway.log_text()
            );
        }
        Ok(gateway)
    }

    /// A client for `cluster` with `role`'s token and no retries, so a
    /// test sees every failure as it is.
    pub fn client(&self, role: &str, cluster: &str) -> ccm_proto::GatewayClient {
        let mut config = self.client_config(
            cluster,
            ccm_proto::TokenSource::File(self.tokens.join(format!("{role}.token"))),
        );
        config.retry = ccm_proto::RetryPolicy::none();
        ccm_proto::GatewayClient::new(config).expect("client config")
    }

    /// How a client for `cluster` with `token` reaches it: over TLS,
    /// trusting its CA.
    pub fn client_config(
        &self,
        cluster: &str,
        token: ccm_proto::TokenSource,
    ) -> ccm_proto::ClientConfig {
        let mut config = ccm_proto::ClientConfig::new(self.address.clone(), cluster, token);
        config.tls_ca = Some(self.pki.ca_file());
        config
    }

    /// A raw TLS connection to the gRPC port offering HTTP/2, trusting the
    /// gateway's CA: for tests that speak HTTP/2 themselves.
    pub async fn tls_connect(
        &self,
    ) -> anyhow::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let authority = self.address.trim_start_matches("https://");
        let tcp = tokio::net::TcpStream::connect(authority).await?;
        let config = ccm_runtime::tls::client_config(
            &std::fs::read(self.pki.ca_file())?,
            "the gateway's CA",
            None,
            &[ccm_runtime::tls::ALPN_H2],
        )?;
        let name = rustls::pki_types::ServerName::try_from("localhost")?;
        Ok(
            tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
                .connect(name, tcp)
                .await?,
        )
    }

    /// The file of `role`'s generated token.
    pub fn token_file(&self, role: &str) -> std::path::PathBuf {
        self.tokens.join(format!("{role}.token"))
    }

    /// The status code of `GET <path>` on the admin server, and the body.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        // Its generated admin token, where it made one; else (a gateway
        // given its tokens, or ServiceAccounts) the test API server's
        // admin, which its reviews let in. The probes need neither.
        let token = std::fs::read_to_string(self.token_file("admin"))
            .map(|t| t.trim().to_owned())
            .unwrap_or_else(|_| kube_test_apiserver::ADMIN_TOKEN.to_owned());
        Ok(crate::admin::admin_get(self.admin, path, Some(&token)).await?)
    }

    /// Waits until `/readyz` answers 200; false after `within`.
    pub async fn wait_ready(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if matches!(self.admin_get("/readyz").await, Ok((200, _))) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// The value of the metric line starting with `prefix` (name and
    /// labels), 0 when absent.
    pub async fn metric(&self, prefix: &str) -> f64 {
        let (_, body) = self.admin_get("/metrics").await.unwrap_or_default();
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The process ID.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Resident memory now, in bytes (Linux).
    pub fn rss(&self) -> Option<u64> {
        let (mib, _) = crate::resident_mib(self.pid()?)?;
        Some((mib * 1024.0 * 1024.0) as u64)
    }

    /// Everything the gateway logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it with SIGTERM and waits for it to exit; returns its log.
    pub async fn stop(self) -> String {
        self.terminate(Duration::from_secs(10)).await.1
    }

    /// Sends SIGTERM and waits up to `within` for the exit (then kills it);
    /// returns the exit status (`None` if it had to be killed) and the log.
    pub async fn terminate(
        mut self,
        within: Duration,
    ) -> (Option<std::process::ExitStatus>, String) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let status = match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = self.child.kill().await;
                None
            }
        };
        (status, self.log_text())
    }
}
