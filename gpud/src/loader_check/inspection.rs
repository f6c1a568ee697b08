//! What an inspection is bounded by, is for and fails with: the types the
//! analysis stages (manifest parsing, layer merging, classification) share,
//! kept below them so that none imports the one that drives it.

use std::{
    fmt,
    time::{Duration, Instant},
};

use super::source::SourceError;

/// Indexes followed below the target: an index may name an index once.
pub(super) const MAX_NESTING: usize = 2;

/// Limits of one inspection.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes read of a manifest, index or config blob.
    pub max_json: u64,
    /// Uncompressed tar bytes read over all layers.
    pub max_layer_bytes: u64,
    /// Tar entries kept in the merged tree.
    pub max_entries: usize,
    /// Bytes of names, link targets and other text the merged tree keeps.
    pub max_tree_bytes: u64,
    /// Bytes of a `libc.so.6`, which is read whole.
    pub max_libc: u64,
    /// When the inspection gives up.
    pub deadline: Instant,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_json: 4 << 20,
            max_layer_bytes: 16 << 30,
            max_entries: 2_000_000,
            // `max_entries` paths of 64 bytes, a typical site-packages
            // path: what a real image needs, while 2M links of 4 KiB
            // targets (8 GB, issue 38 F2) are refused.
            max_tree_bytes: 128 << 20,
            max_libc: 32 << 20,
            deadline: Instant::now() + Duration::from_secs(600),
        }
    }
}

/// The platform a manifest is chosen for (`image-index.md`, "platform").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    /// This machine: `linux` and the Go-style name of its architecture.
    #[must_use]
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "x86" => "386",
            "aarch64" => "arm64",
            "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
            "powerpc64" => "ppc64",
            "loongarch64" => "loong64",
            "mips64" if cfg!(target_endian = "little") => "mips64le",
            other => other,
        };
        Self {
            os: "linux".to_owned(),
            architecture: architecture.to_owned(),
            variant: None,
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A path of the image's command beyond a bound of the loader check
/// (`classify::command`): the image is refused before any path is walked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the container's {field} has {found} {unit}, above the loader check's bound of {limit} ({bound})"
)]
pub struct CommandBound {
    /// `argv[0]`, `WorkingDir`, `PATH` or `PATH entry`.
    pub field: &'static str,
    pub unit: &'static str,
    pub found: usize,
    /// The name of the bound's constant.
    pub bound: &'static str,
    pub limit: usize,
}

/// Why an image could not be inspected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("blob {digest} is not a valid index, manifest or config: {why}")]
    Malformed { digest: String, why: String },
    #[error("index {digest} has no manifest for {wanted}; it offers {offered:?}")]
    NoPlatform {
        digest: String,
        wanted: String,
        offered: Vec<String>,
    },
    #[error("layer {digest} has media type {media_type:?}, which the loader check cannot read")]
    UnsupportedLayer { digest: String, media_type: String },
    #[error("indexes nested deeper than {MAX_NESTING} levels at {digest}")]
    TooDeep { digest: String },
    #[error("the image exceeds the loader check's {limit} of {value}")]
    Limit { limit: &'static str, value: u64 },
    #[error("the loader check ran out of time {stage}")]
    OutOfTime { stage: &'static str },
    #[error(transparent)]
    Command(#[from] CommandBound),
    #[error(
        "layer {digest}: a tar {record} record at uncompressed byte {offset} declares {size} bytes, above the loader check's bound of {limit} ({bound}); refused before reading it"
    )]
    TarRecord {
        digest: String,
        record: &'static str,
        offset: u64,
        size: u64,
        limit: u64,
        bound: &'static str,
    },
    #[error("layer {digest} could not be read (at uncompressed byte {offset:?}): {why}")]
    Layer {
        digest: String,
        offset: Option<u64>,
        why: String,
    },
}

impl InspectError {
    /// Whether the image's content is what failed, so that inspecting it
    /// again would fail again (until the deadline's or a bound's reason
    /// changes): such failures are cached. The store's own failures (the
    /// image or a blob not there, containerd not answering) are not.
    #[must_use]
    pub fn lasting(&self) -> bool {
        !matches!(
            self,
            Self::Source(
                SourceError::NotPresent { .. }
                    | SourceError::NoRuntime { .. }
                    | SourceError::MissingBlob { .. }
                    | SourceError::Rpc { .. }
            )
        )
    }

    /// A short label for metrics.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Source(SourceError::NotPresent { .. }) => "not_present",
            Self::Source(SourceError::NoRuntime { .. }) => "no_runtime",
            Self::Source(SourceError::MissingBlob { .. }) => "missing_blob",
            Self::Source(SourceError::TooLarge { .. }) => "blob_too_large",
            Self::Source(SourceError::Rpc { .. }) => "runtime_rpc",
            Self::Malformed { .. } => "malformed",
            Self::NoPlatform { .. } => "no_platform",
            Self::UnsupportedLayer { .. } => "unsupported_layer",
            Self::TooDeep { .. } => "nested_too_deep",
            Self::Limit { .. } => "limit",
            Self::OutOfTime { .. } => "out_of_time",
            Self::Command(_) => "command_bound",
            Self::TarRecord { .. } => "tar_record",
            Self::Layer { .. } => "layer_read",
        }
    }
}
