//! The inventory of every builder fixture, with DRM/PCI sysfs and the fake AMD
//! SMI (7.x layout), and again from the KFD topology alone.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use gpud::testing::inventory::Inventory;
use tests::fixture::{self, BuildOptions, NodeSpec};

fn build(
    name: &str,
    opts: &BuildOptions,
) -> (NodeSpec, Inventory, serde_json::Value, tempfile::TempDir) {
    let spec = fixture::named(name).unwrap_or_else(|| panic!("no fixture {name}"));
    let dir = tests::fixture::scratch_dir().unwrap();
    let node = fixture::build(&spec, dir.path(), opts).unwrap();
    let amdsmi = match &node.amdsmi_fixture {
        Some(f) => common::fake_amdsmi(f, Duration::from_secs(30)),
        None => common::no_amdsmi(),
    };
    let inv = common::inventory(dir.path(), &amdsmi);
    let json = common::redacted(&inv, &[(dir.path(), "<root>")]);
    (spec, inv, json, dir)
}

fn full() -> BuildOptions {
    BuildOptions {
        drm: true,
        amdsmi_abi: Some("7.0".into()),
    }
}

fn kfd_only() -> BuildOptions {
    BuildOptions {
        drm: false,
        amdsmi_abi: None,
    }
}

/// What every fixture must round-trip: addresses, CUs, partitions, identity.
fn assert_matches_spec(spec: &NodeSpec, inv: &Inventory) {
    assert_eq!(inv.gpus.len(), spec.gpus.len(), "{}", spec.name);
    let mut specs: Vec<_> = spec.gpus.iter().collect();
    specs.sort_by_key(|g| g.bdf());
    for (gpu, want) in inv.gpus.iter().zip(specs) {
        assert_eq!(gpu.bdf.to_string(), want.bdf());
        assert_eq!(
            gpu.partitions.len(),
            want.partitions() as usize,
            "{}",
            gpu.bdf
        );
        assert_eq!(gpu.compute_units, want.model.total_cus, "{}", gpu.bdf);
        assert_eq!(gpu.unique_id, want.unique_id);
        let uuid = (want.unique_id != 0).then(|| format!("GPU-{:016x}", want.unique_id));
        assert_eq!(gpu.rocr_uuid, uuid);
        for (i, part) in gpu.partitions.iter().enumerate() {
            assert_eq!(part.index as usize, i);
            assert_eq!(part.compute_units, want.partition_cus());
            assert_eq!(
                part.bdf.function as usize,
                if want.partitions() > 1 { i } else { 0 }
            );
        }
        let bdf = gpu.bdf.to_string();
        let about_it: Vec<_> = inv.warnings.iter().filter(|w| w.contains(&bdf)).collect();
        assert!(about_it.is_empty(), "{}: {about_it:?}", spec.name);
    }
}

#[test]
fn every_fixture_round_trips_with_and_without_drm() {
    for name in fixture::names() {
        let (spec, inv, _, _dir) = build(name, &full());
        assert_matches_spec(&spec, &inv);
        assert_eq!(inv.amdsmi.state, "loaded", "{name}: {}", inv.amdsmi.detail);
        let (spec, inv, _, _dir) = build(name, &kfd_only());
        assert_matches_spec(&spec, &inv);
        assert_eq!(inv.amdsmi.state, "disabled");
    }
}

#[test]
fn every_fixture_snapshot() {
    for name in fixture::names() {
        let (_, _, json, _dir) = build(name, &full());
        insta::assert_json_snapshot!(format!("fixture-{name}"), json);
    }
}

