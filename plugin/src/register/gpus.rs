//! What the plugin publishes as `hami.io/node-amd-gpus`: the facts of each
//! physical GPU that have no place in HAMi's register annotation, once per
//! GPU, keyed by the GPU's PCI address. Today that is what CRIU's amdgpu
//! plugin compares at restore. HAMi never reads it.
//!
//! ```json
//! {"0000:05:00.0": {"criu": {"device_id": 29857, "fw_version": 177}}}
//! ```
//!
//! A register entry names its GPU by `custominfo.gpuBDF` (partition devices)
//! or `custominfo.pciBDF` (whole GPUs). Written by the registrar beside the
//! register annotation, in the same merge patch, only when it differs.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::inventory::{Device, Snapshot};

/// The node annotation with each physical GPU's facts.
pub(crate) const GPUS_KEY: &str = "hami.io/node-amd-gpus";

/// The annotation value for the whole snapshot: every physical GPU with
/// CRIU facts, from the first of its devices (siblings share them).
pub(crate) fn gpus_annotation(snapshot: &Snapshot) -> String {
    let mut gpus: BTreeMap<&str, Value> = BTreeMap::new();
    for gpu in snapshot.devices() {
        let physical = gpu.physical_bdf();
        if gpus.contains_key(physical) {
            continue;
        }
        let mut facts = Map::new();
        if let Some(criu) = restore_props(snapshot, gpu) {
            facts.insert("criu".to_owned(), criu);
        }
        if !facts.is_empty() {
            gpus.insert(physical, Value::Object(facts));
        }
    }
    serde_json::to_string(&gpus).unwrap_or_else(|_| "{}".to_owned())
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

    /// Two MI300X in CPX (eight partitions each, with a profile menu) and a
    /// GPU without facts: one entry per physical GPU with CRIU facts.
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
    fn one_entry_per_physical_gpu_with_its_criu_facts() {
        let snapshot = cpx_node();
        assert_eq!(snapshot.devices().len(), 17);
        let value: Value = serde_json::from_str(&gpus_annotation(&snapshot)).unwrap();
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["0000:05:00.0", "0000:15:00.0"], "{value}");
        // The profile menu went back into the register annotation (the Go
        // plugin's `custominfo.partitionProfiles`): only CRIU's facts stay.
        assert_eq!(
            value["0000:05:00.0"],
            serde_json::json!({"criu": {"fw_version": 177}}),
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
