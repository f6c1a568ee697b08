//! Compute-unit (CU) slicing for HAMi's `Allocate`: pure, no I/O, no transport.
//!
//! * [`bitmap`]: per-GPU occupancy of logical CU indices and the choice of a
//!   slice (first fit, whole WGP pairs on gfx10+; docs/amd-hardware.md §9.3,
//!   docs/hami-protocol.md §5.1), plus the percentage-to-CUs rule
//!   (docs/hami-protocol.md §4.2).
//! * [`mask`]: the CU ID-list grammar (`0-3,8,10-12`, docs/hami-protocol.md
//!   §5.1) and a strict parser for `HSA_CU_MASK` in its ID-list form
//!   (docs/amd-hardware.md §9.3).
//! * [`env`]: the container environment for one container's GPUs
//!   (`ROCR_VISIBLE_DEVICES`, `HSA_CU_MASK`, `HIP_DEVICE_MEMORY_LIMIT[_<i>]`;
//!   docs/amd-hardware.md §9.1–9.3, docs/hami-protocol.md §5.2–5.3).
//!
//! Nothing here talks to kubelet, the API server or amd-gpud; callers feed it
//! what they know and get values or a [`CuError`] back.

pub(crate) mod bitmap;
pub(crate) mod env;
pub(crate) mod mask;

pub(crate) use bitmap::{CuBitmap, smallest_share};
pub(crate) use env::{GpuSlice, render_env};
#[cfg(test)]
pub(crate) use {bitmap::cus_for_percent, mask::format_id_list};

/// Why a CU slice could not be chosen, claimed, released, rendered or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CuError {
    /// Fewer free CUs (in whole allocation units) than requested.
    #[error("GPU {gpu}: not enough free CUs: want {want}, free {free}")]
    NotEnoughFree {
        /// The GPU's label (registered id).
        gpu: String,
        /// CUs wanted, after rounding down to whole WGPs.
        want: u32,
        /// Free CUs usable in whole allocation units.
        free: u32,
    },
    /// The request is smaller than one allocation unit (a WGP on gfx10+).
    #[error(
        "GPU {gpu}: a request for {want} CU(s) is below the smallest share on this GPU, \
         which is {smallest} CUs (one whole WGP on gfx10+ is {smallest} CUs)"
    )]
    BelowSmallestShare {
        /// The GPU's label.
        gpu: String,
        /// CUs requested.
        want: u32,
        /// The smallest share this GPU can hand out.
        smallest: u32,
    },
    /// `cus_per_wgp` must be 1 (pre-gfx10) or 2 (gfx10+ WGP pairs).
    #[error("GPU {gpu}: unsupported CUs per WGP {cus_per_wgp} (expected 1 or 2)")]
    BadCusPerWgp {
        /// The GPU's label.
        gpu: String,
        /// The value given.
        cus_per_wgp: u32,
    },
    /// A CU range reaches past the GPU's CU count.
    #[error("GPU {gpu}: CU range {start}-{end} is outside 0..{total}")]
    OutOfRange {
        /// The GPU's label.
        gpu: String,
        /// First CU of the range.
        start: u32,
        /// One past the last CU of the range.
        end: u32,
        /// The GPU's CU count.
        total: u32,
    },
    /// Claiming a CU that is already claimed.
    #[error("GPU {gpu}: CU {cu} is already claimed")]
    AlreadyClaimed {
        /// The GPU's label.
        gpu: String,
        /// The first conflicting CU.
        cu: u32,
    },
    /// Releasing a CU that is not claimed.
    #[cfg(test)]
    #[error("GPU {gpu}: CU {cu} is not claimed")]
    NotClaimed {
        /// The GPU's label.
        gpu: String,
        /// The first CU that was free.
        cu: u32,
    },
    /// A slice on a gfx10+ GPU enables only one CU of a WGP pair.
    #[error("GPU {gpu}: CU {cu} is enabled without its WGP partner (pairs are 2k,2k+1)")]
    SplitWgp {
        /// The GPU's label (container-local index when parsing a mask).
        gpu: String,
        /// The CU whose partner is missing.
        cu: u32,
    },
    /// A slice with no CU at all.
    #[error("GPU {gpu}: empty CU slice")]
    EmptySlice {
        /// The GPU's label.
        gpu: String,
    },
    /// A malformed `HSA_CU_MASK` or CU ID list.
    #[error("malformed CU mask {text:?}: {reason}")]
    Malformed {
        /// The offending text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A container with no GPU has no environment to render.
    #[error("no GPU given for the container")]
    NoGpus,
    /// Two of a container's GPUs claim the same KFD topology node.
    #[error("KFD node {node} is listed twice for one container")]
    DuplicateKfdNode {
        /// The repeated node id.
        node: u32,
    },
}

impl CuError {
    pub(crate) fn malformed(text: &str, reason: impl Into<String>) -> Self {
        Self::Malformed {
            text: text.to_owned(),
            reason: reason.into(),
        }
    }
}