#[test]
fn mi300x_spx_has_whole_gpus_numa_and_amdsmi_identity() {
    let (_, inv, _, _dir) = build("mi300x-8-spx", &full());
    for (i, gpu) in inv.gpus.iter().enumerate() {
        assert_eq!(gpu.gfx.map(|g| g.to_string()).as_deref(), Some("gfx942"));
        assert_eq!(gpu.vram_bytes, 192 << 30);
        assert_eq!(gpu.partitions[0].vram_bytes, 192 << 30);
        assert_eq!(gpu.numa_node, Some(u32::from(i >= 4)));
        assert_eq!(gpu.compute_partition.as_deref(), Some("SPX"));
        assert_eq!(gpu.memory_partition.as_deref(), Some("NPS1"));
        assert_eq!(
            gpu.available_compute_partitions,
            ["SPX", "DPX", "QPX", "CPX"]
        );
        assert_eq!(gpu.market_name.as_deref(), Some("AMD Instinct MI300X"));
        assert!(gpu.amdsmi_uuid.is_some());
        assert_eq!(
            gpu.partitions[0].render_minor,
            Some(128 + u32::try_from(i).unwrap())
        );
        assert!(gpu.partitions[0].card_minor.is_some());
        assert_eq!(gpu.partitions[0].xcp, None);
        let types: Vec<&str> = gpu
            .partition_profiles
            .iter()
            .map(|p| p.profile_type.as_str())
            .collect();
        assert_eq!(types, ["SPX", "DPX", "QPX", "CPX"]);
        assert_eq!(
            gpu.partition_profile.as_ref().map(|p| p.num_partitions),
            Some(1)
        );
        assert_eq!(gpu.links.len(), 7);
        assert!(
            gpu.links.iter().all(|l| l.hops == Some(1)),
            "{:?}",
            gpu.links
        );
    }
}

#[test]
fn mi300x_cpx_and_dpx_partitions_are_served_by_xcp_devices() {
    for (name, parts, cus) in [("mi300x-8-cpx", 8, 38), ("mi300x-8-dpx", 2, 152)] {
        let (_, inv, _, _dir) = build(name, &full());
        for gpu in &inv.gpus {
            assert_eq!(gpu.vram_bytes, 192 << 30, "{name}");
            assert_eq!(gpu.partitions.len(), parts);
            for part in &gpu.partitions {
                assert_eq!(part.compute_units, cus);
                assert_eq!(part.vram_bytes, (192 << 30) / parts as u64);
                assert_eq!(part.xcp.is_some(), part.index > 0, "{name} {part:?}");
            }
            let profile = gpu
                .partition_profile
                .as_ref()
                .expect("profile on partition 0");
            assert_eq!(profile.num_partitions as usize, parts);
        }
    }
}

#[test]
fn radeon_pair_has_wgp_pairs_and_an_igpu_without_uuid() {
    let (_, inv, _, _dir) = build("rx9070xt-igpu", &full());
    let dgpu = inv
        .gpus
        .iter()
        .find(|g| g.compute_units == 64)
        .expect("9070 XT");
    assert_eq!(dgpu.gfx.map(|g| g.to_string()).as_deref(), Some("gfx1201"));
    assert_eq!(dgpu.cus_per_wgp, 2);
    assert!(dgpu.rocr_uuid.is_some());
    assert_eq!(dgpu.compute_partition, None);
    assert_eq!(dgpu.vram_bytes, 16 << 30);
    let igpu = inv
        .gpus
        .iter()
        .find(|g| g.compute_units == 2)
        .expect("iGPU");
    assert_eq!(igpu.gfx.map(|g| g.to_string()).as_deref(), Some("gfx1036"));
    assert_eq!(igpu.rocr_uuid, None);
    assert_eq!(igpu.unique_id, 0);
    assert_eq!(igpu.cus_per_wgp, 2);
}

#[test]
fn mi355x_profiles_come_from_amdsmi() {
    let (_, inv, _, _dir) = build("mi355x-8", &full());
    for gpu in &inv.gpus {
        assert_eq!(gpu.gfx.map(|g| g.to_string()).as_deref(), Some("gfx950"));
        assert_eq!(gpu.compute_units, 256);
        let xcc: Vec<Option<u32>> = gpu
            .partition_profiles
            .iter()
            .map(|p| p.xcc_per_partition)
            .collect();
        assert_eq!(xcc, [Some(8), Some(4), Some(2), Some(1)]);
        let caps = &gpu.partition_profiles[1].memory_caps;
        assert_eq!(caps, &["NPS1", "NPS2"]);
    }
    let (_, inv, _, _dir) = build("mi355x-8", &kfd_only());
    assert!(inv.gpus.iter().all(|g| g.partition_profiles.is_empty()));
}

