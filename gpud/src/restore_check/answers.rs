//! The two modes' answers from CRIU's replayed run and the exhaustive
//! search: the outcome, the reason, the mapping, and what explains them.

use super::{
    criu::{CRIU_VERSION, Run, SearchTooLarge, Stop},
    explain::{self, Diagnosis, Pairs},
    model,
    pairing::{self, Pairing},
    verdict::{self, Outcome},
};

/// What a mode answers.
pub(super) struct Answer {
    pub(super) outcome: Outcome,
    pub(super) reason: Option<String>,
    pub(super) pairs: Pairs,
    pub(super) diagnoses: Vec<Diagnosis>,
    /// In explain mode, CRIU's outcome (`None` when not reproduced).
    pub(super) criu: Option<Outcome>,
}

/// The outcome of a CRIU run and what CRIU would log or do.
fn outcome_of(run: &Run) -> (Outcome, Option<String>) {
    match run {
        Run::Restorable(_) => (Outcome::Restorable, None),
        Run::Refused(stop) => (Outcome::Refused, Some(stop.message())),
        Run::NoFinish { steps } => (
            Outcome::CriuWouldNotFinish,
            Some(format!(
                "its GPU search comes back, after {steps} steps, to a state it was in, and \
                 goes round for ever"
            )),
        ),
        Run::GroupsSpin { checkpoint, gpu_id } => (
            Outcome::CriuWouldNotFinish,
            Some(spin_reason(*checkpoint, *gpu_id)),
        ),
        Run::Crash(cause) => (Outcome::CriuWouldCrash, Some(cause.message())),
    }
}

fn spin_reason(checkpoint: bool, gpu_id: u32) -> String {
    let heap = if gpu_id == 0 {
        " (unless the heap word it reads as a group head's gpu_id is 0: then it crashes \
         printing that group)"
    } else {
        ""
    };
    format!(
        "building the {} side's XGMI groups, it looks gpu_id {gpu_id:#06x} up in a group \
         whose list a node of two groups broke, and goes round that list for ever{heap}",
        if checkpoint { "checkpoint" } else { "local" }
    )
}

/// `--mode criu`: CRIU's outcome; when it is not a restore, why, and the
/// mapping CRIU's search misses if there is one.
pub(super) fn criu(
    pairing: &Pairing<'_>,
    run: Run,
    notes: &mut Vec<String>,
) -> Result<Answer, SearchTooLarge> {
    let (outcome, reason) = outcome_of(&run);
    if let Run::Restorable(pairs) = run {
        return Ok(Answer {
            outcome,
            reason,
            pairs,
            diagnoses: Vec::new(),
            criu: None,
        });
    }
    let diagnoses = match explain::search(pairing) {
        Ok(None) => explain::diagnose(pairing)?,
        Ok(Some(pairs)) => {
            notes.push(missed_note(pairing, &run, &pairs));
            if matches!(run, Run::Crash(_)) {
                Vec::new()
            } else {
                vec![order_refusal(pairing, &run)]
            }
        }
        Err(too_large) => {
            notes.push(format!("no detailed reason: {too_large}"));
            Vec::new()
        }
    };
    Ok(Answer {
        outcome,
        reason,
        pairs: Vec::new(),
        diagnoses,
        criu: None,
    })
}

/// `--mode explain`: whether any mapping passes CRIU's checks, with CRIU's
/// own outcome beside it.
pub(super) fn explain(
    pairing: &Pairing<'_>,
    run: Result<Run, SearchTooLarge>,
    notes: &mut Vec<String>,
) -> Result<Answer, SearchTooLarge> {
    let run = run
        .inspect_err(|too_large| {
            notes.push(format!("CRIU's own answer not reproduced: {too_large}"));
        })
        .ok();
    let criu = run.as_ref().map(|r| outcome_of(r).0);
    match explain::search(pairing)? {
        Some(pairs) => {
            if let Some(run) = run.as_ref().filter(|r| !matches!(r, Run::Restorable(_))) {
                notes.push(missed_note(pairing, run, &pairs));
            }
            Ok(Answer {
                outcome: Outcome::Restorable,
                reason: None,
                pairs,
                diagnoses: Vec::new(),
                criu,
            })
        }
        None => {
            let diagnoses = explain::diagnose(pairing)?;
            let reason = diagnoses
                .first()
                .map_or("no mapping satisfies CRIU's checks", |d| {
                    summary(d.failure.property)
                });
            Ok(Answer {
                outcome: Outcome::Refused,
                reason: Some(reason.to_owned()),
                pairs: Vec::new(),
                diagnoses,
                criu,
            })
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

/// Why CRIU misses a mapping its checks allow, in the usual case.
const NOT_EXHAUSTIVE: &str = "its search is not exhaustive: local GPUs tried and given back \
                              go to the head of the list, and the walk goes on from the entry \
                              it had read before";

/// Pairs a note names before it counts the rest.
const NAMED_PAIRS: usize = 8;

/// A mapping passes every check, and CRIU does not restore with it.
fn missed_note(pairing: &Pairing<'_>, run: &Run, pairs: &Pairs) -> String {
    let refuses = |stop: &Stop| format!("refuses with \"{}\"", stop.message());
    let (does, why) = match run {
        Run::Refused(stop @ Stop::Hives { cpus: true, .. }) => (
            refuses(stop),
            "CPU nodes with XGMI links are in its XGMI groups, all of them under the one \
             gpu_id 0, and it maps them as it maps GPUs"
                .to_owned(),
        ),
        Run::Refused(stop @ Stop::Hives { stuck: true, .. }) => (
            refuses(stop),
            "its hive matching keeps the pairs of an abandoned try, so the order in which \
             hives are listed decides (known quirk)"
                .to_owned(),
        ),
        Run::Refused(
            stop @ (Stop::DeviceCount { .. } | Stop::HiveCount { .. } | Stop::Unreadable),
        ) => (refuses(stop), "it stops before searching".to_owned()),
        Run::Refused(stop) => (refuses(stop), NOT_EXHAUSTIVE.to_owned()),
        Run::NoFinish { .. } => (
            "never finishes its search".to_owned(),
            NOT_EXHAUSTIVE.to_owned(),
        ),
        Run::GroupsSpin { checkpoint, gpu_id } => (
            "never finishes".to_owned(),
            spin_reason(*checkpoint, *gpu_id),
        ),
        Run::Crash(cause) => ("crashes".to_owned(), cause.message()),
        Run::Restorable(_) => ("restores".to_owned(), String::new()),
    };
    let entries = verdict::mapping(pairing, pairs);
    let mut mapping: Vec<String> = entries
        .iter()
        .take(NAMED_PAIRS)
        .map(|m| format!("{:#06x} -> {:#06x}", m.checkpoint_gpu, m.local_gpu))
        .collect();
    if entries.len() > NAMED_PAIRS {
        mapping.push(format!("{} more", entries.len() - NAMED_PAIRS));
    }
    format!(
        "a mapping exists that CRIU {CRIU_VERSION}'s search misses ({}); CRIU {does}: {why}",
        mapping.join(", ")
    )
}

/// The refusal when only CRIU's search is at fault.
fn order_refusal(pairing: &Pairing<'_>, run: &Run) -> Diagnosis {
    let hive = match run {
        Run::Refused(Stop::Hives {
            hive, cpus: false, ..
        }) => pairing.src.hives.get(*hive),
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
