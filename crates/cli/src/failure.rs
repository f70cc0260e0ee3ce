//! Why a command stops: every wrong setting, each named by its flag, so that `main` can say where
//! the value came from (the flag, or its environment variable) without reading the message.

use recovea_core::ConfigError;

/// What stopped a command: the wrong settings found (all of them, where they could be checked
/// together), or one error of another kind (a port taken, a database away).
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) Vec<ConfigError>);

impl From<ConfigError> for Failure {
    fn from(error: ConfigError) -> Self {
        Self(vec![error])
    }
}

impl From<Vec<ConfigError>> for Failure {
    fn from(errors: Vec<ConfigError>) -> Self {
        Self(errors)
    }
}

/// An error that is not a setting's.
impl From<String> for Failure {
    fn from(why: String) -> Self {
        Self(vec![ConfigError::general(why)])
    }
}

impl From<Failure> for Vec<ConfigError> {
    fn from(failure: Failure) -> Self {
        failure.0
    }
}

/// Every problem of a set of settings, kept to be reported together.
#[derive(Default)]
pub(crate) struct Problems(Vec<ConfigError>);

impl Problems {
    /// The value of `result`, or `None` with its problems noted.
    pub(crate) fn check<T, E: Into<Vec<ConfigError>>>(&mut self, result: Result<T, E>) -> Option<T> {
        result.map_err(|e| self.0.extend(e.into())).ok()
    }
}

impl From<Problems> for Failure {
    fn from(problems: Problems) -> Self {
        Failure(problems.0)
    }
}
