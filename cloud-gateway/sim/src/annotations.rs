//! The Service annotations the simulated cloud understands. Each is parsed
//! strictly: an unknown key under the prefix or an unknown value is an
//! `INVALID_ARGUMENT` naming the annotation and the accepted values, never a
//! silent default.

use std::collections::HashMap;
use std::time::Duration;

use ccm_provider::{CloudError, quote};

/// The prefix of every sim annotation.
pub const PREFIX: &str = "sim.cloudgateway.io/";

/// `external` (default) or `internal`: internal load balancers get an
/// address from the internal pool.
pub const LOAD_BALANCER_TYPE: &str = "sim.cloudgateway.io/load-balancer-type";
/// `round-robin` (default), `least-connections` or `source-ip`.
pub const ALGORITHM: &str = "sim.cloudgateway.io/algorithm";
/// How often backends are health-checked: a duration from `1s` to `300s`;
/// default `10s`.
pub const HEALTH_CHECK_INTERVAL: &str = "sim.cloudgateway.io/health-check-interval";

const KNOWN: [&str; 3] = [LOAD_BALANCER_TYPE, ALGORITHM, HEALTH_CHECK_INTERVAL];
const ALGORITHMS: [&str; 3] = ["round-robin", "least-connections", "source-ip"];

/// The load balancer options read from a Service's annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbOptions {
    pub internal: bool,
    pub algorithm: String,
    pub health_check_interval: Duration,
}

fn field(key: &str) -> String {
    format!("spec.annotations[{key:?}]")
}

/// Reads and checks every sim annotation, reporting all problems at once.
pub fn parse(annotations: &HashMap<String, String>) -> Result<LbOptions, CloudError> {
    let mut problems = Vec::new();
    let mut options = LbOptions {
        internal: false,
        algorithm: "round-robin".into(),
        health_check_interval: Duration::from_secs(10),
    };
    let mut keys: Vec<_> = annotations
        .keys()
        .filter(|k| k.starts_with(PREFIX))
        .collect();
    keys.sort();
    for key in keys {
        let value = annotations[key].as_str();
        match key.as_str() {
            LOAD_BALANCER_TYPE => match value {
                "external" => options.internal = false,
                "internal" => options.internal = true,
                _ => problems.push((
                    field(key),
                    format!("{} is not accepted; use external or internal", quote(value)),
                )),
            },
            ALGORITHM => {
                if ALGORITHMS.contains(&value) {
                    options.algorithm = value.into();
                } else {
                    problems.push((
                        field(key),
                        format!(
                            "{} is not accepted; use {}",
                            quote(value),
                            ALGORITHMS.join(", ")
                        ),
                    ));
                }
            }
            HEALTH_CHECK_INTERVAL => match ccm_provider::parse_duration(value) {
                Ok(d) if (Duration::from_secs(1)..=Duration::from_secs(300)).contains(&d) => {
                    options.health_check_interval = d;
                }
                _ => problems.push((
                    field(key),
                    format!(
                        "{} is not accepted; use a duration from 1s to 300s, e.g. 10s",
                        quote(value)
                    ),
                )),
            },
            _ => problems.push((
                field(key),
                format!("unknown annotation; known: {}", KNOWN.join(", ")),
            )),
        }
    }
    CloudError::none_of(problems)?;
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_without_annotations_and_foreign_keys_are_ignored() {
        let options = parse(&annotations(&[("example.com/x", "y")])).unwrap();
        assert!(!options.internal);
        assert_eq!(options.algorithm, "round-robin");
        assert_eq!(options.health_check_interval, Duration::from_secs(10));
    }

    #[test]
    fn valid_values_are_taken() {
        let options = parse(&annotations(&[
            (LOAD_BALANCER_TYPE, "internal"),
            (ALGORITHM, "source-ip"),
            (HEALTH_CHECK_INTERVAL, "30s"),
        ]))
        .unwrap();
        assert!(options.internal);
        assert_eq!(options.algorithm, "source-ip");
        assert_eq!(options.health_check_interval, Duration::from_secs(30));
    }

    #[test]
    fn every_invalid_value_is_reported_with_accepted_values() {
        let err = parse(&annotations(&[
            (ALGORITHM, "random"),
            (HEALTH_CHECK_INTERVAL, "0s"),
            ("sim.cloudgateway.io/colour", "blue"),
        ]))
        .unwrap_err();
        let CloudError::InvalidArgument(problems) = err else {
            panic!("expected InvalidArgument");
        };
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems
                .iter()
                .any(|(f, p)| f.contains("algorithm") && p.contains("least-connections"))
        );
        assert!(
            problems
                .iter()
                .any(|(f, p)| f.contains("health-check") && p.contains("1s to 300s"))
        );
        assert!(
            problems
                .iter()
                .any(|(f, p)| f.contains("colour") && p.contains("known"))
        );
    }
}
