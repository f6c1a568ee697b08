//! "Can this CRIU checkpoint be restored on these GPUs of this node?"
//!
//! Reads the amdgpu plugin's `amdgpu-kfd-<id>.img` ([`image`]) as CRIU
//! reads it (the header's entry count, an entry with CPU cores as a CPU's),
//! builds this node's topology as the restoring task would see it
//! ([`local`]: nodes and links in directory-listing order), and answers in
//! one of two modes:
//!
//! * [`Mode::Criu`]: what CRIU 3.17.1's amdgpu plugin does, replayed list
//!   operation by list operation ([`criu`]). CRIU's GPU search is a
//!   backtracking walk that is *not* exhaustive: candidates it tried go back
//!   at the head of their list while the walk goes on from an entry it read
//!   before, so it can miss a mapping, go round for ever, or follow a
//!   poisoned pointer. The outcome is one of restorable, refused (with
//!   CRIU's log line), CRIU would not finish, CRIU would crash.
//! * [`Mode::Explain`]: whether any mapping satisfies the same rules, found
//!   by an exhaustive search ([`explain`]), with the mapping or the GPU,
//!   property, values and option behind a refusal, CRIU's own outcome
//!   beside it, and the mapping CRIU's search misses when there is one.
//!
//! Transport-neutral: `amd-gpud restore-check` and the D-Bus method
//! `RestoreCheck` are thin adapters over [`check`].

mod answers;
mod bipartite;
pub mod criu;
pub mod explain;
pub mod image;
pub mod local;
pub mod model;
pub mod options;
pub mod pairing;
pub mod props;
pub mod verdict;

/// Messages generated from `gpud/proto/*.proto`.
pub mod proto {
    /// The newest schema (after CRIU v4.2), every scalar optional: reads all versions.
    pub mod current {
        include!(concat!(env!("OUT_DIR"), "/criu_amdgpu.rs"));
    }
    /// The schema of CRIU v3.17.1 to v3.19 (old message names, no BO handle).
    pub mod v3_17 {
        include!(concat!(env!("OUT_DIR"), "/criu_amdgpu_v3_17.rs"));
    }
}

use std::{fmt, str::FromStr};

use serde::Serialize;

use self::pairing::Pairing;
pub use self::{
    criu::SearchTooLarge,
    image::{EntryReading, ImageError, ImageFormat, KfdImage},
    local::{LocalError, LocalTopology},
    options::{Options, OptionsError},
    verdict::{Outcome, Verdict},
};
use crate::hostpaths::HostPaths;

/// Which question to answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// CRIU's outcome, as its own search reaches it.
    Criu,
    /// Whether a mapping exists, and what fails if not.
    #[default]
    Explain,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Criu => "criu",
            Self::Explain => "explain",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode name that is neither `criu` nor `explain`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode {0:?} (expected criu or explain)")]
pub struct ModeError(pub String);

impl FromStr for Mode {
    type Err = ModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "criu" => Ok(Self::Criu),
            "explain" | "" => Ok(Self::Explain),
            other => Err(ModeError(other.to_owned())),
        }
    }
}

/// What to check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub mode: Mode,
    /// The local GPUs the restored container will see (gpu_id, renderD<N>
    /// or PCI address); empty: all of them.
    pub gpus: Vec<String>,
    pub options: Options,
}

