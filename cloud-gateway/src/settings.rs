//! The gateway's configuration: flags (each with an environment variable)
//! over an optional config file over defaults. Everything is checked before
//! start, and every problem is reported at once.

use std::net::SocketAddr;
use std::path::PathBuf;

use ccm_runtime::settings::{Problems, load, parse_duration};
use ccm_runtime::telemetry::{LogFormat, parse_filter};
use clap::Parser;
use ipnet::IpNet;
use serde::Deserialize;

use crate::auth::Tokens;
use crate::budget::BudgetConfig;
use crate::lookup::LookupConfig;
use crate::provider::sim::SimConfig;

/// The cloud gateway: the only component of the cloud controller manager
/// that talks to the cloud.
#[derive(Debug, Default, Parser)]
#[command(name = "cloud-gateway", version)]
pub struct Args {
    /// Config file, YAML or TOML (by extension); flags and environment win over it.
    #[arg(long, env = "CLOUD_GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address [default: 0.0.0.0:7400].
    #[arg(long, env = "CLOUD_GATEWAY_LISTEN")]
    pub listen: Option<String>,
    /// Admin HTTP address for /livez, /readyz and /metrics [default: 0.0.0.0:7401].
    #[arg(long, env = "CLOUD_GATEWAY_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// Directory for the simulated cloud's state and generated tokens [default: .cloud-gateway].
    #[arg(long, env = "CLOUD_GATEWAY_STATE_DIR")]
    pub state_dir: Option<String>,
    /// YAML file of bearer tokens and roles; without it, one token per role is generated into <state-dir>/tokens/.
    #[arg(long, env = "CLOUD_GATEWAY_TOKENS_FILE")]
    pub tokens_file: Option<String>,
    /// The cloud provider [default: sim].
    #[arg(long, env = "CLOUD_GATEWAY_PROVIDER")]
    pub provider: Option<String>,
    /// Log format: plain or json [default: plain].
    #[arg(long, env = "CLOUD_GATEWAY_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Log filter, e.g. info or info,cloud_gateway=debug; RUST_LOG wins [default: info].
    #[arg(long, env = "CLOUD_GATEWAY_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// PEM certificate for gRPC over TLS (with --tls-key).
    #[arg(long, env = "CLOUD_GATEWAY_TLS_CERT")]
    pub tls_cert: Option<String>,
    /// PEM private key for gRPC over TLS (with --tls-cert).
    #[arg(long, env = "CLOUD_GATEWAY_TLS_KEY")]
    pub tls_key: Option<String>,
    /// Cloud calls per second for the whole account [default: 20].
    #[arg(long, env = "CLOUD_GATEWAY_BUDGET_RATE")]
    pub budget_rate: Option<String>,
    /// Calls that may go at once after a quiet spell [default: 40].
    #[arg(long, env = "CLOUD_GATEWAY_BUDGET_BURST")]
    pub budget_burst: Option<String>,
    /// Longest wait for the budget before RESOURCE_EXHAUSTED [default: 10s].
    #[arg(long, env = "CLOUD_GATEWAY_BUDGET_MAX_WAIT")]
    pub budget_max_wait: Option<String>,
    /// How long instance lookups are cached; 0s disables the cache [default: 10s].
    #[arg(long, env = "CLOUD_GATEWAY_CACHE_TTL")]
    pub cache_ttl: Option<String>,
    /// How long single lookups are gathered into one batch; 0s sends at once [default: 5ms].
    #[arg(long, env = "CLOUD_GATEWAY_BATCH_WINDOW")]
    pub batch_window: Option<String>,
    /// Most nodes in one provider lookup call [default: 100].
    #[arg(long, env = "CLOUD_GATEWAY_MAX_BATCH")]
    pub max_batch: Option<String>,
    /// Share one provider answer among identical lookups in flight: true or false [default: true].
    #[arg(long, env = "CLOUD_GATEWAY_COALESCE")]
    pub coalesce: Option<String>,
    /// Comma-separated CIDRs the sim hands load balancer addresses out of [default: 203.0.113.0/24].
    #[arg(long, env = "CLOUD_GATEWAY_SIM_LB_POOL", value_delimiter = ',')]
    pub sim_lb_pool: Option<Vec<String>>,
}

