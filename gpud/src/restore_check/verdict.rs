//! The answer of a restore check, for scripts (JSON) and for people (text).
//!
//! The JSON is a contract: `{"restorable", "mapping": [{"checkpoint_gpu",
//! "local_gpu"}], "refusals": [{"checkpoint_gpu", "local_gpu", "property",
//! "checkpoint_value", "local_value", "option"}]}` at least (GPUs by KFD
//! `gpu_id`, `null` when a refusal is not about one GPU); fields are only
//! ever added.
//!
//! `outcome` says which of CRIU's ends it is: `restorable`, `refused`,
//! `criu-would-not-finish` (its search loops) or `criu-would-crash`;
//! `criu_version` names the CRIU release whose code the verdict replays.
//!
//! `property` is a KFD property name (`fw_version`, `capability`,
//! `io_links_count`, ...) or one of: `gpu_count` (visible GPUs differ in
//! number), `xgmi_hives` (more hives in the checkpoint), `xgmi_hive` (a
//! checkpoint hive fits in no local hive), `valid_io_links` (the checkpoint
//! GPU had more links to nodes it could see), `cpu_links` (no local link can
//! serve its link to a CPU), `numa_node` (the CPU grouping breaks; values are
//! CPU node ids), `criu_matching_order` (only CRIU's search order refuses).

use std::io::{self, Write};

use serde::Serialize;

use super::{
    Mode,
    explain::Diagnosis,
    image::ImageFormat,
    model::{Node, Side},
    options::{Check, Options},
    pairing::{Pairing, Value},
};

/// A checkpoint GPU and the local GPU it is restored onto.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MappingEntry {
    pub checkpoint_gpu: u32,
    pub local_gpu: u32,
    pub checkpoint_node: u32,
    pub local_node: u32,
    pub local_bdf: Option<String>,
    pub local_render_minor: Option<u32>,
}

/// One reason the restore is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    pub checkpoint_gpu: Option<u32>,
    pub local_gpu: Option<u32>,
    pub property: String,
    pub checkpoint_value: Value,
    pub local_value: Value,
    /// The `KFD_*_CHECK` option that would relax it; `null` when none can.
    pub option: Option<String>,
    pub checkpoint_node: Option<u32>,
    pub local_node: Option<u32>,
    pub local_bdf: Option<String>,
}

/// The checkpoint the verdict is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointSummary {
    pub source: String,
    pub pid: u32,
    pub format: ImageFormat,
    pub gpus: usize,
}

/// What CRIU does with the restore, or (in `explain` mode) whether a
/// mapping exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// CRIU maps every GPU (explain: a mapping exists).
    Restorable,
    /// CRIU fails the restore with a log line (explain: no mapping exists).
    Refused,
    /// CRIU's GPU search loops for ever.
    CriuWouldNotFinish,
    /// CRIU dereferences a bad pointer or overflows a buffer.
    CriuWouldCrash,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restorable => "restorable",
            Self::Refused => "refused",
            Self::CriuWouldNotFinish => "CRIU would not finish",
            Self::CriuWouldCrash => "CRIU would crash",
        }
    }
}

/// Whether the restore would be accepted, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub restorable: bool,
    /// `restorable`, `refused`, `criu-would-not-finish` or
    /// `criu-would-crash` (only in `criu` mode).
    pub outcome: Outcome,
    /// The CRIU release whose behaviour the verdict replays.
    pub criu_version: &'static str,
    pub mode: Mode,
    /// What stops the restore (CRIU's log line in `criu` mode); `null` when
    /// it is accepted.
    pub reason: Option<String>,
    pub mapping: Vec<MappingEntry>,
    pub refusals: Vec<Refusal>,
    /// In `explain` mode, CRIU's own answer (`null` if its search was too
    /// large to reproduce).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub criu_restorable: Option<bool>,
    /// In `explain` mode, CRIU's own outcome (`null` as above).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub criu_outcome: Option<Outcome>,
    /// The effective options.
    pub options: Options,
    pub checkpoint: CheckpointSummary,
    pub local_gpus: usize,
    pub notes: Vec<String>,
}

/// The mapping entries of `pairs` (checkpoint slot, local slot).
pub fn mapping(pairing: &Pairing<'_>, pairs: &[(usize, usize)]) -> Vec<MappingEntry> {
    pairs
        .iter()
        .map(|&(s, d)| {
            let (src, dst) = (pairing.src.node(s), pairing.dst.node(d));
            MappingEntry {
                checkpoint_gpu: src.gpu_id,
                local_gpu: dst.gpu_id,
                checkpoint_node: src.id,
                local_node: dst.id,
                local_bdf: dst.location.bdf.clone(),
                local_render_minor: dst.location.render_minor,
            }
        })
        .collect()
}

