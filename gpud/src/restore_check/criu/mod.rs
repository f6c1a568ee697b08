//! CRIU's own GPU mapping at restore, replayed list operation by list
//! operation, so that its answer is CRIU 3.17.1's (the one Debian bookworm
//! ships), where it refuses, where it never returns and where it crashes.
//! Cited: checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin_topology.c at
//! 2cf8f13ca, as `topology.c:<line>`.
//!
//! 1. Each side's XGMI groups are built ([`groups`]: CPU nodes with XGMI
//!    links included, members found by `gpu_id`, a peer of two groups
//!    relinked, which crashes CRIU or stalls it) and printed: each hive's
//!    name goes into a 200-byte static buffer, and from 28 members on past
//!    it, where [`printbuf`] tells what it overwrites in the plugin's
//!    `.bss` (nothing CRIU reads, up to a whole-node hive of 32 and its
//!    search lists; list heads CRIU walks next, further on: a crash there).
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
//! Hive members that are CPU nodes take part in the search as CRIU's do:
//! `map_device` compares their (all-zero) values and links, and their pair
//! goes into the GPU maps as `0 -> 0`, so a second one clashes.
//!
//! Not told by the code, and so not decided here: what a group head read as
//! a node holds (taken as no node's `gpu_id`, see [`groups`]), and what CRIU
//! does after a name overwrote only part of a pointer, or a head it does not
//! walk before the restore goes on ([`printbuf`]): the verdict is then the
//! replay's, with a note naming the overflow.
//!
//! The replay is literal: [`list`] models the lists and poison pointers,
//! [`device`] `map_device` and the maps. Non-termination is found exactly:
//! the replay is deterministic, so CRIU loops for ever iff the whole state
//! (lists, maps, every frame's loop position) comes back, which Brent's
//! cycle detection notices with one saved state. A step limit bounds the
//! rest; past it no answer is given.

mod device;
mod groups;
mod list;
mod printbuf;
mod replay;

use self::{
    device::Members,
    groups::Groups,
    replay::{End, Replay},
};
use super::{model::Side, pairing::Pairing};

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
    /// left in the maps, `cpus` whether CPU nodes are in the groups.
    Hives {
        hive: usize,
        stuck: bool,
        cpus: bool,
    },
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

/// A list head of the plugin that a name written past its buffer covers,
/// and the walk that faults on it ([`printbuf`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// `src_topology.nodes`, walked for the GPUs left (topology.c:1426).
    SrcNodes,
    /// `src_topology.xgmi_groups`, walked for the next hive (topology.c:1281).
    SrcGroups,
    /// `dest_topology.nodes`, walked for the local side's groups
    /// (topology.c:845).
    DstNodes,
    /// `restore_maps.cpu_maps`, walked by the NUMA check and `maps_push`.
    CpuMaps,
    /// `restore_maps.gpu_maps`, walked by `maps_push`.
    GpuMaps,
}

impl Lost {
    fn head(self) -> &'static str {
        match self {
            Self::SrcNodes => "src_topology.nodes",
            Self::SrcGroups => "src_topology.xgmi_groups",
            Self::DstNodes => "dest_topology.nodes",
            Self::CpuMaps => "restore_maps.cpu_maps",
            Self::GpuMaps => "restore_maps.gpu_maps",
        }
    }
}

/// Why CRIU would crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashCause {
    /// A hive's name, written past `p2pgroup_to_str`'s buffer, covers the
    /// head of a list CRIU walks next.
    HiveName {
        checkpoint: bool,
        gpus: usize,
        bytes: usize,
        what: Lost,
    },
    /// A search list's name, written past `mapping_list_to_str`'s buffer,
    /// covers the head of a list CRIU walks next.
    ListName {
        gpus: usize,
        bytes: usize,
        what: Lost,
    },
    /// A node joined two XGMI groups; printing the first never ends.
    GroupRelinked { checkpoint: bool, node: u32 },
    /// A checkpoint GPU links to a node the image lacks (by node id).
    MissingNode { checkpoint_node: u32 },
    /// The search follows a pointer `list_del` poisoned.
    Poisoned,
    /// The image header announces more device entries than it holds.
    Entries { announced: u64, present: usize },
}

fn side_name(checkpoint: bool) -> &'static str {
    if checkpoint { "checkpoint" } else { "local" }
}

