//! A flag or annotation value outside the fixed set it must come from.

/// `value` is not one of what `what` accepts; shown as
/// "`what` is `expected`, not `value`".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} is {expected}, not {value:?}")]
pub(crate) struct InvalidChoice {
    /// The flag or annotation, e.g. `--sandbox`.
    pub(crate) what: &'static str,
    /// What it accepts, in words.
    pub(crate) expected: &'static str,
    /// What it was given.
    pub(crate) value: String,
}

impl InvalidChoice {
    pub(crate) fn new(what: &'static str, expected: &'static str, value: &str) -> Self {
        Self {
            what,
            expected,
            value: value.to_owned(),
        }
    }
}
