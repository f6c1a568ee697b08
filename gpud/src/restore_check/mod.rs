//! "Can this CRIU checkpoint be restored on these GPUs of this node?"
//!
//! Reads the amdgpu plugin's `amdgpu-kfd-<id>.img` ([`image`]), builds this
//! node's topology as the restoring task would see it ([`local`]), and
//! answers in one of two modes:
//!
//! * [`Mode::Criu`]: what CRIU's amdgpu plugin would answer, its search order
//!   and its hive bookkeeping quirk included ([`criu`]);
//! * [`Mode::Explain`]: whether any mapping satisfies the same rules, with
//!   the mapping found or the GPU, property, values and option behind a
//!   refusal ([`explain`]).
//!
//! Transport-neutral: `amd-gpud restore-check` and the D-Bus method
//! `RestoreCheck` are thin adapters over [`check`].

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

pub use self::{
    criu::SearchTooLarge,
    image::{ImageError, ImageFormat, KfdImage},
    local::{LocalError, LocalTopology},
    options::{Check, Options, OptionsError},
    verdict::Verdict,
};
use self::{criu::Stop, explain::Diagnosis, pairing::Pairing};
use crate::hostpaths::HostPaths;

/// Which question to answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// CRIU's answer, quirk included.
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
    let pairing = Pairing::new(&image.topo, &visible, &request.options);
    let mut notes = request.options.notes.clone();
    notes.extend(local.notes.iter().cloned());
    let (restorable, reason, pairs, diagnoses, criu_restorable) = match request.mode {
        Mode::Criu => criu_answer(&pairing, &mut notes)?,
        Mode::Explain => explain_answer(&pairing, &mut notes)?,
    };
    tracing::debug!(restorable, "restore check done");
    Ok(Verdict {
        restorable,
        mode: request.mode,
        reason,
        mapping: verdict::mapping(&pairing, &pairs),
        refusals: diagnoses
            .iter()
            .map(|d| verdict::refusal(&pairing, d))
            .collect(),
        criu_restorable,
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

type Answer = (
    bool,
    Option<String>,
    Vec<(usize, usize)>,
    Vec<Diagnosis>,
    Option<bool>,
);

fn criu_answer(pairing: &Pairing<'_>, notes: &mut Vec<String>) -> Result<Answer, SearchTooLarge> {
    match criu::run(pairing)? {
        Ok(pairs) => Ok((true, None, pairs, Vec::new(), None)),
        Err(stop) => {
            let diagnoses = match explain::search(pairing) {
                Ok(None) => explain::diagnose(pairing)?,
                Ok(Some(_)) => {
                    notes.push(quirk_note(&stop));
                    vec![order_refusal(pairing, &stop)]
                }
                Err(too_large) => {
                    notes.push(format!("no detailed reason: {too_large}"));
                    Vec::new()
                }
            };
            Ok((false, Some(stop.message()), Vec::new(), diagnoses, None))
        }
    }
}

fn explain_answer(
    pairing: &Pairing<'_>,
    notes: &mut Vec<String>,
) -> Result<Answer, SearchTooLarge> {
    let criu = match criu::run(pairing) {
        Ok(result) => Some(result),
        Err(too_large) => {
            notes.push(format!("CRIU's own answer not reproduced: {too_large}"));
            None
        }
    };
    let criu_ok = criu.as_ref().map(Result::is_ok);
    match explain::search(pairing)? {
        Some(pairs) => {
            if let Some(Err(stop)) = &criu {
                notes.push(quirk_note(stop));
            }
            Ok((true, None, pairs, Vec::new(), criu_ok))
        }
        None => {
            let diagnoses = explain::diagnose(pairing)?;
            let reason = diagnoses
                .first()
                .map_or("no mapping satisfies CRIU's checks", |d| {
                    summary(d.failure.property)
                });
            Ok((
                false,
                Some(reason.to_owned()),
                Vec::new(),
                diagnoses,
                criu_ok,
            ))
        }
    }
}

fn summary(property: &str) -> &'static str {
    match property {
        "gpu_count" => "the checkpoint and this node's visible GPUs differ in number",
        "xgmi_hives" => "the checkpoint has more XGMI hives than this node",
        "xgmi_hive" => "the checkpoint's XGMI hives do not fit this node's",
        "numa_node" => "the checkpoint's GPU-to-CPU grouping cannot be kept",
        _ => "some checkpoint GPUs have no compatible GPU here",
    }
}

fn quirk_note(stop: &Stop) -> String {
    let why = match stop {
        Stop::Hives { stuck: true, .. } => {
            "its hive matching keeps the pairs of an abandoned attempt, so the order in which \
             hives are listed decides (known quirk)"
        }
        _ => {
            "its search keeps the first hive matching and the first free CPU it finds, and \
             the order of the GPUs decides"
        }
    };
    format!(
        "a mapping exists, but CRIU's search stops with \"{}\": {why}",
        stop.message()
    )
}

/// The refusal when only CRIU's search order is at fault.
fn order_refusal(pairing: &Pairing<'_>, stop: &Stop) -> Diagnosis {
    let hive = match stop {
        Stop::Hives { hive, .. } => pairing.src.hives.get(*hive),
        _ => None,
    };
    let sizes = |side: &model::Side<'_>| {
        let s: Vec<String> = side.hives.iter().map(|h| h.len().to_string()).collect();
        format!("hives listed as [{}] GPUs", s.join(", "))
    };
    Diagnosis {
        src: hive.and_then(|h| h.first().copied()),
        dst: None,
        failure: pairing::Failure {
            property: "criu_matching_order",
            checkpoint: pairing::Value::Text(sizes(&pairing.src)),
            local: pairing::Value::Text(sizes(&pairing.dst)),
            option: None,
        },
    }
}

#[cfg(test)]
mod tests;