/// Why no verdict could be given.
#[derive(Debug, thiserror::Error)]
pub enum RestoreCheckError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Local(#[from] LocalError),
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error(transparent)]
    Mode(#[from] ModeError),
    #[error("{0}; the topologies are too irregular to check")]
    TooLarge(#[from] SearchTooLarge),
}

impl RestoreCheckError {
    /// Whether the caller's input is at fault (image, GPU list, option).
    pub fn is_invalid_input(&self) -> bool {
        !matches!(
            self,
            Self::Local(LocalError::Topology(_)) | Self::TooLarge(_)
        )
    }
}

/// Checks `image` against the KFD topology under `paths`.
///
/// # Errors
/// When the topology cannot be read, or as [`check`].
pub fn check_host(
    paths: &HostPaths,
    image: &KfdImage,
    request: &Request,
) -> Result<Verdict, RestoreCheckError> {
    let local = local::read(paths).map_err(LocalError::from)?;
    check(image, &local, request)
}

/// Checks `image` against `local` as `request` asks.
///
/// # Errors
/// An unknown GPU in `request.gpus`, or a search too large to finish.
#[tracing::instrument(skip_all, fields(mode = %request.mode, checkpoint = %image.source))]
pub fn check(
    image: &KfdImage,
    local: &LocalTopology,
    request: &Request,
) -> Result<Verdict, RestoreCheckError> {
    let visible = local.visible(&request.gpus)?;
    let mut notes = request.options.notes.clone();
    notes.extend(local.notes.iter().cloned());
    let (src, before) = criu_view(image, &mut notes);
    let pairing = Pairing::new(&src, &visible, &request.options);
    let answer = match request.mode {
        Mode::Criu => {
            let run = match before {
                Some(run) => run,
                None => criu::run(&pairing, &mut notes)?,
            };
            answers::criu(&pairing, run, &mut notes)?
        }
        Mode::Explain => {
            let run = match before {
                Some(run) => Ok(run),
                None => criu::run(&pairing, &mut notes),
            };
            answers::explain(&pairing, run, &mut notes)?
        }
    };
    tracing::debug!(outcome = answer.outcome.as_str(), "restore check done");
    Ok(Verdict {
        restorable: answer.outcome == Outcome::Restorable,
        outcome: answer.outcome,
        criu_version: criu::CRIU_VERSION,
        mode: request.mode,
        reason: answer.reason,
        mapping: verdict::mapping(&pairing, &answer.pairs),
        refusals: answer
            .diagnoses
            .iter()
            .map(|d| verdict::refusal(&pairing, d))
            .collect(),
        criu_restorable: answer.criu.map(|o| o == Outcome::Restorable),
        criu_outcome: answer.criu,
        options: request.options.clone(),
        checkpoint: verdict::CheckpointSummary {
            source: image.source.clone(),
            pid: image.pid,
            format: image.format,
            gpus: pairing.src_len(),
        },
        local_gpus: pairing.dst_len(),
        notes,
    })
}

/// The checkpoint nodes as CRIU reads them from the image, and CRIU's end
/// when it stops before matching.
fn criu_view(image: &KfdImage, notes: &mut Vec<String>) -> (model::Topo, Option<criu::Run>) {
    for node in &image.gpus_read_as_cpus {
        notes.push(format!(
            "checkpoint node {node} has a gpu_id and CPU cores: CRIU reads it as a CPU's \
             entry, with every GPU value zero"
        ));
    }
    if image.trailing_bytes > 0 {
        notes.push(format!(
            "{} bytes follow the message the image header announces: CRIU reads the \
             announced length and never looks at them",
            image.trailing_bytes
        ));
    }
    match image.format {
        ImageFormat::V3_17ToV4_2 => notes.push(
            "CRIU after 4.2 cannot read this image: its kfd_bo_entry requires a handle, \
             which CRIU 3.17 to 4.2 do not write"
                .to_owned(),
        ),
        ImageFormat::AfterV4_2 => notes.push(
            "this image was written by CRIU after 4.2; its restore needs that CRIU, \
             whose GPU matching is the one replayed here"
                .to_owned(),
        ),
        ImageFormat::Any => {}
    }
    let total = image.topo.nodes.len();
    match image.entry_reading() {
        EntryReading::First(n) => {
            if n < total {
                notes.push(format!(
                    "the image header counts {n} GPUs and CPUs and {total} device entries \
                     follow: CRIU reads the first {n}"
                ));
            }
            let nodes = image.topo.nodes.iter().take(n).cloned().collect();
            (model::Topo { nodes }, None)
        }
        EntryReading::PastEnd { announced, present } => {
            let cause = criu::CrashCause::Entries {
                announced: u64::from(announced),
                present,
            };
            (image.topo.clone(), Some(criu::Run::Crash(cause)))
        }
        EntryReading::NoCount => (
            image.topo.clone(),
            Some(criu::Run::Refused(criu::Stop::Unreadable)),
        ),
    }
}

#[cfg(test)]
mod tests;
