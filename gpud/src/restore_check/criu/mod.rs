//! CRIU's own GPU mapping at restore, replayed list operation by list
//! operation, so that its answer is CRIU 3.17.1's (the one Debian bookworm
//! ships), where it refuses, where it never returns and where it crashes.
//! Cited: checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin_topology.c at
//! 2cf8f13ca, as `topology.c:<line>`.
//!
//! 1. Both topologies are printed first: each hive's name goes into a
//!    200-byte static buffer, which overflows from 28 GPUs (a crash).
//! 2. GPU counts must be equal; the checkpoint may not have more XGMI hives.
//! 3. Hive phase (`match_xgmi_groups`): the first checkpoint hive is taken
//!    off its list and each local hive is tried in list order. A try builds
//!    both member lists front to back (`list_add_tail`, topology.c:1309,
//!    :1312) and runs the GPU search on them. On success the local hive
//!    leaves its list and the next checkpoint hive is matched; if that
//!    fails the local hive goes back at the head (`list_add`) and the pairs
//!    made stay in the maps, so the hive can never match again ("mapping
//!    already exists"). A hive that finds nothing goes back at the tail.
//! 4. Remaining phase: the GPUs not mapped yet, each side's list built by
//!    prepending (`list_add`, topology.c:1428, :1433), so in reverse.
//! 5. The GPU search (`map_devices`, topology.c:1207) takes the first
//!    checkpoint GPU off its list and walks the local list with
//!    `list_for_each_entry_safe`, whose next entry is read before the body
//!    (checkpoint-restore/criu:include/common/list.h:231-234). A local GPU
//!    that fits is taken off (topology.c:1217) and the search recurses; if
//!    that fails it goes back at the head (topology.c:1233), and the walk
//!    goes on from the cached entry. Deeper calls reorder the list, so some
//!    local GPUs are never tried and others are tried again: **the search is
//!    not exhaustive**, and for some inputs it revisits the same states for
//!    ever. When a pair cannot be pushed into the maps the call returns at
//!    once, leaving its GPUs off both lists.
//!
//! The replay is literal: [`list`] models the lists and poison pointers,
//! [`device`] `map_device` and the maps. Non-termination is found exactly:
//! the replay is deterministic, so CRIU loops for ever iff the whole state
//! (lists, maps, every frame's loop position) comes back, which Brent's
//! cycle detection notices with one saved state. A step limit bounds the
//! rest; past it no answer is given.

mod device;
mod list;
mod replay;

use self::replay::{End, Replay};
use super::pairing::Pairing;

/// The CRIU release whose behaviour `--mode criu` replays.
pub const CRIU_VERSION: &str = "3.17.1";

/// Search steps the exhaustive `explain` search may take.
pub const STEP_LIMIT: u64 = 20_000;

/// `map_device` calls and hive tries the replay of CRIU follows.
pub const CRIU_STEP_LIMIT: u64 = 1_000_000;

/// A search ran out of steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the GPU search gave up after {steps} steps")]
pub struct SearchTooLarge {
    pub steps: u64,
}

/// Counts search steps against [`STEP_LIMIT`].
#[derive(Debug, Default)]
pub struct Budget {
    steps: u64,
}

impl Budget {
    /// One more step.
    ///
    /// # Errors
    /// Past [`STEP_LIMIT`].
    pub fn step(&mut self) -> Result<(), SearchTooLarge> {
        self.steps += 1;
        if self.steps > STEP_LIMIT {
            return Err(SearchTooLarge { steps: self.steps });
        }
        Ok(())
    }
}

/// Where CRIU refuses, with its log message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// "Number of devices mismatch".
    DeviceCount { checkpoint: usize, local: usize },
    /// "Number of xgmi groups mismatch".
    HiveCount { checkpoint: usize, local: usize },
    /// "Failed to match all GPU groups": checkpoint hive `hive` found no
    /// local hive; `stuck` tells whether pairs of an abandoned try were
    /// left in the maps.
    Hives { hive: usize, stuck: bool },
    /// "Failed to match remaining nodes".
    Remaining,
    /// "Unable to parse the KFD message": a header count CRIU's schema
    /// requires is missing.
    Unreadable,
    /// The search returned "mapped" with checkpoint GPU `slot` left out (a
    /// refused push took it off the list); the restore cannot go on.
    Unmapped { slot: usize },
}