/// AMD SMI's `profile_index` from either path, for the same GPUs: an MI300X
/// in NPS4 offers QPX and CPX only, and both paths call them 2 and 3 (the
/// sysfs path reads `supported_xcp_configs`, as AMD SMI numbers its profiles).
#[test]
fn the_sysfs_path_and_amd_smi_give_the_same_profile_index() {
    use tests::fixture::{PartitionMode, XcpSpelling, models::mi300x_8};
    let spec = mi300x_8(PartitionMode::Cpx, "NPS4", XcpSpelling::Underscore);
    let index_of = |amdsmi: bool| {
        let dir = tests::fixture::scratch_dir().unwrap();
        let opts = if amdsmi { full() } else { kfd_and_drm() };
        let node = fixture::build(&spec, dir.path(), &opts).unwrap();
        let config = match &node.amdsmi_fixture {
            Some(f) => common::fake_amdsmi(f, Duration::from_secs(30)),
            None => common::no_amdsmi(),
        };
        let inv = common::inventory(dir.path(), &config);
        let gpu = &inv.gpus[0];
        assert_eq!(gpu.partition_profiles.is_empty(), !amdsmi);
        gpud::testing::partition::profiles(gpu)
            .into_iter()
            .map(|p| (p.compute_partition, p.index))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let sysfs = index_of(false);
    let amdsmi = index_of(true);
    assert_eq!(
        sysfs,
        [("CPX".to_owned(), 3), ("QPX".to_owned(), 2)].into(),
        "the sysfs path lists what NPS4 allows, by AMD SMI's index"
    );
    for (mode, index) in &sysfs {
        assert_eq!(amdsmi.get(mode), Some(index), "{mode}: {amdsmi:?}");
    }
}

fn kfd_and_drm() -> BuildOptions {
    BuildOptions {
        drm: true,
        amdsmi_abi: None,
    }
}

/// Issue 36, point 1: a node registers the same IDs and types with or
/// without AMD SMI. The fake library derives its UUID as the real one does
/// (`tests/fake-amdsmi/src/uuid.rs`), amd-gpud computes it from sysfs
/// (`gpud/src/inventory/smi_uuid.rs`); the names come from the fake's
/// `market_name` on one side and libdrm's `amdgpu.ids` on the other.
#[test]
fn every_fixture_has_the_same_ids_and_names_with_and_without_amd_smi() {
    for name in fixture::names() {
        let (_, with, _, _dir) = build(name, &full());
        let (_, without, _, _dir2) = build(name, &kfd_and_drm());
        assert_eq!(with.amdsmi.state, "loaded", "{name}");
        assert_eq!(without.amdsmi.state, "disabled", "{name}");
        assert_eq!(with.gpus.len(), without.gpus.len(), "{name}");
        for (a, b) in with.gpus.iter().zip(&without.gpus) {
            let what = format!("{name} {}", a.bdf);
            assert!(a.derived_uuid.is_some(), "{what}");
            assert_eq!(a.derived_uuid, b.derived_uuid, "{what}");
            assert_eq!(
                a.amdsmi_uuid, a.derived_uuid,
                "{what}: the fake (7.0) agrees"
            );
            assert_eq!(b.amdsmi_uuid, None, "{what}");
            assert!(a.market_name.is_some(), "{what}");
            assert_eq!(a.market_name, b.market_name, "{what}");
        }
        let disagree: Vec<_> = with
            .warnings
            .iter()
            .filter(|w| w.contains("reports UUID"))
            .collect();
        assert!(disagree.is_empty(), "{name}: {disagree:?}");
        assert!(without.product_names.is_some(), "{name}");
    }
}
