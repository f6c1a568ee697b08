//! What the node offers: from amd-gpud's GPUs to the kubelet devices and
//! the topology GetPreferredAllocation ranks.
//!
//! * here: the [`Snapshot`] of amd-gpud's inventory as followed, the
//!   [`DeviceTable`] kubelet's ListAndWatch serves, and the GPU id;
//! * [`partition`]: the view of the inventory in partition mode;
//! * [`ids`]: every name a device has been published under;
//! * [`health`]: Node Events for GPU health transitions.
//!
//! Each GPU is offered as `count` devices `<gpu-id>#<slot>`. The GPU id is
//! stable across restarts and reboots and free of `,` `:` `;` (HAMi's
//! separators): AMD SMI's UUID when known, else ROCr's UUID, else one derived
//! from the PCI address.

pub(crate) mod health;
pub(crate) mod ids;
pub(crate) mod partition;

use std::collections::{BTreeMap, HashMap};

use ipc::types::{GpuInfo, PartitionInfo};

use crate::preferred::{self, GpuTopology, Link, LinkKind};

/// The inventory as last read from amd-gpud.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// GPUs ordered by PCI address, missing ones included (health `Missing`).
    pub gpus: Vec<GpuInfo>,
    /// Each GPU's partitions (one when unpartitioned), by the GPU's PCI address.
    pub partitions: BTreeMap<String, Vec<PartitionInfo>>,
    /// Whether amd-gpud answered the last time we asked.
    pub connected: bool,
    /// amd-gpud's VRAM cap backend: `on`, or `off: <reason>`.
    pub dmem_backend: String,
    /// In partition mode, each partition device's key (its own PCI address,
    /// from KFD) to its physical GPU's; empty otherwise.
    pub parents: BTreeMap<String, String>,
}

impl Snapshot {
    /// The physical GPU's PCI address of device `bdf` (itself unless it is a
    /// partition device).
    pub(crate) fn physical_bdf<'a>(&'a self, bdf: &'a str) -> &'a str {
        self.parents.get(bdf).map_or(bdf, String::as_str)
    }

    /// Whether device `bdf` is a compute partition allocated whole.
    pub(crate) fn is_partition(&self, bdf: &str) -> bool {
        self.parents.contains_key(bdf)
    }

    /// Whether amd-gpud can cap VRAM.
    pub(crate) fn dmem_on(&self) -> bool {
        self.connected && self.dmem_backend == "on"
    }
}

/// One kubelet device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub id: String,
    pub healthy: bool,
    pub numa: Option<i64>,
}

/// Everything kubelet-facing derived from one snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceTable {
    pub slots: Vec<Slot>,
    pub topology: Vec<GpuTopology>,
}

/// The id a GPU is known by to kubelet and HAMi: the one amd-gpud publishes
/// it under (chosen once and kept across AMD SMI failures and restarts,
/// gpud/src/published_ids.rs); from an amd-gpud too old to say, the AMD SMI
/// UUID, the ROCr UUID or the PCI address, whichever is there.
pub(crate) fn gpu_id(gpu: &GpuInfo) -> String {
    let clean = |s: &str| !s.is_empty() && !s.contains([',', ':', ';', '#']);
    if clean(&gpu.published_id) {
        gpu.published_id.clone()
    } else if clean(&gpu.amdsmi_uuid) {
        gpu.amdsmi_uuid.clone()
    } else if clean(&gpu.rocr_uuid) {
        gpu.rocr_uuid.clone()
    } else {
        format!("amdgpu-{}", gpu.bdf.replace([':', '.'], "-"))
    }
}

/// Devices per GPU when `--split-count 0`: 2 on gfx12 and later, else 10.
pub(crate) fn default_split(gfx: &str) -> u32 {
    let digits = gfx.strip_prefix("gfx").unwrap_or_default();
    // The last two characters are minor and stepping; the rest is the major.
    let major = digits
        .get(..digits.len().saturating_sub(2))
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if major >= 12 { 2 } else { 10 }
}

/// Kubelet devices (and HAMi's `count`) of a whole GPU: the split count
/// (0: the per-GPU default), but never more than the GPU's allocation units
/// (CUs, or WGPs on gfx10+). A slot that can get no CU of its own cannot
/// be served: a 2-CU gfx10 iGPU has one WGP, so it offers one slot, not 10.
pub(crate) fn slots_of(gpu: &GpuInfo, split_count: u32) -> u32 {
    let wanted = if split_count == 0 {
        default_split(&gpu.gfx)
    } else {
        split_count
    };
    let units = gpu.compute_units / gpu.cus_per_wgp.max(1);
    wanted.min(units.max(1))
}

impl DeviceTable {
    /// Builds the table; `split_count` 0 means the per-GPU default.
    pub fn build(snapshot: &Snapshot, split_count: u32) -> Self {
        let ids: HashMap<&str, String> = snapshot
            .gpus
            .iter()
            .map(|g| (g.bdf.as_str(), gpu_id(g)))
            .collect();
        let mut table = Self::default();
        for gpu in &snapshot.gpus {
            let id = gpu_id(gpu);
            let count = if snapshot.is_partition(&gpu.bdf) {
                1
            } else {
                slots_of(gpu, split_count)
            };
            let numa = (gpu.numa_node >= 0).then_some(i64::from(gpu.numa_node));
            let healthy = gpu.health == ipc::HEALTHY;
            table.slots.extend((0..count).map(|slot| Slot {
                id: preferred::slot_id(&id, slot),
                healthy,
                numa,
            }));
            table.topology.push(GpuTopology {
                numa: u32::try_from(gpu.numa_node).ok(),
                links: gpu
                    .links
                    .iter()
                    .filter_map(|l| {
                        Some(Link {
                            peer: ids.get(l.peer.as_str())?.clone(),
                            kind: match l.link_type.as_str() {
                                "xgmi" => LinkKind::Xgmi,
                                "pcie" => LinkKind::Pcie,
                                _ => LinkKind::Other,
                            },
                            hops: l.hops,
                        })
                    })
                    .collect(),
                id,
            });
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_offers_no_more_slots_than_it_has_cu_units() {
        let mut igpu = crate::testutil::mi300x("0000:7c:00.0", "");
        (igpu.gfx, igpu.compute_units, igpu.cus_per_wgp) = ("gfx1036".into(), 2, 2);
        assert_eq!(slots_of(&igpu, 0), 1, "one WGP, one slot");
        assert_eq!(slots_of(&igpu, 4), 1, "an explicit split too");
        igpu.compute_units = 8;
        assert_eq!(slots_of(&igpu, 0), 4);
        let mi300x = crate::testutil::mi300x("0000:05:00.0", "GPU-1");
        assert_eq!(slots_of(&mi300x, 0), 10);
        assert_eq!(slots_of(&mi300x, 304), 304);
    }

    #[test]
    fn split_defaults_follow_the_gfx_major() {
        assert_eq!(default_split("gfx942"), 10);
        assert_eq!(default_split("gfx90a"), 10);
        assert_eq!(default_split("gfx1036"), 10);
        assert_eq!(default_split("gfx1201"), 2);
        assert_eq!(default_split("gfx1200"), 2);
        assert_eq!(default_split(""), 10);
    }
}