/// The file and override layout; every leaf is read as a string and parsed
/// afterwards, so all problems can be listed together.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Raw {
    listen: String,
    admin_listen: String,
    state_dir: String,
    tokens_file: String,
    provider: String,
    log_format: String,
    log_level: String,
    tls_cert: String,
    tls_key: String,
    budget: RawBudget,
    lookups: RawLookups,
    sim: RawSim,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawBudget {
    rate: String,
    burst: String,
    max_wait: String,
    max_waiting: String,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawLookups {
    cache_ttl: String,
    batch_window: String,
    max_batch: String,
    coalesce: String,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawSim {
    region: String,
    zones: Vec<String>,
    default_instance_type: String,
    lb_pool: Vec<String>,
    internal_lb_pool: Vec<String>,
    node_network: String,
}

impl Default for Raw {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:7400".into(),
            admin_listen: "0.0.0.0:7401".into(),
            state_dir: ".cloud-gateway".into(),
            tokens_file: String::new(),
            provider: "sim".into(),
            log_format: "plain".into(),
            log_level: "info".into(),
            tls_cert: String::new(),
            tls_key: String::new(),
            budget: RawBudget::default(),
            lookups: RawLookups::default(),
            sim: RawSim::default(),
        }
    }
}

impl Default for RawBudget {
    fn default() -> Self {
        let d = BudgetConfig::default();
        Self {
            rate: d.rate.to_string(),
            burst: d.burst.to_string(),
            max_wait: format!("{}ms", d.max_wait.as_millis()),
            max_waiting: d.max_waiting.to_string(),
        }
    }
}

impl Default for RawLookups {
    fn default() -> Self {
        let d = LookupConfig::default();
        Self {
            cache_ttl: format!("{}ms", d.cache_ttl.as_millis()),
            batch_window: format!("{}ms", d.batch_window.as_millis()),
            max_batch: d.max_batch.to_string(),
            coalesce: d.coalesce.to_string(),
        }
    }
}

impl Default for RawSim {
    fn default() -> Self {
        let d = SimConfig::default();
        let nets = |v: &[IpNet]| v.iter().map(ToString::to_string).collect();
        Self {
            region: d.region,
            zones: d.zones,
            default_instance_type: d.default_instance_type,
            lb_pool: nets(&d.lb_pool),
            internal_lb_pool: nets(&d.internal_lb_pool),
            node_network: d.node_network.to_string(),
        }
    }
}

/// The one provider built in so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// The simulated cloud.
    Sim,
}

/// The checked configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub state_dir: PathBuf,
    /// Tokens from `--tokens-file`; `None` generates them.
    pub tokens: Option<Tokens>,
    pub provider: ProviderKind,
    pub log_format: LogFormat,
    pub log_level: String,
    /// `(certificate, key)` PEM files.
    pub tls: Option<(PathBuf, PathBuf)>,
    pub budget: BudgetConfig,
    pub lookups: LookupConfig,
    pub sim: SimConfig,
}

impl Settings {
    /// Defaults on loopback with free ports and generated tokens, for tests
    /// and the sandbox.
    pub fn local(state_dir: impl Into<PathBuf>) -> Self {
        let raw = Raw {
            listen: "127.0.0.1:0".into(),
            admin_listen: "127.0.0.1:0".into(),
            ..Raw::default()
        };
        let mut settings = check(raw).expect("the defaults are valid");
        settings.state_dir = state_dir.into();
        settings
    }

