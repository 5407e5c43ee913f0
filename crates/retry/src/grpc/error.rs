//! [`ServiceConfigError`]: what is wrong with a service config, and where.

use std::fmt;

/// A service config that cannot be used: the JSON path of the field at fault
/// (`methodConfig[0].retryPolicy.maxAttempts`) and what is wrong with it (`must be at least 2`).
/// Its `Display` is both: `methodConfig[0].retryPolicy.maxAttempts: must be at least 2`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceConfigError {
    path: String,
    problem: String,
}

impl ServiceConfigError {
    pub(crate) fn new(path: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            problem: problem.into(),
        }
    }

    /// The JSON path of the field at fault (empty for the document itself, when it is not
    /// JSON or not an object).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ServiceConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path.is_empty() {
            true => write!(f, "service config: {}", self.problem),
            false => write!(f, "{}: {}", self.path, self.problem),
        }
    }
}

impl std::error::Error for ServiceConfigError {}
