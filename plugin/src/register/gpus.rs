//! What the plugin publishes as `hami.io/node-amd-gpus`: the facts of each
//! physical GPU that its devices share, once per GPU, keyed by the GPU's PCI
//! address. HAMi never reads it; it keeps `hami.io/node-amd-register` small
//! (a GPU in CPX is eight register entries, and each carried the profile
//! menu and the CRIU properties before).
//!
//! ```json
//! {"0000:05:00.0": {
//!   "partitionProfiles": [{"profileIndex": 3, "partitionType": "cpx",
//!     "memoryCaps": ["nps1", "nps4"], "partitionCount": 8, "xccPerPartition": 1}],
//!   "criu": {"device_id": 29857, "fw_version": 177}}}
//! ```
//!
//! A register entry names its GPU by `custominfo.gpuBDF` (partition devices)
//! or `custominfo.pciBDF` (whole GPUs). Written by the registrar beside the
//! register annotation, in the same merge patch, only when it differs.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::inventory::{Device, Snapshot};

/// The node annotation with each physical GPU's facts.
pub(crate) const GPUS_KEY: &str = "hami.io/node-amd-gpus";

/// The annotation value for the whole snapshot: every physical GPU with at
/// least one fact, from the first of its devices (siblings share them).
pub(crate) fn gpus_annotation(snapshot: &Snapshot) -> String {
    let mut gpus: BTreeMap<&str, Value> = BTreeMap::new();
    for gpu in snapshot.devices() {
        let physical = gpu.physical_bdf();
        if gpus.contains_key(physical) {
            continue;
        }
        let mut facts = Map::new();
        if let Some(menu) = profile_menu(gpu) {
            facts.insert("partitionProfiles".to_owned(), menu);
        }
        if let Some(criu) = restore_props(snapshot, gpu) {
            facts.insert("criu".to_owned(), criu);
        }
        if !facts.is_empty() {
            gpus.insert(physical, Value::Object(facts));
        }
    }
    serde_json::to_string(&gpus).unwrap_or_else(|_| "{}".to_owned())
}

/// `partitionProfiles`: one entry per profile of the GPU, as
/// `amdsmi_set_gpu_accelerator_partition_profile` knows it: its
/// `profileIndex`, the partition type, the memory modes it works with, how
/// many partitions it makes and the XCCs of each. `None` for a GPU without
/// compute partitions.
fn profile_menu(gpu: &Device) -> Option<Value> {
    if gpu.partition_profiles.is_empty() {
        return None;
    }
    let menu = gpu
        .partition_profiles
        .iter()
        .map(|p| {
            let caps: Vec<String> = p
                .memory_modes()
                .iter()
                .map(|m| m.as_str().to_ascii_lowercase())
                .collect();
            json!({
                "profileIndex": p.index,
                "partitionType": p.compute_mode().as_str().to_ascii_lowercase(),
                "memoryCaps": caps,
                "partitionCount": p.partitions.max(1),
                "xccPerPartition": p.xcc_per_partition,
            })
        })
        .collect();
    Some(Value::Array(menu))
}

/// Properties CRIU's amdgpu plugin compares at restore, as published; the
/// others (`domain`, `drm_render_minor`, `hive_id`) differ per device anyway.
const NOT_COMPARED: [&str; 3] = ["domain", "drm_render_minor", "hive_id"];

/// `criu`: the restore properties of the device's first partition (its
/// partitions share them), non-zero ones only, so that a controller can
/// pre-select nodes for a checkpoint without asking amd-gpud on each.
fn restore_props(snapshot: &Snapshot, gpu: &Device) -> Option<Value> {
    let first = snapshot.partitions.get(&gpu.bdf)?.first()?;
    let props: Map<String, Value> = first
        .restore_props
        .iter()
        .filter(|(k, v)| **v != 0 && !NOT_COMPARED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), (*v).into()))
        .collect();
    (!props.is_empty()).then_some(Value::Object(props))
}

#[cfg(test)]
mod tests {
    use ipc::{DmemBackend, types::PartitionProfile};

    use super::*;
    use crate::{
        inventory::partition::{OperatingMode, view},
        testutil::{mi300x, partition},
    };

    fn profile(index: u32, mode: &str, partitions: u32, caps: &[&str]) -> PartitionProfile {
        PartitionProfile {
            index,
            compute_partition: mode.into(),
            memory_partitions: caps.iter().map(|c| (*c).to_owned()).collect(),
            partitions,
            xcc_per_partition: 8 / partitions,
        }
    }

    /// Two MI300X in CPX (eight partitions each) and a Radeon: one entry per
    /// physical GPU, keyed by its address, the menu as AMD SMI numbers it.
    fn cpx_node() -> Snapshot {
        let mut gpus = Vec::new();
        let mut partitions = BTreeMap::new();
        for bus in ["05", "15"] {
            let bdf = format!("0000:{bus}:00.0");
            let mut gpu = mi300x(&bdf, &format!("GPU-{bus}"));
            gpu.compute_partition = "CPX".into();
            gpu.memory_partition = "NPS1".into();
            gpu.partition_profiles = vec![
                profile(0, "SPX", 1, &["NPS1"]),
                profile(3, "CPX", 8, &["NPS1", "NPS4"]),
            ];
            let parts: Vec<_> = (0..8)
                .map(|i| {
                    let mut p = partition(&bdf, i, i32::try_from(i).unwrap());
                    p.bdf = format!("0000:{bus}:00.{i}");
                    p.restore_props =
                        [("fw_version".to_owned(), 177), ("domain".to_owned(), 7)].into();
                    p
                })
                .collect();
            partitions.insert(bdf, parts);
            gpus.push(gpu);
        }
        gpus.push(mi300x("0000:25:00.0", "GPU-25"));
        let raw = Snapshot::from_gpud(&gpus, partitions, DmemBackend::default());
        view(&raw, OperatingMode::Partition)
    }

    #[test]
    fn one_entry_per_physical_gpu_with_the_menu_and_criu() {
        let snapshot = cpx_node();
        assert_eq!(snapshot.devices().len(), 17);
        let value: Value = serde_json::from_str(&gpus_annotation(&snapshot)).unwrap();
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["0000:05:00.0", "0000:15:00.0"], "{value}");
        let gpu = &value["0000:05:00.0"];
        assert_eq!(
            gpu["partitionProfiles"][1],
            json!({"profileIndex": 3, "partitionType": "cpx", "memoryCaps": ["nps1", "nps4"],
                   "partitionCount": 8, "xccPerPartition": 1})
        );
        assert_eq!(
            gpu["criu"],
            json!({"fw_version": 177}),
            "domain is left out"
        );
    }

    #[test]
    fn a_node_without_facts_publishes_an_empty_object() {
        let gpus = [mi300x("0000:05:00.0", "GPU-05")];
        let snapshot = Snapshot::from_gpud(&gpus, BTreeMap::new(), DmemBackend::default());
        assert_eq!(gpus_annotation(&snapshot), "{}");
    }
}
