//! What the node offers: from amd-gpud's GPUs to the kubelet devices and
//! the topology GetPreferredAllocation ranks.
//!
//! * here: the [`Snapshot`] of amd-gpud's inventory as followed and the
//!   [`DeviceTable`] kubelet's ListAndWatch serves;
//! * [`device`]: the plugin's model of one device (a whole GPU or a
//!   partition), with its id;
//! * [`partition`]: the view of the inventory in partition mode;
//! * [`ids`]: every name a device has been published under;
//! * [`exclude`]: the GPUs `--exclude-gpus` keeps out of everything;
//! * [`health`]: Node Events for GPU health transitions.
//!
//! Each GPU is offered as `count` devices `<gpu-id>#<slot>`. The GPU id is
//! stable across restarts and reboots and free of `,` `:` `;` (HAMi's
//! separators): AMD SMI's UUID when known, else ROCr's UUID, else one derived
//! from the PCI address.

pub(crate) mod device;
pub(crate) mod exclude;
pub(crate) mod health;
pub(crate) mod ids;
pub(crate) mod partition;

use std::collections::{BTreeMap, HashMap};

pub(crate) use device::Device;
use ipc::{
    DmemBackend,
    types::{GpuInfo, PartitionInfo},
};

use crate::preferred::{self, GpuTopology, Link, LinkKind};

/// The inventory as last read from amd-gpud, as [`Device`]s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Devices ordered by PCI address, missing ones included (health `Missing`).
    devices: Vec<Device>,
    /// Each id's position in `devices` (the first device with it).
    by_id: HashMap<String, usize>,
    /// Each device's partitions (one when unpartitioned; its own for a
    /// partition device), by the device's PCI address.
    pub(crate) partitions: BTreeMap<String, Vec<PartitionInfo>>,
    /// Whether amd-gpud answered the last time we asked.
    pub(crate) connected: bool,
    /// amd-gpud's VRAM cap backend.
    pub(crate) dmem: DmemBackend,
}

impl Snapshot {
    /// amd-gpud's answer: every GPU whole, each GPU's partitions by its PCI
    /// address, and the VRAM cap backend; connected.
    pub fn from_gpud(
        gpus: &[GpuInfo],
        partitions: BTreeMap<String, Vec<PartitionInfo>>,
        dmem: DmemBackend,
    ) -> Self {
        let devices = gpus.iter().map(Device::whole).collect();
        Self::new(devices, partitions, true, dmem)
    }

    /// A snapshot of `devices` (in PCI order) and their `partitions`.
    pub(crate) fn new(
        devices: Vec<Device>,
        partitions: BTreeMap<String, Vec<PartitionInfo>>,
        connected: bool,
        dmem: DmemBackend,
    ) -> Self {
        let mut snapshot = Self {
            devices,
            by_id: HashMap::new(),
            partitions,
            connected,
            dmem,
        };
        snapshot.index();
        snapshot
    }

    fn index(&mut self) {
        self.by_id.clear();
        for (at, device) in self.devices.iter().enumerate() {
            self.by_id.entry(device.id.clone()).or_insert(at);
        }
    }

    /// Every device, in PCI order.
    pub(crate) fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The device known as `id`.
    pub(crate) fn device(&self, id: &str) -> Option<&Device> {
        self.by_id.get(id).and_then(|&at| self.devices.get(at))
    }

    /// Adds `devices`, keeping the devices in PCI order.
    pub(crate) fn add(&mut self, devices: Vec<Device>) {
        if devices.is_empty() {
            return;
        }
        self.devices.extend(devices);
        self.devices.sort_by(|a, b| a.bdf.cmp(&b.bdf));
        self.index();
    }

    /// Whether amd-gpud can cap VRAM.
    pub(crate) fn dmem_on(&self) -> bool {
        self.connected && self.dmem.is_on()
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
pub(crate) fn slots_of(gpu: &Device, split_count: u32) -> u32 {
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
        let ids: HashMap<&str, &str> = snapshot
            .devices()
            .iter()
            .map(|d| (d.bdf.as_str(), d.id.as_str()))
            .collect();
        let mut table = Self::default();
        for device in snapshot.devices() {
            let count = if device.is_partition() {
                1
            } else {
                slots_of(device, split_count)
            };
            let numa = (device.numa_node >= 0).then_some(i64::from(device.numa_node));
            let healthy = device.health.is_healthy();
            table.slots.extend((0..count).map(|slot| Slot {
                id: preferred::slot_id(&device.id, slot),
                healthy,
                numa,
            }));
            table.topology.push(GpuTopology {
                numa: u32::try_from(device.numa_node).ok(),
                links: device
                    .links
                    .iter()
                    .filter_map(|l| {
                        Some(Link {
                            peer: (*ids.get(l.peer.as_str())?).to_owned(),
                            kind: match l.link_type.as_str() {
                                "xgmi" => LinkKind::Xgmi,
                                "pcie" => LinkKind::Pcie,
                                _ => LinkKind::Other,
                            },
                            hops: l.hops,
                        })
                    })
                    .collect(),
                id: device.id.clone(),
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
        let mut igpu = Device::whole(&crate::testutil::mi300x("0000:7c:00.0", ""));
        (igpu.gfx, igpu.compute_units, igpu.cus_per_wgp) = ("gfx1036".into(), 2, 2);
        assert_eq!(slots_of(&igpu, 0), 1, "one WGP, one slot");
        assert_eq!(slots_of(&igpu, 4), 1, "an explicit split too");
        igpu.compute_units = 8;
        assert_eq!(slots_of(&igpu, 0), 4);
        let mi300x = Device::whole(&crate::testutil::mi300x("0000:05:00.0", "GPU-1"));
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