    /// Layers defaults, the config file and `args`, and checks the result.
    pub fn from_args(args: &Args) -> Result<Self, Problems> {
        let mut overrides: Vec<(&str, config::Value)> = Vec::new();
        let mut set = |key, value: &Option<String>| {
            if let Some(v) = value {
                overrides.push((key, v.clone().into()));
            }
        };
        set("listen", &args.listen);
        set("admin_listen", &args.admin_listen);
        set("state_dir", &args.state_dir);
        set("tokens_file", &args.tokens_file);
        set("provider", &args.provider);
        set("log_format", &args.log_format);
        set("log_level", &args.log_level);
        set("tls_cert", &args.tls_cert);
        set("tls_key", &args.tls_key);
        set("budget.rate", &args.budget_rate);
        set("budget.burst", &args.budget_burst);
        set("budget.max_wait", &args.budget_max_wait);
        set("lookups.cache_ttl", &args.cache_ttl);
        set("lookups.batch_window", &args.batch_window);
        set("lookups.max_batch", &args.max_batch);
        set("lookups.coalesce", &args.coalesce);
        if let Some(pool) = &args.sim_lb_pool {
            overrides.push(("sim.lb_pool", pool.clone().into()));
        }
        let raw: Raw = load(args.config.as_deref(), overrides)?;
        check(raw)
    }
}

fn positive<T: PartialOrd + Default + std::fmt::Display + std::str::FromStr>(
    s: &str,
) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    let v: T = s.trim().parse().map_err(|e: T::Err| e.to_string())?;
    if v > T::default() {
        Ok(v)
    } else {
        Err("must be greater than 0".into())
    }
}

fn cidrs(p: &mut Problems, key: &str, list: &[String]) -> Vec<IpNet> {
    list.iter()
        .enumerate()
        .filter_map(|(i, s)| p.parse(&format!("{key}[{i}]"), s, |s| s.trim().parse::<IpNet>()))
        .collect()
}

