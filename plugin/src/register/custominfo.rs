//! The `custominfo` keys of a register entry that HAMi's Go AMD plugin
//! (Project-HAMi/amd-device-plugin:internal/pkg/plugin/plugin.go) publishes
//! and its users' tooling reads, in its names and shapes:
//!
//! * `partitionProfiles`: the GPU's compute-partition profile menu, as the Go
//!   plugin marshals AMD SMI's profiles (its `amdsmi.PartitionProfile`, Go
//!   field names, no JSON tags): `{"ProfileIndex": 3, "Type": "CPX",
//!   "MemoryCaps": "NPS1,NPS4", "NumPartitions": 8, "XCCPerPartition": 1}`;
//! * `xgmiPeers`: the PCI addresses of the registered GPUs the GPU reaches
//!   over XGMI, sorted (Project-HAMi/amd-device-plugin:internal/pkg/plugin/xgmi.go);
//! * `computeQueues`: the user compute queue (HQD) slots KFD reports for the
//!   device's node (`num_cp_queues`), when not 0.
//!
//! The menu and the peers are facts of the physical GPU: a GPU in CPX is
//! eight entries, so they go into the first entry of each GPU only (the
//! one whose `pciBDF` is the GPU's address while partition 0 is there), which
//! keeps the annotation for 64 partitions under 24 KiB. `computeQueues` is
//! each device's own (each partition is a KFD node of its own).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use crate::{
    hami::DeviceInfo,
    inventory::{Device, Snapshot},
};

/// `custominfo.partitionProfiles`.
pub(crate) const PARTITION_PROFILES: &str = "partitionProfiles";
/// `custominfo.xgmiPeers`.
pub(crate) const XGMI_PEERS: &str = "xgmiPeers";
/// `custominfo.computeQueues`.
pub(crate) const COMPUTE_QUEUES: &str = "computeQueues";

/// One profile as the Go plugin publishes it.
#[derive(Debug, Serialize)]
struct GoProfile {
    /// What `amdsmi_set_gpu_accelerator_partition_profile` takes.
    #[serde(rename = "ProfileIndex")]
    index: u32,
    /// `SPX`, `DPX`, `TPX`, `QPX` or `CPX`.
    #[serde(rename = "Type")]
    partition_type: String,
    /// The memory modes it works with, upper case, comma-separated.
    #[serde(rename = "MemoryCaps")]
    memory_caps: String,
    /// The partitions it makes.
    #[serde(rename = "NumPartitions")]
    partitions: u32,
    /// The XCCs in each.
    #[serde(rename = "XCCPerPartition")]
    xcc_per_partition: u32,
}

/// The physical GPUs the register lists: the only XGMI peers it names.
pub(crate) fn registered_gpus(snapshot: &Snapshot) -> BTreeSet<&str> {
    snapshot
        .devices()
        .iter()
        .map(Device::physical_bdf)
        .collect()
}

/// Adds the Go plugin's keys to the entry of `device`; `first_of_gpu` says
/// whether it is its physical GPU's first entry.
pub(crate) fn add(
    info: &mut DeviceInfo,
    snapshot: &Snapshot,
    device: &Device,
    first_of_gpu: bool,
    registered: &BTreeSet<&str>,
) {
    let extra = &mut info.custominfo.extra;
    if let Some(queues) = compute_queues(snapshot, device) {
        extra.insert(COMPUTE_QUEUES.to_owned(), queues.into());
    }
    if !first_of_gpu {
        return;
    }
    if let Some(menu) = profile_menu(device) {
        extra.insert(PARTITION_PROFILES.to_owned(), menu);
    }
    let peers: Vec<Value> = device
        .xgmi_peers
        .iter()
        .filter(|p| registered.contains(p.as_str()) && *p != device.physical_bdf())
        .map(|p| p.as_str().into())
        .collect();
    if !peers.is_empty() {
        extra.insert(XGMI_PEERS.to_owned(), Value::Array(peers));
    }
}

/// `num_cp_queues` of the device's KFD node (a whole GPU's first
/// partition, as the Go plugin reads its GPU's node), when known and not 0.
fn compute_queues(snapshot: &Snapshot, device: &Device) -> Option<u64> {
    let node = snapshot.partitions.get(&device.bdf)?.first()?;
    node.restore_props
        .get("num_cp_queues")
        .copied()
        .filter(|&q| q > 0)
}

/// The GPU's profile menu; `None` for a GPU without compute partitions.
fn profile_menu(device: &Device) -> Option<Value> {
    if device.partition_profiles.is_empty() {
        return None;
    }
    let menu: Vec<GoProfile> = device
        .partition_profiles
        .iter()
        .map(|p| GoProfile {
            index: p.index,
            partition_type: p.compute_mode().as_str().to_ascii_uppercase(),
            memory_caps: p
                .memory_modes()
                .iter()
                .map(|m| m.as_str().to_ascii_uppercase())
                .collect::<Vec<_>>()
                .join(","),
            partitions: p.partitions,
            xcc_per_partition: p.xcc_per_partition,
        })
        .collect();
    serde_json::to_value(menu).ok()
}

#[cfg(test)]
mod tests;
