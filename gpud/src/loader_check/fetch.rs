//! The loader check's containerd client in a process of its own (issue 38):
//! `amd-gpud-loader-check loader-fetch`, one per inspection.
//!
//! amd-gpud itself runs no containerd client and no image parser, so that
//! neither their code nor their buffers are in the daemon's resident set
//! (docs/benchmarks.md, "amd-gpud at rest"). For each inspection it starts
//! the fetcher ([`spawn::ForkedInspect`]), a root process like itself that
//! only reads containerd's content store:
//!
//! 1. amd-gpud writes the [`FetchJob`] as one JSON line on its stdin;
//! 2. the fetcher resolves the image's tag in containerd and answers
//!    [`Step::Target`] with the digest it points at: amd-gpud keys its
//!    cache by that digest, which no parser of a tenant's bytes produced;
//! 3. amd-gpud answers [`GO`] (not cached) or closes the fetcher's stdin
//!    (cached: it exits);
//! 4. the fetcher starts the unprivileged inspector child
//!    ([`super::sandbox`]), streams it the blobs it asks for, and reports
//!    its [`Step::Verdict`], or [`Step::InspectorFailed`] when it gave none.
//!
//! Every line either way is bounded ([`wire::MAX_JOB`], [`MAX_STEP_LINE`]);
//! amd-gpud kills the fetcher [`FETCH_GRACE`] after the inspector's own
//! kill, and the fetcher dies with amd-gpud, the inspector with the fetcher
//! (their parent-death signals).

pub(crate) mod process;
pub(crate) mod spawn;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{
    run::RunSpec,
    sandbox::wire::{self, Verdict, WireDescriptor},
};

/// The hidden subcommand of the helper binary that fetches.
pub const FETCH_SUBCOMMAND: &str = "loader-fetch";

/// The line amd-gpud sends after [`Step::Target`] when the image is to be
/// inspected.
pub(crate) const GO: &str = "inspect";

/// The longest line amd-gpud reads from the fetcher: the inspector's
/// verdict line (at most [`wire::MAX_LINE`]) wrapped in a [`Step`].
pub(crate) const MAX_STEP_LINE: usize = wire::MAX_LINE + 512;

/// How long after the inspector's kill amd-gpud kills its fetcher.
pub(crate) const FETCH_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// One inspection, as amd-gpud hands it to the fetcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FetchJob {
    /// The normalised reference (`docker.io/library/debian:12`).
    pub image: String,
    pub run: RunSpec,
    /// Milliseconds until the inspection's deadline.
    pub budget_ms: u64,
    pub containerd_socket: PathBuf,
    pub containerd_namespace: String,
    /// Each call to containerd (and each chunk of a layer).
    pub call_timeout_ms: u64,
    /// The inspector child's UID and GID (when the fetcher is root).
    pub inspector_uid: u32,
    pub inspector_gid: u32,
    /// Bytes of heap the inspector child may use.
    pub inspector_memory: u64,
    /// How long after the deadline the inspector child is killed.
    pub inspector_grace_ms: u64,
}

/// What the fetcher tells amd-gpud, one line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub(crate) enum Step {
    /// The descriptor the image's tag points at in containerd.
    Target { target: WireDescriptor },
    /// The inspector's verdict; before a [`Step::Target`], why the image
    /// could not even be looked up (not present, no containerd).
    Verdict { verdict: Verdict },
    /// The inspector gave no verdict: `why` (it died, was killed at the
    /// deadline, broke the protocol); `started`: whether it ran at all
    /// (a child that could not be started says nothing of the image).
    InspectorFailed { why: String, started: bool },
}

impl Step {
    /// `why`, cut to what one line may carry.
    pub(crate) fn inspector_failed(why: &str, started: bool) -> Self {
        Self::InspectorFailed {
            why: wire::cut(why.to_owned()),
            started,
        }
    }
}

#[cfg(test)]
mod tests;
