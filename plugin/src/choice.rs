//! A flag or annotation value outside the fixed set it must come from, and
//! the compute partition modes such values name (a leaf module: the flags
//! and the annotation followers both read it).

use ipc::ComputeMode;

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

/// What a compute partition value may be, in words.
pub(crate) const COMPUTE_MODES: &str =
    "a compute partition mode: SPX, DPX, TPX, QPX or CPX, in any case";

/// `text` as a compute partition mode this build knows, or why not (`what`
/// names the source).
///
/// # Errors
/// When `text` names no mode.
pub(crate) fn compute_mode(what: &'static str, text: &str) -> Result<ComputeMode, InvalidChoice> {
    match ComputeMode::from_wire(text.trim()) {
        ComputeMode::Other(_) => Err(InvalidChoice::new(what, COMPUTE_MODES, text)),
        mode => Ok(mode),
    }
}

/// `--compute-partition`'s value parser.
///
/// # Errors
/// When the flag names no mode.
pub(crate) fn compute_partition_flag(text: &str) -> Result<ComputeMode, InvalidChoice> {
    compute_mode("--compute-partition (COMPUTE_PARTITION)", text)
}