impl CrashCause {
    pub fn message(&self) -> String {
        match self {
            Self::HiveName {
                checkpoint,
                gpus,
                bytes,
                what,
            } => format!(
                "the name of a {} hive of {gpus} members takes {bytes} bytes, and \
                 p2pgroup_to_str writes it into a 200-byte static buffer and on over the head \
                 of {}, which CRIU walks next",
                side_name(*checkpoint),
                what.head()
            ),
            Self::ListName { gpus, bytes, what } => format!(
                "the names of a search list of {gpus} members take {bytes} bytes, and \
                 mapping_list_to_str writes them into a 200-byte static buffer and on over \
                 the head of {}, which CRIU walks next",
                what.head()
            ),
            Self::GroupRelinked { checkpoint, node } => format!(
                "{} node {node} is the XGMI peer of two groups: CRIU links it into the second \
                 and the first group's list never comes back to its head, so printing that \
                 group writes without end past p2pgroup_to_str's buffer",
                side_name(*checkpoint)
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
    /// Building a side's XGMI groups, it looks `gpu_id` up in a group whose
    /// list never comes back to its head.
    GroupsSpin {
        checkpoint: bool,
        gpu_id: u32,
    },
    Crash(CrashCause),
}

/// Replays CRIU's mapping of `pairing`'s checkpoint onto its local side;
/// what it notes on the way (names past their buffers) goes to `notes`.
///
/// # Errors
/// When the replay needs more than [`CRIU_STEP_LIMIT`] steps.
pub fn run(pairing: &Pairing<'_>, notes: &mut Vec<String>) -> Result<Run, SearchTooLarge> {
    let (src_groups, dst_groups) = match side_groups(pairing, notes) {
        Ok(groups) => groups,
        Err(run) => return Ok(run),
    };
    let members = Members {
        src: members(&pairing.src, &src_groups),
        dst: members(&pairing.dst, &dst_groups),
    };
    let ids = |m: &[usize], groups: &[Vec<usize>]| -> Vec<Vec<usize>> {
        groups
            .iter()
            .map(|g| {
                g.iter()
                    .filter_map(|n| m.iter().position(|x| x == n))
                    .collect()
            })
            .collect()
    };
    let (sg, dg) = (
        ids(&members.src, &src_groups),
        ids(&members.dst, &dst_groups),
    );
    let written = hive_names_end(pairing, &src_groups, &dst_groups);
    let (n, m) = (pairing.src_len(), pairing.dst_len());
    if n != m {
        return Ok(Run::Refused(Stop::DeviceCount {
            checkpoint: n,
            local: m,
        }));
    }
    if sg.len() > dg.len() {
        return Ok(Run::Refused(Stop::HiveCount {
            checkpoint: sg.len(),
            local: dg.len(),
        }));
    }
    let mut replay = Replay::new(pairing, &members, [&sg, &dg], written);
    let end = replay.phases();
    let (gpus, bytes) = replay.longest_list;
    notes.extend(printbuf::note(
        &format!("the name of a search list of {gpus} members"),
        bytes,
        printbuf::LIST_BUFFER,
    ));
    match end {
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

/// A side's XGMI groups: each group's members, by node index, in list order.
type GroupLists = Vec<Vec<usize>>;

/// Both sides' XGMI groups (node indices), built and printed in CRIU's order
/// (topology.c:1377-1389), or where CRIU ends before it compares anything.
fn side_groups(
    pairing: &Pairing<'_>,
    notes: &mut Vec<String>,
) -> Result<(GroupLists, GroupLists), Run> {
    let src = printed_groups(&pairing.src, true, notes)?;
    let src_name = side_groups_longest(&src, &pairing.src);
    if printbuf::HIVE_BUFFER + src_name.1 >= printbuf::DST_NODES_LOST {
        return Err(hive_crash(src_name, true, Lost::DstNodes));
    }
    let dst = printed_groups(&pairing.dst, false, notes)?;
    let dst_name = side_groups_longest(&dst, &pairing.dst);
    // topology.c:1392 walks src_sys->nodes.
    let (checkpoint, name) = if src_name.1 >= dst_name.1 {
        (true, src_name)
    } else {
        (false, dst_name)
    };
    if printbuf::HIVE_BUFFER + name.1 >= printbuf::SRC_NODES_LOST {
        return Err(hive_crash(name, checkpoint, Lost::SrcNodes));
    }
    Ok((src, dst))
}

/// One side's groups after `topology_determine_iolinks` and
/// `topology_print`, with a note when a name outgrows its buffer.
fn printed_groups(
    side: &Side<'_>,
    checkpoint: bool,
    notes: &mut Vec<String>,
) -> Result<Vec<Vec<usize>>, Run> {
    let lists = match groups::build(side) {
        Groups::Lists(lists) => lists,
        Groups::Spins { gpu_id } => return Err(Run::GroupsSpin { checkpoint, gpu_id }),
        Groups::Relinked { node } => {
            return Err(Run::Crash(CrashCause::GroupRelinked {
                checkpoint,
                node: side.topo.nodes[node].id,
            }));
        }
    };
    let (gpus, bytes) = side_groups_longest(&lists, side);
    notes.extend(printbuf::note(
        &format!(
            "the name of a {} hive of {gpus} members",
            side_name(checkpoint)
        ),
        bytes,
        printbuf::HIVE_BUFFER,
    ));
    Ok(lists)
}

fn hive_crash((gpus, bytes): (usize, usize), checkpoint: bool, what: Lost) -> Run {
    Run::Crash(CrashCause::HiveName {
        checkpoint,
        gpus,
        bytes,
        what,
    })
}

/// The longest name `p2pgroup_to_str` writes for `lists`: (members, bytes).
fn side_groups_longest(lists: &[Vec<usize>], side: &Side<'_>) -> (usize, usize) {
    lists
        .iter()
        .map(|g| {
            let ids = g.iter().map(|&n| side.topo.nodes[n].gpu_id);
            (g.len(), printbuf::hive_name_len(ids))
        })
        .max_by_key(|&(_, bytes)| bytes)
        .unwrap_or((0, 0))
}

/// How far the hive names of both sides write.
fn hive_names_end(pairing: &Pairing<'_>, src: &[Vec<usize>], dst: &[Vec<usize>]) -> usize {
    let a = side_groups_longest(src, &pairing.src).1;
    let b = side_groups_longest(dst, &pairing.dst).1;
    printbuf::HIVE_BUFFER + a.max(b)
}

/// The members of one side: its GPU slots, then the CPU nodes its groups
/// hold, by node index.
fn members(side: &Side<'_>, groups: &[Vec<usize>]) -> Vec<usize> {
    let mut out = side.gpus.clone();
    for &n in groups.iter().flatten() {
        if !side.topo.nodes[n].is_gpu() && !out.contains(&n) {
            out.push(n);
        }
    }
    out
}
