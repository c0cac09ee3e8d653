//! What a check ends with, and what the suite reports of it.

/// How a check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

/// One check's result.
#[derive(Clone, Debug)]
pub struct Checked {
    /// Short name, e.g. `lb.ensure-idempotent`.
    pub name: &'static str,
    /// The rule of the contract it tests.
    pub rule: &'static str,
    pub outcome: Outcome,
}

impl std::fmt::Display for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Outcome::Pass => write!(f, "PASS {} ({})", self.name, self.rule),
            Outcome::Fail(why) => write!(f, "FAIL {} ({}): {why}", self.name, self.rule),
            Outcome::Skip(why) => write!(f, "SKIP {} ({}): {why}", self.name, self.rule),
        }
    }
}

/// A check's failure, with what it saw.
pub(crate) fn fail(why: impl Into<String>) -> Result<Outcome, String> {
    Err(why.into())
}
