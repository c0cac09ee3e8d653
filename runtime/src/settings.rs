//! Checking settings: every binary takes its flags as strings (see
//! [`crate::cli`] for how a config file goes under them), then parses each
//! one here, collecting every problem in [`Problems`], so one run reports
//! all of them, not just the first.

use std::fmt;

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
                self.push(key, format!("{value:?}: {e}"));
                None
            }
        }
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

/// Parses a duration such as `250ms`, `10s` or `5m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime_like(s)
}

fn humantime_like(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| "needs a unit (ms, s, m or h)".to_owned())?;
    let (number, unit) = s.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| "is not a duration such as 250ms, 10s or 5m".to_owned())?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("unknown unit {unit:?}; use ms, s, m or h")),
    };
    std::time::Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())
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
