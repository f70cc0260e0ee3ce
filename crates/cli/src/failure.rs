//! Why a command stops: every wrong setting, each named by its flag, so that `main` can say where
//! the value came from (the flag, or its environment variable) without reading the message.

use recovea_core::ConfigError;
pub(crate) use recovea_core::config_error::Problems;

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

impl From<Problems> for Failure {
    fn from(problems: Problems) -> Self {
        Failure(problems.into())
    }
}