impl Stop {
    /// CRIU's log line for it.
    pub fn message(&self) -> String {
        match self {
            Self::DeviceCount { checkpoint, local } => {
                format!("Number of devices mismatch (checkpointed:{checkpoint} local:{local})")
            }
            Self::HiveCount { checkpoint, local } => {
                format!("Number of xgmi groups mismatch (checkpointed:{checkpoint} local:{local})")
            }
            Self::Hives { .. } => "Failed to match all GPU groups".to_owned(),
            Self::Remaining => "Failed to match remaining nodes".to_owned(),
            Self::Unreadable => "Unable to parse the KFD message".to_owned(),
            Self::Unmapped { .. } => {
                "GPU search returned with a checkpoint GPU unmapped".to_owned()
            }
        }
    }
}

/// Why CRIU would crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashCause {
    /// A hive's name overflows `p2pgroup_to_str`'s buffer.
    HiveName {
        checkpoint: bool,
        gpus: usize,
        bytes: usize,
    },
    /// A GPU list's name overflows `mapping_list_to_str`'s buffer.
    ListName { gpus: usize, bytes: usize },
    /// A checkpoint GPU links to a node the image lacks (by node id).
    MissingNode { checkpoint_node: u32 },
    /// The search follows a pointer `list_del` poisoned.
    Poisoned,
    /// The image header announces more device entries than it holds.
    Entries { announced: u64, present: usize },
}

impl CrashCause {
    pub fn message(&self) -> String {
        match self {
            Self::HiveName {
                checkpoint,
                gpus,
                bytes,
            } => format!(
                "the name of a {} hive of {gpus} GPUs takes {bytes} bytes, and \
                 p2pgroup_to_str writes it into a 200-byte static buffer: CRIU writes past \
                 its end (undefined behaviour)",
                if *checkpoint { "checkpoint" } else { "local" }
            ),
            Self::ListName { gpus, bytes } => format!(
                "the names of a list of {gpus} GPUs take {bytes} bytes, and \
                 mapping_list_to_str writes them into a 200-byte static buffer: CRIU writes \
                 past its end (undefined behaviour)"
            ),
            Self::MissingNode { checkpoint_node } => format!(
                "checkpoint node {checkpoint_node} has a link to a node the image lacks, and \
                 map_device dereferences that link's unset target"
            ),
            Self::Poisoned => "its GPU search follows a list pointer list_del poisoned".to_owned(),
            Self::Entries { announced, present } => format!(
                "the image header announces {announced} device entries and {present} follow; \
                 CRIU reads past them"
            ),
        }
    }
}

/// CRIU's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// The (checkpoint slot, local slot) pairs it restores with.
    Restorable(Vec<(usize, usize)>),
    Refused(Stop),
    /// Its search came back to a state it had been in after `steps` steps.
    NoFinish {
        steps: u64,
    },
    Crash(CrashCause),
}

/// Replays CRIU's mapping of `pairing`'s checkpoint onto its local side.
///
/// # Errors
/// When the replay needs more than [`CRIU_STEP_LIMIT`] steps.
pub fn run(pairing: &Pairing<'_>) -> Result<Run, SearchTooLarge> {
    if let Some(cause) = hive_name_overflow(pairing) {
        return Ok(Run::Crash(cause));
    }
    let (n, m) = (pairing.src_len(), pairing.dst_len());
    if n != m {
        return Ok(Run::Refused(Stop::DeviceCount {
            checkpoint: n,
            local: m,
        }));
    }
    let (sh, dh) = (pairing.src.hives.len(), pairing.dst.hives.len());
    if sh > dh {
        return Ok(Run::Refused(Stop::HiveCount {
            checkpoint: sh,
            local: dh,
        }));
    }
    let mut replay = Replay::new(pairing);
    match replay.phases() {
        Ok(run) => Ok(run),
        Err(End::Crash(cause)) => Ok(Run::Crash(cause)),
        Err(End::Loop) => Ok(Run::NoFinish {
            steps: replay.steps(),
        }),
        Err(End::TooLarge) => Err(SearchTooLarge {
            steps: replay.steps(),
        }),
    }
}

/// `topology_print` names every hive of both sides before anything else.
fn hive_name_overflow(pairing: &Pairing<'_>) -> Option<CrashCause> {
    [(true, &pairing.src), (false, &pairing.dst)]
        .into_iter()
        .flat_map(|(checkpoint, side)| {
            side.hives.iter().map(move |h| {
                let bytes = device::hive_name_len(h.iter().map(|&s| side.node(s).gpu_id));
                (checkpoint, h.len(), bytes)
            })
        })
        .find(|&(_, _, bytes)| bytes > device::PRINT_BUFFER)
        .map(|(checkpoint, gpus, bytes)| CrashCause::HiveName {
            checkpoint,
            gpus,
            bytes,
        })
}
