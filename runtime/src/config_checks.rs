//! Checking settings: every binary takes its flags as strings (see
//! [`crate::layered_config`] for how a config file goes under them), then
//! parses each one here, collecting every problem in [`Problems`], so one
//! run reports all of them, not just the first.

use std::fmt;

pub use ccm_values::{parse_duration, quote};

/// Every problem found in a configuration, reported together.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Problems(Vec<String>);

impl Problems {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// A list of one.
    pub fn one(problem: impl Into<String>) -> Self {
        Self(vec![problem.into()])
    }

    /// Adds a problem with the setting `key`.
    pub fn push(&mut self, key: &str, problem: impl fmt::Display) {
        self.0.push(format!("{key}: {problem}"));
    }

    /// Parses `value` for `key` with `parse`, recording a problem and
    /// returning `None` when it fails.
    pub fn parse<T, E: fmt::Display>(
        &mut self,
        key: &str,
        value: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Option<T> {
        match parse(value) {
            Ok(v) => Some(v),
            Err(e) => {
                self.push(key, format!("{}: {e}", quote(value)));
                None
            }
        }
    }

    /// Adds every problem of `other`.
    pub fn extend(&mut self, other: Problems) {
        self.0.extend(other.0);
    }

    /// Whether no problem was found.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The problems found.
    pub fn list(&self) -> &[String] {
        &self.0
    }

    /// `Ok(value)` if no problem was found, else the problems.
    pub fn finish<T>(self, value: impl FnOnce() -> T) -> Result<T, Problems> {
        if self.0.is_empty() {
            Ok(value())
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problems):", self.0.len())?;
        for problem in &self.0 {
            writeln!(f, "  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// Checks that `path` names a readable regular file: the problem says
/// whether it is missing or a directory.
pub fn check_file(path: &str) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) if m.is_dir() => Err(format!("{path}: is a directory, not a file")),
        Ok(_) => Err(format!("{path}: is not a regular file")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!("{path}: no such file")),
        Err(e) => Err(format!("{path}: {e}")),
    }
}

/// A duration from `min` to `max`, both included.
pub fn duration_within(
    min: std::time::Duration,
    max: std::time::Duration,
) -> impl Fn(&str) -> Result<std::time::Duration, String> {
    move |s| {
        let d = parse_duration(s)?;
        if (min..=max).contains(&d) {
            Ok(d)
        } else {
            Err(format!("must be from {min:?} to {max:?}"))
        }
    }
}

/// A whole number from `min` to `max`, both included.
pub fn number_within<T>(
    min: T,
    max: T,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + PartialOrd + fmt::Display + Copy + Send + Sync + 'static,
{
    move |s| {
        let v: T = s
            .trim()
            .parse()
            .map_err(|_| format!("is not a number from {min} to {max}"))?;
        if v >= min && v <= max {
            Ok(v)
        } else {
            Err(format!("must be from {min} to {max}"))
        }
    }
}

/// A size in bytes such as `65536`, `64KiB`, `256MiB` or `1GiB`, from
/// `min` to `max`.
pub fn bytes_within(min: u64, max: u64) -> impl Fn(&str) -> Result<u64, String> {
    move |s| {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let number: u64 = number
            .parse()
            .map_err(|_| "is not a size such as 65536, 64KiB or 16MiB".to_owned())?;
        let scale: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            other => return Err(format!("unknown unit {other:?}; use KiB, MiB or GiB")),
        };
        let v = number
            .checked_mul(scale)
            .ok_or_else(|| "is too large".to_owned())?;
        if (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(format!("must be from {min} to {max} bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_parse_with_units_and_reject_the_rest() {
        let cases = [
            ("250ms", Some(Duration::from_millis(250))),
            ("10s", Some(Duration::from_secs(10))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("5m", Some(Duration::from_secs(300))),
            ("2h", Some(Duration::from_secs(7200))),
            ("10", None),
            ("s", None),
            ("10 parsecs", None),
            ("-1s", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration(input).ok(), want, "{input}");
        }
    }

    #[test]
    fn bounded_values_name_their_range() {
        let d = duration_within(Duration::from_millis(1), Duration::from_secs(60));
        assert_eq!(d("10s"), Ok(Duration::from_secs(10)));
        assert!(d("0s").unwrap_err().contains("from 1ms to 60s"));
        let n = number_within(1u32, 1000);
        assert_eq!(n("32"), Ok(32));
        assert!(n("4294967296").is_err() && n("0").is_err() && n("x").is_err());
        let b = bytes_within(1024, 1 << 30);
        assert_eq!(b("64KiB"), Ok(65536));
        assert_eq!(b("2048"), Ok(2048));
        assert!(b("2GiB").is_err() && b("1").is_err() && b("5 parsecs").is_err());
    }

    #[test]
    fn problems_are_all_listed() {
        let mut problems = Problems::new();
        let a: Option<u32> = problems.parse("a", "x", str::parse);
        let b: Option<u32> = problems.parse("b", "7", str::parse);
        problems.push("c", "is wrong");
        assert_eq!((a, b), (None, Some(7)));
        let text = problems.to_string();
        assert!(text.contains("2 problems"), "{text}");
        assert!(
            text.contains("a: \"x\"") && text.contains("c: is wrong"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod quote_tests {
    use super::*;

    #[test]
    fn long_values_are_cut_with_their_length_named() {
        assert_eq!(quote("short"), "\"short\"");
        let long = "é".repeat(100);
        let quoted = quote(&long);
        assert!(quoted.len() < 70, "{quoted}");
        assert!(quoted.ends_with("(200 bytes)"), "{quoted}");
    }
}
