use std::collections::BTreeMap;

use ipc::{
    DmemBackend,
    types::{GpuInfo, Link, PartitionProfile},
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    inventory::{
        Snapshot,
        partition::{OperatingMode, view},
    },
    register::entries::annotation,
    testutil::{mi300x, partition},
};

/// The Go plugin's `amdsmi.PartitionProfile` as `encoding/json` writes it
/// (no JSON tags: the Go field names).
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct GoProfile {
    #[serde(rename = "ProfileIndex")]
    profile_index: i64,
    #[serde(rename = "Type")]
    kind: String,
    #[serde(rename = "MemoryCaps")]
    memory_caps: String,
    #[serde(rename = "NumPartitions")]
    num_partitions: i64,
    #[serde(rename = "XCCPerPartition")]
    xcc_per_partition: i64,
}

fn go(index: i64, kind: &str, caps: &str, partitions: i64, xcc: i64) -> GoProfile {
    GoProfile {
        profile_index: index,
        kind: kind.into(),
        memory_caps: caps.into(),
        num_partitions: partitions,
        xcc_per_partition: xcc,
    }
}

fn profile(index: u32, mode: &str, caps: &[&str], partitions: u32, xcc: u32) -> PartitionProfile {
    PartitionProfile {
        index,
        compute_partition: mode.into(),
        memory_partitions: caps.iter().map(|c| (*c).to_owned()).collect(),
        partitions,
        xcc_per_partition: xcc,
    }
}

/// The MI355X menu of the Go plugin's `TestPartitionProfilesFromFixture`
/// (Project-HAMi/amd-device-plugin:internal/pkg/amdsmi/amdsmi_test.go), as
/// amd-gpud carries it.
fn mi355x_menu() -> Vec<PartitionProfile> {
    vec![
        profile(0, "SPX", &["NPS1"], 1, 8),
        profile(1, "DPX", &["NPS1", "NPS2"], 2, 4),
        profile(2, "QPX", &["NPS1"], 4, 2),
        profile(3, "CPX", &["NPS1"], 8, 1),
    ]
}

fn register(snapshot: &Snapshot) -> Vec<Value> {
    serde_json::from_str(&annotation(snapshot, 0).unwrap()).unwrap()
}

fn xgmi(peer: &str) -> Link {
    Link {
        peer: peer.into(),
        link_type: "xgmi".into(),
        via: "io_link".into(),
        weight: 15,
        hops: 1,
    }
}

fn pcie(peer: &str) -> Link {
    Link {
        link_type: "pcie".into(),
        via: "p2p_link".into(),
        ..xgmi(peer)
    }
}

/// A whole GPU registers its menu in the Go plugin's shape, which decodes
/// into exactly the profiles the Go plugin's tests want, beside the current
/// profile and its KFD node's compute queues.
#[test]
fn a_whole_gpu_carries_the_menu_as_the_go_plugin_marshals_it() {
    let mut gpu = mi300x("0000:75:00.0", "GPU-75");
    (gpu.compute_partition, gpu.memory_partition) = ("SPX".into(), "NPS1".into());
    gpu.partition_profiles = mi355x_menu();
    let mut node = partition("0000:75:00.0", 0, 1);
    node.restore_props = [("num_cp_queues".to_owned(), 24)].into();
    let partitions = BTreeMap::from([("0000:75:00.0".to_owned(), vec![node])]);
    let snapshot = Snapshot::from_gpud(&[gpu], partitions, DmemBackend::default());
    let entry = &register(&snapshot)[0]["custominfo"];
    let menu: Vec<GoProfile> = serde_json::from_value(entry["partitionProfiles"].clone()).unwrap();
    assert_eq!(
        menu,
        [
            go(0, "SPX", "NPS1", 1, 8),
            go(1, "DPX", "NPS1,NPS2", 2, 4),
            go(2, "QPX", "NPS1", 4, 2),
            go(3, "CPX", "NPS1", 8, 1),
        ]
    );
    assert_eq!(
        entry["partitionProfiles"][1],
        json!({"ProfileIndex": 1, "Type": "DPX", "MemoryCaps": "NPS1,NPS2",
               "NumPartitions": 2, "XCCPerPartition": 4})
    );
    assert_eq!(entry["partitionProfile"], "spx_nps1");
    assert_eq!(entry["computeQueues"], 24);
    assert!(entry.get("xgmiPeers").is_none(), "no XGMI link: no key");
}

/// Two MI300X in CPX with XGMI between them, and a third GPU reached over
/// PCIe only.
fn cpx_pair() -> Snapshot {
    let mut gpus: Vec<GpuInfo> = Vec::new();
    let mut partitions = BTreeMap::new();
    for (bus, peer) in [("05", "15"), ("15", "05")] {
        let bdf = format!("0000:{bus}:00.0");
        let mut gpu = mi300x(&bdf, &format!("GPU-{bus}"));
        (gpu.compute_partition, gpu.memory_partition) = ("CPX".into(), "NPS1".into());
        gpu.partition_profiles = mi355x_menu();
        gpu.links = vec![
            xgmi(&format!("0000:{peer}:00.0")),
            pcie("0000:25:00.0"),
            xgmi("0000:f5:00.0"),
        ];
        let parts = (0..8)
            .map(|i| {
                let mut p = partition(&bdf, i, i32::try_from(i).unwrap());
                p.bdf = format!("0000:{bus}:00.{i}");
                p.restore_props = [("num_cp_queues".to_owned(), u64::from(24 + i))].into();
                p
            })
            .collect();
        partitions.insert(bdf, parts);
        gpus.push(gpu);
    }
    gpus.push(mi300x("0000:25:00.0", "GPU-25"));
    Snapshot::from_gpud(&gpus, partitions, DmemBackend::default())
}

