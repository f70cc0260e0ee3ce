//! A setting given wrong, named by its flag rather than by text: a caller that must say where the
//! value came from (a flag, or its environment variable) reads the flag, never parses the message.

use std::fmt;

/// A wrong setting: the long flag it was given by (without `--`; `None` when the problem is not one
/// flag's, as when two settings disagree), and why it is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub flag: Option<&'static str>,
    pub why: String,
}

impl ConfigError {
    /// `--flag`'s value is refused because `why`.
    pub fn flag(flag: &'static str, why: impl Into<String>) -> Self {
        Self { flag: Some(flag), why: why.into() }
    }

    /// A problem that is not one flag's alone.
    pub fn general(why: impl Into<String>) -> Self {
        Self { flag: None, why: why.into() }
    }

    /// The same problem, named by the flag that gives the same setting elsewhere: a certificate
    /// file read as `--upstream-ca-file` is `--oidc-ca-file` to the single sign-on.
    pub fn as_flag(self, from: &'static str, to: &'static str) -> Self {
        let flag = self.flag.map(|flag| if flag == from { to } else { flag });
        Self { flag, ..self }
    }

    /// A zero-duration or zero-count setting, which would disable what it bounds.
    pub fn zero(flag: &'static str) -> Self {
        Self::flag(flag, "must be greater than zero")
    }
}

/// Every problem of a set of settings, kept to be reported together: each setting is checked
/// even when an earlier one was wrong.
#[derive(Debug, Default)]
pub struct Problems(Vec<ConfigError>);

impl Problems {
    /// The value of `result`, or `None` with its problems noted.
    pub fn check<T, E: Into<Vec<ConfigError>>>(&mut self, result: Result<T, E>) -> Option<T> {
        result.map_err(|e| self.0.extend(e.into())).ok()
    }

    pub fn push(&mut self, problem: ConfigError) {
        self.0.push(problem);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Problems> for Vec<ConfigError> {
    fn from(problems: Problems) -> Self {
        problems.0
    }
}

/// `value` trimmed, refused when blank: a name or secret of blanks is a mistake, never a choice.
pub fn non_blank(flag: &'static str, value: &str) -> Result<String, ConfigError> {
    let value = value.trim();
    if value.is_empty() { Err(ConfigError::flag(flag, "must not be empty")) } else { Ok(value.to_owned()) }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.flag {
            Some(flag) => write!(f, "--{flag}: {}", self.why),
            None => f.write_str(&self.why),
        }
    }
}

impl std::error::Error for ConfigError {}

/// So that `?` lifts one problem into a list of them, where every wrong setting is reported at once.
impl From<ConfigError> for Vec<ConfigError> {
    fn from(error: ConfigError) -> Self {
        vec![error]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flags_problem_opens_with_the_flag() {
        assert_eq!(
            ConfigError::zero("upstream-timeout").to_string(),
            "--upstream-timeout: must be greater than zero"
        );
        assert_eq!(ConfigError::general("two settings disagree").to_string(), "two settings disagree");
    }

    #[test]
    fn renaming_touches_only_the_named_flag() {
        let ca = ConfigError::flag("upstream-ca-file", "no certificate");
        assert_eq!(ca.as_flag("upstream-ca-file", "oidc-ca-file").flag, Some("oidc-ca-file"));
        let other = ConfigError::zero("upstream-http2-connections");
        assert_eq!(other.clone().as_flag("upstream-ca-file", "oidc-ca-file"), other);
    }
}
