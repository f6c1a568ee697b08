//! kubelet `GetPreferredAllocation` for `amd.com/gpu`: which device IDs a
//! container should get. Pure and transport-free: no kubelet, no D-Bus.
//! An [`AllocationHint`] (HAMi's choice, `allocate/hint.rs`) is asked first;
//! the topology policies here answer otherwise.
//!
//! Every physical GPU (or partition) is offered to kubelet as `count` devices
//! named `<gpu-id>#<slot>` ([`slot_id`]). The resource counts GPUs, so a
//! container asking for N devices should get one slot on each of N *distinct*
//! GPUs. A slot missing from `available` is in use by another pod.
//!
//! # Rules of [`preferred`]
//!
//! 1. `must_include` (first occurrence of each ID, in the given order) leads the
//!    answer. Each of its IDs counts as one device towards `size`, and the GPU
//!    it names counts as *already chosen*: two `must_include` slots of one GPU
//!    are both kept and that GPU is not picked again, so the answer then covers
//!    fewer distinct GPUs than `size` (kubelet already gave those devices to
//!    this container; the answer cannot undo it). If `must_include` alone is
//!    longer than `size`, it is truncated to `size`.
//! 2. The remaining `k = size - |must_include|` devices are one slot (the lowest
//!    available slot number) on each of `k` GPUs chosen by the [`Policy`] among
//!    the *known* GPUs (listed in `gpus`) that have an available slot and are
//!    not already chosen.
//! 3. When fewer than `k` such GPUs exist, all of them are taken, and the
//!    answer is filled from the rest of `available`: first one ID (its lowest
//!    slot) per GPU not yet covered, GPUs in order of first appearance (this
//!    is where unknown GPUs come in; an ID not of the `<gpu>#<slot>` form
//!    counts as a GPU of its own), then the remaining IDs in the given order.
//!
//! Hence the answer never errs or panics, never repeats an ID, only holds IDs
//! from `available ∪ must_include`, and always has exactly
//! `min(size, |available ∪ must_include|)` IDs.
//!
//! # Closeness
//!
//! Two GPUs are scored by their best link (either direction; see
//! [`LinkKind`]), in tiers: same physical GPU < xGMI < host path on one NUMA
//! node < host path across NUMA nodes (or NUMA unknown); within a tier, fewer
//! hops are closer, and a pair with no link at all is the farthest of its
//! (NUMA) tier. A set of GPUs is scored on the pairs that involve a newly
//! chosen GPU:
//!
//! * [`Policy::BestEffort`] minimises (worst pair, sum of pairs, free slots of
//!   the chosen GPUs): tight sets, then already shared GPUs so whole GPUs stay
//!   free;
//! * [`Policy::Spread`] maximises (closest pair, sum of pairs, free slots).
//!
//! Remaining ties go to the set that comes first in `gpus` order. The search
//! is exact while the number of candidate sets is small and a greedy
//! expansion from every candidate otherwise (see `search`).

mod distance;
mod pool;
mod search;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use std::{fmt, future::Future, pin::Pin, str::FromStr};

use distance::Distances;
use pool::{Answer, Pool};

/// A source of preferred devices that knows more than the topology: HAMi's
/// decision for the pod being admitted. Consulted first by
/// GetPreferredAllocation; `None` falls back to the allocator policy.
pub(crate) trait AllocationHint: Send + Sync + std::fmt::Debug {
    /// Preferred device ids for one container request, if this source knows.
    fn preferred<'a>(
        &'a self,
        available: &'a [String],
        must_include: &'a [String],
        size: usize,
    ) -> Pin<Box<dyn Future<Output = Option<Vec<String>>> + Send + 'a>>;
}

/// How [`preferred`] chooses GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// Closest GPUs, preferring GPUs already shared (a.k.a. binpack).
    #[default]
    BestEffort,
    /// GPUs as far apart as possible, preferring empty GPUs.
    Spread,
}

impl Policy {
    /// The canonical name, accepted back by [`FromStr`].
    #[must_use]
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::BestEffort => "besteffort",
            Self::Spread => "spread",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Policy {
    type Err = ParsePolicyError;

    /// `besteffort`, `binpack` (alias) or `spread`, ASCII case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("besteffort") || s.eq_ignore_ascii_case("binpack") {
            Ok(Self::BestEffort)
        } else if s.eq_ignore_ascii_case("spread") {
            Ok(Self::Spread)
        } else {
            Err(ParsePolicyError {
                value: s.to_owned(),
            })
        }
    }
}

/// An allocation policy name that is not one of [`Policy`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsePolicyError {
    value: String,
}

impl ParsePolicyError {
    /// The rejected value.
    #[must_use]
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for ParsePolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown allocation policy {:?}: expected besteffort, binpack or spread",
            self.value
        )
    }
}

impl std::error::Error for ParsePolicyError {}

/// One GPU (or partition) offered to kubelet, and how it reaches the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTopology {
    /// The `<gpu-id>` part of its device IDs.
    pub id: String,
    /// NUMA node of its `PCIe` attachment, if known.
    pub numa: Option<u32>,
    /// Links to other GPUs; links to unknown peers or to itself are ignored.
    pub links: Vec<Link>,
}

/// A link from one GPU to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The [`GpuTopology::id`] of the other end.
    pub peer: String,
    /// What the link is made of.
    pub kind: LinkKind,
    /// Hops (xGMI hops, or PCIe/host legs); 0 is read as 1.
    pub hops: u32,
}

/// The kind of a GPU-to-GPU link, closest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// Two partitions of one physical GPU (KFD weight 13).
    Internal,
    /// xGMI (KFD io-link type 11).
    Xgmi,
    /// PCIe, directly or through the host.
    Pcie,
    /// Any other path; scored like a path through the host.
    Other,
}

/// The device ID of `slot` on `gpu`: `<gpu>#<slot>`.
#[must_use]
pub fn slot_id(gpu: &str, slot: u32) -> String {
    format!("{gpu}#{slot}")
}

/// Splits a device ID on its last `#` into GPU and slot.
///
/// The exact inverse of [`slot_id`]: `None` unless the GPU part is non-empty
/// and the slot is a canonical decimal `u32` (no sign, no leading zero).
#[must_use]
pub fn parse_slot(id: &str) -> Option<(&str, u32)> {
    let (gpu, slot) = id.rsplit_once('#')?;
    let canonical = !slot.is_empty()
        && slot.bytes().all(|b| b.is_ascii_digit())
        && (slot == "0" || !slot.starts_with('0'));
    if gpu.is_empty() || !canonical {
        return None;
    }
    Some((gpu, slot.parse().ok()?))
}

/// The device IDs kubelet should give a container asking for `size` devices
/// of `available` (which kubelet builds as `must_include ∪ candidates`).
///
/// Never fails; see the module documentation for the exact rules.
#[must_use]
pub fn preferred(
    policy: Policy,
    gpus: &[GpuTopology],
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut answer = Answer::new(size);
    for id in must_include {
        answer.push(id);
    }
    if answer.is_full() {
        return answer.into_ids();
    }
    let pool = Pool::new(gpus, available, &answer);
    let k = answer.room();
    let chosen = if pool.candidates.len() <= k {
        (0..pool.candidates.len()).collect()
    } else {
        let distances = Distances::new(gpus);
        search::select(policy, &distances, &pool.fixed, &pool.candidates, k)
    };
    for c in chosen {
        answer.push(pool.candidates[c].id);
    }
    pool.fill(&mut answer);
    answer.into_ids()
}