/// In partition mode the GPU's facts go into its first entry only (the
/// 24 KiB bound for 64 partitions); each partition has its own queues.
#[test]
fn partitions_carry_the_gpu_facts_once_and_their_own_queues() {
    let raw = cpx_pair();
    let devices = register(&view(&raw, OperatingMode::Partition));
    assert_eq!(devices.len(), 17);
    for (at, entry) in devices.iter().enumerate().take(16) {
        let info = &entry["custominfo"];
        let first = at % 8 == 0;
        assert_eq!(info.get("partitionProfiles").is_some(), first, "{info}");
        assert_eq!(info.get("xgmiPeers").is_some(), first, "{info}");
        assert_eq!(info["computeQueues"], 24 + at % 8, "{info}");
        assert_eq!(info["partitionProfile"], "cpx_nps1");
    }
    assert_eq!(devices[0]["custominfo"]["pciBDF"], "0000:05:00.0");
    assert_eq!(
        devices[0]["custominfo"]["partitionProfiles"][3]["Type"],
        "CPX"
    );
    // Peers are registered GPUs, by address: not 0000:f5:00.0 (no device
    // here), not the PCIe-only 0000:25:00.0.
    assert_eq!(
        devices[0]["custominfo"]["xgmiPeers"],
        json!(["0000:15:00.0"])
    );
    assert_eq!(
        devices[8]["custominfo"]["xgmiPeers"],
        json!(["0000:05:00.0"])
    );
    assert!(devices[16]["custominfo"].get("xgmiPeers").is_none());
    // In cu mode each whole GPU has both, as the Go plugin's soft entries.
    let whole = register(&raw);
    assert_eq!(whole.len(), 3);
    assert_eq!(whole[1]["custominfo"]["xgmiPeers"], json!(["0000:05:00.0"]));
    assert_eq!(
        whole[1]["custominfo"]["partitionProfiles"][0]["ProfileIndex"],
        0
    );
    assert_eq!(whole[1]["custominfo"]["computeQueues"], 24);
}

/// Partition 0 gone: the GPU's facts move to its first listed partition.
#[test]
fn the_first_live_partition_carries_the_gpu_facts() {
    let mut raw = cpx_pair();
    let parts = raw.partitions.get_mut("0000:05:00.0").unwrap();
    parts[0].health = ipc::MISSING.into();
    let devices = register(&view(&raw, OperatingMode::Partition));
    assert_eq!(devices[0]["custominfo"]["pciBDF"], "0000:05:00.1");
    assert!(devices[0]["custominfo"].get("partitionProfiles").is_some());
    assert!(devices[1]["custominfo"].get("partitionProfiles").is_none());
}

/// The Go plugin's MI210 fixture as its `TestAddXGMIPeers` describes it:
/// eight GPUs (KFD nodes 2-9 at `0000:<n+0x10>:00.0`), each reaching three
/// others over XGMI and the rest over PCIe; peers are listed from both
/// ends, sorted, never the GPU itself.
#[test]
fn eight_mi210_with_three_xgmi_peers_each() {
    let bdf = |n: u32| format!("0000:{:02x}:00.0", n + 0x10);
    // Nodes 2-9 as the corners of a cube: neighbours differ in one bit.
    let gpus: Vec<GpuInfo> = (2..=9)
        .map(|n| {
            let mut gpu = mi300x(&bdf(n), "");
            gpu.links = (2..=9)
                .filter(|&m| m != n)
                .map(|m| {
                    let one_bit = ((n - 2) ^ (m - 2)).count_ones() == 1;
                    if one_bit {
                        xgmi(&bdf(m))
                    } else {
                        pcie(&bdf(m))
                    }
                })
                .collect();
            gpu
        })
        .collect();
    let snapshot = Snapshot::from_gpud(&gpus, BTreeMap::new(), DmemBackend::default());
    let devices = register(&snapshot);
    let peers = |i: usize| -> Vec<String> {
        serde_json::from_value(devices[i]["custominfo"]["xgmiPeers"].clone()).unwrap()
    };
    for i in 0..8 {
        let mine = peers(i);
        assert_eq!(mine.len(), 3, "{mine:?}");
        assert!(mine.is_sorted());
        assert!(!mine.contains(&bdf(u32::try_from(i).unwrap() + 2)));
        for peer in &mine {
            let j = devices
                .iter()
                .position(|d| d["custominfo"]["pciBDF"] == peer.as_str())
                .unwrap();
            assert!(peers(j).contains(&bdf(u32::try_from(i).unwrap() + 2)));
        }
    }
    assert_eq!(peers(0), [bdf(3), bdf(4), bdf(6)]);
}
