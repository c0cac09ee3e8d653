//! The toy gateway (`tests/toy-gateway/toy_gateway.py`): a second
//! implementation of cloudgateway.v1, in Python, with an in-memory cloud.
//! It shares no code with ours; tests run the conformance suite and the
//! unchanged controllers against it to prove the contract is enough.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

use crate::gateway::Started;
use crate::pki::{Issued, Pki};

/// The script, in the source tree.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/toy-gateway/toy_gateway.py")
}

/// The protos it compiles at start, in the source tree.
pub fn proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto")
}

/// The Python that runs it (grpcio, grpcio-tools from
/// tests/requirements.txt); `TOY_PYTHON` overrides.
pub fn python() -> String {
    std::env::var("TOY_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Its flags to listen on `listen` over TLS with `serving`, with the role
/// tokens in `tokens` (`<role>.token`).
pub fn args(listen: &str, tokens: &Path, serving: &Issued) -> Vec<String> {
    vec![
        "--listen".into(),
        listen.into(),
        "--proto-dir".into(),
        proto_dir().display().to_string(),
        "--tokens-dir".into(),
        tokens.display().to_string(),
        "--tls-cert".into(),
        serving.cert.display().to_string(),
        "--tls-key".into(),
        serving.key.display().to_string(),
    ]
}

/// The toy gateway as a process on loopback, over TLS with a certificate
/// from its own CA (`<dir>/pki/ca.crt`), with a token per role in
/// `<dir>/tokens/` and its log in `<dir>/toy-gateway.log`.
pub struct ToyGateway {
    /// `https://127.0.0.1:<port>`.
    pub address: String,
    /// The CA bundle its certificate is verified against.
    pub ca_file: PathBuf,
    /// The directory of the role tokens.
    pub tokens: PathBuf,
    log: PathBuf,
    _child: Child,
}

impl ToyGateway {
    /// Starts it with more flags in `args` (`--offer`) and waits until it
    /// listens.
    pub async fn start(dir: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let tokens = dir.join("tokens");
        std::fs::create_dir_all(&tokens)?;
        for role in ["node", "service", "route", "admin"] {
            ccm_runtime::files::write_private(
                &tokens.join(format!("{role}.token")),
                format!("{role}-{}", uuid::Uuid::new_v4().simple()).as_bytes(),
            )?;
        }
        let pki = Pki::create(&dir.join("pki"), "toy gateway test CA")?;
        let serving = pki.serving("gateway", &["localhost", "127.0.0.1"])?;
        let port = crate::ports::free_port()?;
        let log = dir.join("toy-gateway.log");
        let mut child = Command::new(python())
            .arg(script())
            .args(self::args(&format!("127.0.0.1:{port}"), &tokens, &serving))
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {} {}", python(), script().display()))?;
        let text = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();
        match crate::gateway::until_listening(&mut child, port, Duration::from_secs(60)).await? {
            Started::Listening => Ok(Self {
                address: format!("https://127.0.0.1:{port}"),
                ca_file: pki.ca_file(),
                tokens,
                log,
                _child: child,
            }),
            Started::Exited(status) => anyhow::bail!(
                "the toy gateway exited ({status}); pip install -r tests/requirements.txt?\n{}",
                text(&log)
            ),
            Started::Silent => {
                anyhow::bail!("the toy gateway did not listen in 60 s:\n{}", text(&log))
            }
        }
    }

    /// Its log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
