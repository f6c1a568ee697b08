use std::collections::BTreeMap;

use ipc::{DmemBackend, types::GpuInfo};

use super::*;
use crate::{
    inventory::partition::{self, OperatingMode},
    testutil,
};

const UUID: &str = "6eff74a1-0000-1000-80aa-d3b1c6a5e0ff";

fn mi300x() -> GpuInfo {
    let mut gpu = testutil::mi300x("0000:05:00.0", "GPU-8ecb9de71e8aa497");
    gpu.published_id = UUID.into();
    gpu.amdsmi_uuid = UUID.into();
    gpu.unique_id = u64::from_str_radix("8ecb9de71e8aa497", 16)
        .unwrap()
        .to_string();
    gpu
}

fn whole() -> Snapshot {
    let gpu = mi300x();
    let partitions = BTreeMap::from([(gpu.bdf.clone(), vec![])]);
    Snapshot::from_gpud(&[gpu], partitions, DmemBackend::default())
}

/// The MI300X in `mode` with `parts`, as partition mode sees it.
fn partitioned(mode: &str, parts: Vec<ipc::types::PartitionInfo>) -> Snapshot {
    let mut gpu = mi300x();
    gpu.compute_partition = mode.into();
    let partitions = BTreeMap::from([(gpu.bdf.clone(), parts)]);
    let node = Snapshot::from_gpud(&[gpu], partitions, DmemBackend::default());
    partition::view(&node, OperatingMode::Partition)
}

#[test]
fn every_form_a_whole_gpu_was_published_under_names_it() {
    let aliases = Aliases::of(&whole());
    for old in [UUID, "GPU-8ecb9de71e8aa497", "amdgpu-0000-05-00-0"] {
        assert_eq!(aliases.resolve(old).as_deref(), Ok(UUID), "{old}");
    }
    assert_eq!(
        aliases.resolve("GPU-ffff"),
        Err(Unresolved::Unknown {
            id: "GPU-ffff".into()
        })
    );
}

#[test]
fn a_go_partition_id_that_names_eight_partitions_is_refused_with_them() {
    let parts = (0..8)
        .map(|i| testutil::partition(&format!("0000:05:00.{i}"), i, 0))
        .collect();
    let view = partitioned("CPX", parts);
    let aliases = Aliases::of(&view);
    let current = format!("{UUID}-cpx3");
    assert_eq!(aliases.resolve(&current).as_deref(), Ok(current.as_str()));
    for old in ["GPU-8ecb9de71e8aa497", "GPU-8ecb9de71e8aa497#cpx"] {
        let err = aliases.resolve(old).unwrap_err();
        let Unresolved::Ambiguous { candidates, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(candidates.len(), 8, "{err}");
        assert!(err.to_string().contains(&format!("{UUID}-cpx0")), "{err}");
    }
    // Each partition's own PCI function still names exactly one.
    assert_eq!(
        aliases.resolve("amdgpu-0000-05-00-3").as_deref(),
        Ok(current.as_str())
    );
}

#[test]
fn a_single_partition_named_the_go_way_resolves() {
    let view = partitioned("SPX", vec![testutil::partition("0000:05:00.0", 0, 0)]);
    let aliases = Aliases::of(&view);
    let want = format!("{UUID}-spx0");
    assert_eq!(
        aliases.resolve("GPU-8ecb9de71e8aa497#spx").as_deref(),
        Ok(want.as_str())
    );
    assert_eq!(
        aliases.resolve("GPU-8ecb9de71e8aa497").as_deref(),
        Ok(want.as_str())
    );
}

#[test]
fn a_grant_under_an_older_name_is_served_under_the_current_one() {
    let aliases = Aliases::of(&whole());
    let device = |uuid: &str| ContainerDevice {
        uuid: uuid.into(),
        device_type: "AMD Instinct MI300X".into(),
        usedmem: 1024,
        usedcores: 38,
    };
    let mut entry = vec![device("GPU-8ecb9de71e8aa497"), device("GPU-elsewhere")];
    rename_current(&aliases, &mut entry).unwrap();
    assert_eq!(entry[0].uuid, UUID);
    assert_eq!(
        entry[1].uuid, "GPU-elsewhere",
        "left for the caller to report"
    );
}

/// Four MI300X at increasing PCI addresses, the second one gfx12-like with
/// fewer slots when the split is per GPU.
fn four_gpus() -> Snapshot {
    let gpus: Vec<GpuInfo> = [
        "0000:05:00.0",
        "0000:15:00.0",
        "0000:25:00.0",
        "0000:35:00.0",
    ]
    .iter()
    .enumerate()
    .map(|(i, bdf)| {
        let mut gpu = testutil::mi300x(bdf, &format!("GPU-{i:016x}"));
        gpu.published_id = format!("GPU-{i:016x}");
        gpu
    })
    .collect();
    Snapshot::from_gpud(&gpus, BTreeMap::new(), DmemBackend::default())
}

/// HAMi up to v2.9 wrote `<node>-AMDGPU-<n>`; as in the Go plugin's
/// `TestResolveUpstreamAMDGPUIndex` (split 10), `n = split + 1` is the
/// second GPU, `2 * split` the third, and ids past the node's slots or
/// without a number name nothing.
#[test]
fn hami_v2_9_ids_name_the_gpu_of_that_kubelet_slot() {
    let node = four_gpus();
    let aliases = Aliases::of(&node).with_hami_indices(&node, 10);
    let gpu = |i: usize| format!("GPU-{i:016x}");
    for (n, want) in [(0, 0), (9, 0), (11, 1), (20, 2), (39, 3)] {
        let id = format!("node-AMDGPU-{n}");
        assert_eq!(aliases.resolve(&id), Ok(gpu(want)), "{id}");
    }
    for id in [
        "node-AMDGPU-40",
        "node-AMDGPU-x",
        "node-AMDGPU-",
        "-AMDGPU-3",
        "plain",
    ] {
        assert!(aliases.resolve(id).is_err(), "{id}");
    }
    // Another split count moves the boundaries with it.
    let aliases = Aliases::of(&node).with_hami_indices(&node, 4);
    assert_eq!(aliases.resolve("gpu-node-1-AMDGPU-5"), Ok(gpu(1)));
    // Without the slots (the VRAM path), nothing is guessed.
    assert!(Aliases::of(&node).resolve("node-AMDGPU-0").is_err());
}

/// Slots differ per GPU (a gfx12 GPU offers 2 with `--split-count 0`):
/// `n` still follows kubelet's list.
#[test]
fn hami_ids_follow_uneven_slot_counts() {
    let mut node = four_gpus();
    let mut devices = node.devices().to_vec();
    devices[0].gfx = "gfx1201".into();
    node = Snapshot::new(devices, BTreeMap::new(), true, DmemBackend::default());
    let aliases = Aliases::of(&node).with_hami_indices(&node, 0);
    assert_eq!(
        aliases.resolve("n-AMDGPU-1").as_deref(),
        Ok("GPU-0000000000000000")
    );
    assert_eq!(
        aliases.resolve("n-AMDGPU-2").as_deref(),
        Ok("GPU-0000000000000001")
    );
    assert_eq!(
        aliases.resolve("n-AMDGPU-12").as_deref(),
        Ok("GPU-0000000000000002")
    );
}