fn slot_node<'s>(side: &'s Side<'_>, slot: Option<usize>) -> Option<&'s Node> {
    slot.map(|s| side.node(s))
}

/// The refusal of one diagnosis.
pub fn refusal(pairing: &Pairing<'_>, d: &Diagnosis) -> Refusal {
    let src = slot_node(&pairing.src, d.src);
    let dst = slot_node(&pairing.dst, d.dst);
    Refusal {
        checkpoint_gpu: src.map(|n| n.gpu_id),
        local_gpu: dst.map(|n| n.gpu_id),
        property: d.failure.property.to_owned(),
        checkpoint_value: d.failure.checkpoint.clone(),
        local_value: d.failure.local.clone(),
        option: d.failure.option.map(|c| c.env_name().to_owned()),
        checkpoint_node: src.map(|n| n.id),
        local_node: dst.map(|n| n.id),
        local_bdf: dst.and_then(|n| n.location.bdf.clone()),
    }
}

fn describe_local(gpu: u32, node: u32, bdf: Option<&str>) -> String {
    match bdf {
        Some(bdf) => format!("local GPU {gpu:#06x} (node {node}, {bdf})"),
        None => format!("local GPU {gpu:#06x} (node {node})"),
    }
}

fn write_refusal(r: &Refusal, out: &mut dyn Write) -> io::Result<()> {
    let checkpoint = r
        .checkpoint_gpu
        .zip(r.checkpoint_node)
        .map(|(gpu, node)| format!("checkpoint GPU {gpu:#06x} (node {node})"));
    let local = r
        .local_gpu
        .zip(r.local_node)
        .map(|(gpu, node)| describe_local(gpu, node, r.local_bdf.as_deref()));
    let who = match (checkpoint, local) {
        (Some(c), Some(l)) => format!("{c} on {l}: "),
        (Some(c), None) => format!("{c}: "),
        (None, Some(l)) => format!("{l}: "),
        (None, None) => String::new(),
    };
    let relax = match &r.option {
        Some(option) => format!("{option}=0 would relax it"),
        None => "no option relaxes it".to_owned(),
    };
    writeln!(
        out,
        "  {who}{}: {} in the checkpoint, {} here; {relax}",
        r.property, r.checkpoint_value, r.local_value
    )
}

impl Verdict {
    /// Pretty JSON and a newline.
    ///
    /// # Errors
    /// When `out` fails.
    pub fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer_pretty(&mut *out, self)?;
        writeln!(out)
    }

    /// A readable verdict.
    ///
    /// # Errors
    /// When `out` fails.
    pub fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let (outcome, mode) = (self.outcome.as_str(), self.mode.as_str());
        let version = self.criu_version;
        match &self.reason {
            None => writeln!(out, "{outcome} ({mode} mode, CRIU {version})")?,
            Some(reason) => writeln!(out, "{outcome} ({mode} mode, CRIU {version}): {reason}")?,
        }
        let c = &self.checkpoint;
        writeln!(
            out,
            "checkpoint: {} (pid {}, {} GPU(s), {}); {} GPU(s) visible here",
            c.source,
            c.pid,
            c.gpus,
            serde_json::to_value(c.format)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            self.local_gpus
        )?;
        for r in &self.refusals {
            write_refusal(r, out)?;
        }
        for m in &self.mapping {
            let on = describe_local(m.local_gpu, m.local_node, m.local_bdf.as_deref());
            writeln!(
                out,
                "  checkpoint GPU {:#06x} (node {}) -> {on}",
                m.checkpoint_gpu, m.checkpoint_node
            )?;
        }
        let off: Vec<&str> = Check::ALL
            .iter()
            .filter(|c| !self.options.is_on(**c))
            .map(|c| c.env_name())
            .collect();
        if !off.is_empty() {
            writeln!(out, "checks off: {}", off.join(", "))?;
        }
        if let Some(criu) = self.criu_outcome.filter(|c| *c != self.outcome) {
            let says = match criu {
                Outcome::Restorable => "accept this restore",
                Outcome::Refused => "refuse this restore",
                Outcome::CriuWouldNotFinish => "not finish this restore",
                Outcome::CriuWouldCrash => "crash on this restore",
            };
            writeln!(out, "CRIU {version} itself would {says} (see notes)")?;
        }
        for note in &self.notes {
            writeln!(out, "note: {note}")?;
        }
        Ok(())
    }
}
