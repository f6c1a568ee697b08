//! Every name a device of this node has been published under, resolved to
//! the one it has now.
//!
//! HAMi's pod annotations carry device IDs as they were published when the
//! pod was placed. A node upgraded from HAMi's Go AMD plugin holds grants
//! and CU records keyed by that plugin's IDs: the AMD SMI UUID for a whole
//! GPU, and for a partition `GPU-<unique_id>` or `<rocr-uuid>#<mode>`
//! (Project-HAMi/amd-device-plugin:internal/pkg/plugin/plugin.go). Our own
//! IDs (amd-gpud's `PublishedId`, `<id>-<mode><n>` for partitions) may
//! differ, and an older amd-gpud published the ROCr UUID or
//! `amdgpu-<pci address>` instead. [`Aliases`] maps each of these forms to
//! the current ID, so that no record is lost and no CU is granted twice
//! under two names. A form that names several devices (the eight CPX
//! partitions of an MI300X share one `unique_id`) is refused with the
//! candidates, never guessed.
//!
//! HAMi up to v2.9 did not read the register annotation for AMD: it made
//! up `<node>-AMDGPU-<n>` over the node's `amd.com/gpu` capacity, and wrote
//! those into the pod annotations. The Go plugin resolves `n` as the n-th
//! kubelet device in its list order, GPU `sorted[n / split]`
//! (Project-HAMi/amd-device-plugin:internal/pkg/plugin/plugin.go,
//! `parseAMDGPUIndex`; its test `TestResolveUpstreamAMDGPUIndex`). Here it
//! is the n-th of our kubelet devices in the order ListAndWatch sends
//! them: devices in PCI order, each with its slot count
//! ([`Aliases::with_hami_indices`]); the same GPU when every GPU has the
//! same count, and still the device kubelet's n-th slot belongs to when
//! counts differ (`--split-count 0` on a mixed node).

use std::collections::{BTreeSet, HashMap};

use super::{Device, Snapshot, device::bdf_id};
use crate::hami::ContainerDevice;

/// Why an ID names no single device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unresolved {
    #[error("device {id:?} is not on this node")]
    Unknown { id: String },
    #[error(
        "device {id:?} names {} devices on this node ({}); cannot tell which",
        candidates.len(),
        candidates.join(", ")
    )]
    Ambiguous { id: String, candidates: Vec<String> },
}

/// Alias -> the current IDs it can name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Aliases {
    current: BTreeSet<String>,
    others: HashMap<String, BTreeSet<String>>,
    /// Each device's id and kubelet slot count, in ListAndWatch's order,
    /// for HAMi's `<node>-AMDGPU-<n>`; empty when not asked for.
    slots: Vec<(String, u32)>,
}

impl Aliases {
    /// The aliases of every device of `snapshot` (the view kubelet and
    /// HAMi see: partitions replace their GPU in partition mode).
    pub(crate) fn of(snapshot: &Snapshot) -> Self {
        let mut aliases = Self::default();
        for device in snapshot.devices() {
            aliases.current.insert(device.id.clone());
            for other in older_names(device) {
                let ids = aliases.others.entry(other).or_default();
                ids.insert(device.id.clone());
            }
        }
        aliases
    }

    /// These aliases, and HAMi (up to v2.9)'s `<node>-AMDGPU-<n>`: the
    /// device of kubelet's `n`-th slot, `split_count` as `--split-count`.
    pub(crate) fn with_hami_indices(mut self, snapshot: &Snapshot, split_count: u32) -> Self {
        self.slots = snapshot
            .devices()
            .iter()
            .map(|d| {
                let count = if d.is_partition() {
                    1
                } else {
                    super::slots_of(d, split_count)
                };
                (d.id.clone(), count)
            })
            .collect();
        self
    }

    /// The device HAMi's `<node>-AMDGPU-<n>` names, if `id` is one and `n`
    /// is within the node's slots.
    fn hami_index(&self, id: &str) -> Option<&str> {
        let (node, n) = id.rsplit_once(HAMI_INDEX)?;
        if node.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut n: u64 = n.parse().ok()?;
        for (device, count) in &self.slots {
            match n.checked_sub(u64::from(*count)) {
                Some(rest) => n = rest,
                None => return Some(device),
            }
        }
        None
    }

    /// The current ID `id` names: itself when it is one, else the single
    /// device it is an older name of.
    ///
    /// # Errors
    /// When it names no device or several.
    pub(crate) fn resolve(&self, id: &str) -> Result<String, Unresolved> {
        if self.current.contains(id) {
            return Ok(id.to_owned());
        }
        if let Some(device) = self.hami_index(id) {
            return Ok(device.to_owned());
        }
        let candidates = self
            .others
            .get(id)
            .map(|c| c.iter().cloned().collect::<Vec<_>>());
        match candidates.as_deref() {
            Some([one]) => Ok(one.clone()),
            Some(many) if !many.is_empty() => Err(Unresolved::Ambiguous {
                id: id.to_owned(),
                candidates: many.to_vec(),
            }),
            _ => Err(Unresolved::Unknown { id: id.to_owned() }),
        }
    }

    /// `id` resolved, or `id` itself when it names no single device (the
    /// caller then reports it as not on this node).
    pub(crate) fn current_or_same(&self, id: &str) -> String {
        self.resolve(id).unwrap_or_else(|_| id.to_owned())
    }
}

/// What separates the node from the index in HAMi's (up to v2.9) AMD ids.
const HAMI_INDEX: &str = "-AMDGPU-";

/// Renames each device of `entry` (a HAMi grant) to its current ID, so that
/// a grant made under an older name is served on the device it names. A
/// name no device has is left as it is (the caller reports the GPU
/// missing).
///
/// # Errors
/// [`Unresolved::Ambiguous`] for a name several devices share.
pub(crate) fn rename_current(
    aliases: &Aliases,
    entry: &mut [ContainerDevice],
) -> Result<(), Unresolved> {
    for device in entry {
        match aliases.resolve(&device.uuid) {
            Ok(current) => device.uuid = current,
            Err(err @ Unresolved::Ambiguous { .. }) => return Err(err),
            Err(Unresolved::Unknown { .. }) => {}
        }
    }
    Ok(())
}

/// The names `device` may have been published under before.
fn older_names(device: &Device) -> Vec<String> {
    let mut names = vec![bdf_id(&device.bdf)];
    let mut push = |s: &str| {
        if !s.is_empty() {
            names.push(s.to_owned());
        }
    };
    if device.is_partition() {
        // A partition device carries its parent's unique_id; the Go
        // plugin's partition IDs are built from it and the mode.
        if let Some(rocr) = rocr_uuid(&device.unique_id) {
            let mode = device.compute_mode_str();
            for mode in [mode.to_ascii_lowercase(), mode.to_ascii_uppercase()] {
                push(&format!("{rocr}#{mode}"));
            }
            push(&rocr);
        }
    } else {
        push(&device.amdsmi_uuid);
        push(&device.rocr_uuid);
    }
    names
}

/// ROCr's `GPU-<16 hex digits>` of a decimal `unique_id`; none for 0.
fn rocr_uuid(unique_id: &str) -> Option<String> {
    let id: u64 = unique_id.parse().ok().filter(|id| *id != 0)?;
    Some(format!("GPU-{id:016x}"))
}

#[cfg(test)]
mod tests;