fn check(raw: Raw) -> Result<Settings, Problems> {
    let mut p = Problems::new();
    let listen = p.parse("listen", &raw.listen, str::parse::<SocketAddr>);
    let admin_listen = p.parse("admin_listen", &raw.admin_listen, str::parse::<SocketAddr>);
    if raw.state_dir.is_empty() {
        p.push("state_dir", "must not be empty");
    }
    let provider = p.parse("provider", &raw.provider, |s| match s {
        "sim" => Ok(ProviderKind::Sim),
        other => Err(format!("unknown provider {other:?}; available: sim")),
    });
    let log_format = p.parse("log_format", &raw.log_format, str::parse::<LogFormat>);
    p.parse("log_level", &raw.log_level, parse_filter);
    let tokens = if raw.tokens_file.is_empty() {
        None
    } else {
        match Tokens::from_file(raw.tokens_file.as_ref()) {
            Ok(tokens) => Some(tokens),
            Err(problems) => {
                for problem in problems {
                    p.push("tokens_file", problem);
                }
                None
            }
        }
    };
    let tls = match (raw.tls_cert.is_empty(), raw.tls_key.is_empty()) {
        (true, true) => None,
        (false, false) => {
            for (key, path) in [("tls_cert", &raw.tls_cert), ("tls_key", &raw.tls_key)] {
                if !std::path::Path::new(path).is_file() {
                    p.push(key, format!("{path}: no such file"));
                }
            }
            Some((PathBuf::from(&raw.tls_cert), PathBuf::from(&raw.tls_key)))
        }
        _ => {
            p.push("tls_cert", "tls_cert and tls_key go together");
            None
        }
    };
    let rate = p.parse("budget.rate", &raw.budget.rate, positive::<f64>);
    let burst = p.parse("budget.burst", &raw.budget.burst, |s| {
        positive::<f64>(s).and_then(|b| {
            if b >= 1.0 {
                Ok(b)
            } else {
                Err("must be at least 1".into())
            }
        })
    });
    let max_wait = p.parse("budget.max_wait", &raw.budget.max_wait, parse_duration);
    let max_waiting = p.parse(
        "budget.max_waiting",
        &raw.budget.max_waiting,
        positive::<usize>,
    );
    let cache_ttl = p.parse("lookups.cache_ttl", &raw.lookups.cache_ttl, parse_duration);
    let batch_window = p.parse("lookups.batch_window", &raw.lookups.batch_window, |s| {
        parse_duration(s).and_then(|d| {
            if d <= std::time::Duration::from_secs(1) {
                Ok(d)
            } else {
                Err("must be at most 1s".into())
            }
        })
    });
    let max_batch = p.parse("lookups.max_batch", &raw.lookups.max_batch, |s| {
        positive::<usize>(s).and_then(|n| {
            if n <= crate::grpc::validate::MAX_NODES {
                Ok(n)
            } else {
                Err("must be at most 1000".into())
            }
        })
    });
    let coalesce = p.parse("lookups.coalesce", &raw.lookups.coalesce, |s| {
        s.parse::<bool>().map_err(|_| "use true or false")
    });
    if raw.sim.zones.is_empty() || raw.sim.zones.iter().any(String::is_empty) {
        p.push("sim.zones", "needs at least one non-empty zone");
    }
    let lb_pool = cidrs(&mut p, "sim.lb_pool", &raw.sim.lb_pool);
    let internal_lb_pool = cidrs(&mut p, "sim.internal_lb_pool", &raw.sim.internal_lb_pool);
    if raw.sim.lb_pool.is_empty() {
        p.push("sim.lb_pool", "needs at least one CIDR");
    }
    let node_network = p.parse("sim.node_network", &raw.sim.node_network, |s| {
        s.parse::<IpNet>()
    });
    p.finish(|| Settings {
        listen: listen.expect("checked"),
        admin_listen: admin_listen.expect("checked"),
        state_dir: PathBuf::from(raw.state_dir),
        tokens,
        provider: provider.expect("checked"),
        log_format: log_format.expect("checked"),
        log_level: raw.log_level,
        tls,
        budget: BudgetConfig {
            rate: rate.expect("checked"),
            burst: burst.expect("checked"),
            max_wait: max_wait.expect("checked"),
            max_waiting: max_waiting.expect("checked"),
        },
        lookups: LookupConfig {
            cache_ttl: cache_ttl.expect("checked"),
            batch_window: batch_window.expect("checked"),
            max_batch: max_batch.expect("checked"),
            coalesce: coalesce.expect("checked"),
        },
        sim: SimConfig {
            region: raw.sim.region,
            zones: raw.sim.zones,
            default_instance_type: raw.sim.default_instance_type,
            lb_pool,
            internal_lb_pool,
            node_network: node_network.expect("checked"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(f: impl FnOnce(&mut Args)) -> Args {
        let mut a = Args::default();
        f(&mut a);
        a
    }

    #[test]
    fn defaults_are_valid() {
        let s = Settings::from_args(&Args::default()).unwrap();
        assert_eq!(s.listen, "0.0.0.0:7400".parse().unwrap());
        assert_eq!(s.budget, BudgetConfig::default());
        assert_eq!(s.lookups, LookupConfig::default());
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let problems = Settings::from_args(&args(|a| {
            a.listen = Some("nowhere".into());
            a.budget_rate = Some("-3".into());
            a.cache_ttl = Some("10 fortnights".into());
            a.coalesce = Some("maybe".into());
            a.provider = Some("cloudy".into());
            a.sim_lb_pool = Some(vec!["300.0.0.0/8".into()]);
        }))
        .unwrap_err();
        let keys: Vec<_> = problems
            .list()
            .iter()
            .map(|p| p.split(':').next().unwrap().to_owned())
            .collect();
        for key in [
            "listen",
            "provider",
            "budget.rate",
            "lookups.cache_ttl",
            "lookups.coalesce",
            "sim.lb_pool[0]",
        ] {
            assert!(
                keys.iter().any(|k| k == key),
                "{key} missing from {problems}"
            );
        }
    }

    #[test]
    fn file_settings_apply_under_flags_and_unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gateway.yaml");
        std::fs::write(
            &file,
            "listen: 127.0.0.1:9000\nbudget:\n  rate: 5\nsim:\n  zones: [z1]\n",
        )
        .unwrap();
        let s = Settings::from_args(&args(|a| {
            a.config = Some(file.clone());
            a.budget_rate = Some("7".into());
        }))
        .unwrap();
        assert_eq!(s.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(s.budget.rate, 7.0);
        assert_eq!(s.sim.zones, ["z1"]);

        std::fs::write(&file, "listn: 127.0.0.1:9000\n").unwrap();
        let problems = Settings::from_args(&args(|a| a.config = Some(file.clone()))).unwrap_err();
        assert!(problems.to_string().contains("listn"), "{problems}");
    }
}
