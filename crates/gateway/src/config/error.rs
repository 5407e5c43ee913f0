//! What is wrong with a configuration: each error names the file, the line and the key.

use std::fmt;

/// Where an error was found when the configuration comes from the environment alone.
pub const ENVIRONMENT: &str = "<environment>";

/// One thing wrong with a configuration, printed as `FILE:LINE: key: message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or [`ENVIRONMENT`]).
    pub file: String,
    /// Its line, from 1 (0 when there is no line: the environment, an unreadable file).
    pub line: usize,
    /// The key, dotted from the top of the file (`providers.openai.keys_env`), or the variable.
    pub key: String,
    /// What is wrong. Never holds a secret's value.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}: {}", self.file, self.key, self.message)
        } else {
            write!(
                f,
                "{}:{}: {}: {}",
                self.file, self.line, self.key, self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every error found in one configuration (at least one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The errors, in the order of the file.
    pub fn errors(&self) -> &[ConfigError] {
        &self.0
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Collects errors found in one source text, turning byte offsets into lines.
pub(crate) struct Errors<'a> {
    file: &'a str,
    source: &'a str,
    found: Vec<ConfigError>,
}

impl<'a> Errors<'a> {
    pub(crate) fn new(file: &'a str, source: &'a str) -> Self {
        Self {
            file,
            source,
            found: Vec::new(),
        }
    }

    /// Records `message` about `key`, found at byte `offset` of the source.
    pub(crate) fn at(&mut self, offset: usize, key: &str, message: impl Into<String>) {
        self.found.push(ConfigError {
            file: self.file.to_owned(),
            line: line_of(self.source, offset),
            key: key.to_owned(),
            message: message.into(),
        });
    }

    pub(crate) fn into_result<T>(mut self, value: T) -> Result<T, ConfigErrors> {
        if self.found.is_empty() {
            Ok(value)
        } else {
            self.found.sort_by_key(|error| error.line);
            Err(ConfigErrors(self.found))
        }
    }
}

/// The line (from 1) of byte `offset` in `source`.
pub(crate) fn line_of(source: &str, offset: usize) -> usize {
    let end = offset.min(source.len());
    source.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
