//! Command lines with a config file under them. `--config FILE` (YAML or
//! TOML) holds settings named as the flags are (`cluster-name: prod` or
//! `cluster_name: prod`). A setting from the file applies only where
//! neither the command line nor the environment set one, so the order of
//! precedence is file < environment < flags. Unknown keys are errors.

use std::collections::HashMap;
use std::ffi::OsString;

use clap::Parser;
use clap::parser::ValueSource;

use crate::config_checks::Problems;

/// The flag naming the config file.
const CONFIG: &str = "config";

fn file_value(value: config::Value) -> Result<String, String> {
    match value.kind {
        config::ValueKind::Array(items) => items
            .into_iter()
            .map(|v| v.into_string().map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.join(",")),
        _ => value.into_string().map_err(|e| e.to_string()),
    }
}

/// Parses `T` from `args`, with the file named by its `--config` flag
/// (if `T` has one) layered under environment and flags. Clap handles
/// `--help`, `--version` and malformed command lines itself.
pub fn parse_from<T: Parser>(args: Vec<OsString>) -> Result<T, Problems> {
    let (parsed, problems) = parse_layered(args)?;
    problems.finish(|| parsed)
}

/// Parses `T` as [`parse_from`] and checks it with `resolve`; the problems
/// of the file's entries and those `resolve` finds are reported together,
/// so one run names every wrong value wherever it was set.
pub fn resolve_from<T: Parser, S>(
    args: Vec<OsString>,
    resolve: impl FnOnce(&T) -> Result<S, Problems>,
) -> Result<S, Problems> {
    let (parsed, mut problems) = parse_layered(args)?;
    match resolve(&parsed) {
        Ok(settings) => problems.finish(|| settings),
        Err(more) => {
            problems.extend(more);
            Err(problems)
        }
    }
}

/// [`parse_from`], returning the problems of single file entries beside
/// the parsed flags instead of failing on them; such entries are left out.
fn parse_layered<T: Parser>(args: Vec<OsString>) -> Result<(T, Problems), Problems> {
    let command = T::command();
    let matches = command.clone().get_matches_from(args.clone());
    let file = matches
        .try_get_one::<String>(CONFIG)
        .ok()
        .flatten()
        .cloned()
        .or_else(|| {
            matches
                .try_get_one::<std::path::PathBuf>(CONFIG)
                .ok()
                .flatten()
                .map(|p| p.display().to_string())
        });
    let Some(file) = file else {
        return T::from_arg_matches(&matches)
            .map(|t| (t, Problems::new()))
            .map_err(|e| Problems::one(e.to_string()));
    };
    if let Err(problem) = crate::config_checks::check_file(&file) {
        return Err(Problems::one(format!("config: {problem}")));
    }
    let entries: HashMap<String, config::Value> = config::Config::builder()
        .add_source(config::File::with_name(&file))
        .build()
        .and_then(|c| c.try_deserialize())
        .map_err(|e| Problems::one(format!("config file {file}: {e}")))?;
    let mut problems = Problems::new();
    let mut extra = Vec::new();
    let mut keys: Vec<_> = entries.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    for (key, value) in keys {
        let flag = key.replace('_', "-");
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()) && flag != CONFIG)
        else {
            problems.push(
                &format!("config file {file}"),
                format!("unknown setting {key:?}"),
            );
            continue;
        };
        let value = match file_value(value) {
            Ok(v) => v,
            Err(e) => {
                problems.push(&format!("config file {file}: {key}"), e);
                continue;
            }
        };
        if matches.value_source(arg.get_id().as_str()) == Some(ValueSource::DefaultValue)
            || matches.value_source(arg.get_id().as_str()).is_none()
        {
            extra.push(OsString::from(format!("--{flag}={value}")));
        }
    }
    let mut layered = vec![args.first().cloned().unwrap_or_default()];
    layered.extend(extra);
    layered.extend(args.into_iter().skip(1));
    let matches = command
        .try_get_matches_from(layered)
        .map_err(|e| Problems::one(e.to_string()))?;
    T::from_arg_matches(&matches)
        .map(|t| (t, problems))
        .map_err(|e| Problems::one(e.to_string()))
}

/// [`parse_from`] on the process's own arguments.
pub fn parse<T: Parser>() -> Result<T, Problems> {
    parse_from(std::env::args_os().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser, Debug)]
    struct Args {
        #[arg(long)]
        config: Option<String>,
        #[arg(long, default_value = "kubernetes")]
        cluster_name: String,
        #[arg(long, default_value = "5s")]
        period: String,
        #[arg(long, default_value = "1")]
        workers: String,
    }

    fn argv(args: &[&str]) -> Vec<OsString> {
        std::iter::once("bin")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn file_settings_apply_under_flags() {
        let dir = std::env::temp_dir().join(format!("ccm-layered-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.yaml");
        std::fs::write(&file, "cluster-name: prod\nperiod: 10s\nworkers: 8\n").unwrap();
        let path = file.to_str().unwrap();
        let args: Args = parse_from(argv(&["--config", path, "--period", "1m"])).unwrap();
        assert_eq!(args.cluster_name, "prod");
        assert_eq!(args.period, "1m", "the flag wins");
        assert_eq!(args.workers, "8", "numbers in the file are fine");

        std::fs::write(&file, "clustr-name: prod\n").unwrap();
        let err = parse_from::<Args>(argv(&["--config", path])).unwrap_err();
        assert!(err.to_string().contains("clustr-name"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn every_wrong_value_in_a_file_is_reported_with_the_others() {
        let dir = tempfile_dir("wrong");
        let file = dir.join("c.yaml");
        std::fs::write(
            &file,
            "cluster-name: {a: 1}\nperiod: [1, {b: 2}]\nworkers: many\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let err = resolve_from::<Args, ()>(argv(&["--config", path]), |args| {
            let mut p = Problems::new();
            p.parse("workers", &args.workers, str::parse::<u32>);
            p.finish(|| ())
        })
        .unwrap_err();
        let text = err.to_string();
        for key in ["cluster-name", "period", "workers"] {
            assert!(text.contains(key), "{key} missing: {text}");
        }
        let err = parse_from::<Args>(argv(&["--config", dir.to_str().unwrap()])).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ccm-layered-config-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn without_a_file_flags_and_defaults_apply() {
        let args: Args = parse_from(argv(&["--workers", "3"])).unwrap();
        assert_eq!(
            (args.cluster_name.as_str(), args.workers.as_str()),
            ("kubernetes", "3")
        );
    }
}
