//! Which release a process is: the workspace's version and the commit it
//! was built from, so a half-done upgrade shows at a glance (`--version`,
//! `/debug/status`, the `build_info` metric, `kubectl ccm status`).

/// The release, as the workspace's `Cargo.toml` and the chart name it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the build comes from (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("CCM_GIT_COMMIT");

/// What `--version` prints after the program's name.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CCM_GIT_COMMIT"),
    ")"
);

/// `{"version": ..., "commit": ...}`, as `/debug/status` shows it.
pub fn json() -> serde_json::Value {
    serde_json::json!({"version": VERSION, "commit": COMMIT})
}

/// The `build_info` gauge's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// Registers `ccm_build_info{version, commit} 1`, as Kubernetes components
/// export theirs (`kubernetes_build_info`).
pub fn register(registry: &mut prometheus_client::registry::Registry) {
    let info: prometheus_client::metrics::family::Family<
        BuildLabels,
        prometheus_client::metrics::gauge::Gauge,
    > = Default::default();
    info.get_or_create(&BuildLabels {
        version: VERSION,
        commit: COMMIT,
    })
    .set(1);
    registry.register(
        "ccm_build_info",
        "The release and commit this process was built from",
        info,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metric_names_the_release_and_the_commit() {
        let mut registry = prometheus_client::registry::Registry::default();
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(&format!(
                "ccm_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1"
            )),
            "{text}"
        );
        assert_eq!(COMMIT.len(), 12, "built in a git checkout: {COMMIT}");
    }
}
