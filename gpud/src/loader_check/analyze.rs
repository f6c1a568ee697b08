//! The image analysis (placeholder until the analysis lands).

use std::time::{Duration, Instant};

use super::{Descriptor, Finding, ImageSource, SourceError};

/// Limits of one inspection.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_json: u64,
    pub max_layer_bytes: u64,
    pub max_entries: usize,
    pub max_libc: u64,
    pub deadline: Instant,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_json: 4 << 20,
            max_layer_bytes: 16 << 30,
            max_entries: 2_000_000,
            max_libc: 32 << 20,
            deadline: Instant::now() + Duration::from_secs(600),
        }
    }
}

/// The platform whose manifest is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    pub fn host() -> Self {
        Self {
            os: "linux".into(),
            architecture: "amd64".into(),
            variant: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("not written yet")]
    Unwritten,
}

impl InspectError {
    pub fn reason(&self) -> &'static str {
        "unwritten"
    }
}

/// # Errors
/// Always, for now.
pub fn inspect_target(
    _source: &mut dyn ImageSource,
    _target: &Descriptor,
    _platform: &Platform,
    _limits: &Limits,
) -> Result<Finding, InspectError> {
    Err(InspectError::Unwritten)
}
