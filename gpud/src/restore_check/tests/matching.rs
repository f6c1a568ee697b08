//! Every check with its option on and off, the exactly matched values, GPU
//! counts, NUMA grouping and XGMI hives, in both modes.

use serde_json::json;

use super::{TopoBuilder, both, off, run};
use crate::restore_check::{
    Mode, Outcome, Request, RestoreCheckError, check,
    local::LocalError,
    options::{Check, Options},
    props::PROPERTIES,
};

fn one_gpu() -> TopoBuilder {
    TopoBuilder::new().cpu(0).gpu(1, 0)
}

#[test]
fn an_identical_gpu_restores_with_its_mapping() {
    let src = one_gpu().build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .gpu(3, 0)
        .tweak(3, |p| p.drm_render_minor = 130)
        .build();
    let (criu, explain) = both(&src, &dst, &Options::default());
    for v in [&criu, &explain] {
        assert!(v.restorable);
        assert_eq!(v.reason, None);
        assert!(v.refusals.is_empty());
        assert_eq!(v.mapping.len(), 1);
        assert_eq!(
            (v.mapping[0].checkpoint_gpu, v.mapping[0].local_gpu),
            (0x1001, 0x1003)
        );
        assert_eq!(v.mapping[0].local_bdf.as_deref(), Some("0000:03:00.0"));
    }
    let json = serde_json::to_value(&explain).unwrap();
    assert_eq!(json["restorable"], true);
    assert_eq!(json["mapping"][0]["checkpoint_gpu"], 0x1001);
    assert_eq!(json["mapping"][0]["local_gpu"], 0x1003);
    assert_eq!(json["refusals"], json!([]));
    assert_eq!(json["criu_restorable"], true);
    assert_eq!(json["mode"], "explain");
}

/// The property each value option relaxes, and a local value that fails it.
fn relaxable() -> Vec<(Check, &'static str)> {
    PROPERTIES
        .iter()
        .filter_map(|p| Some((p.option?, p.name)))
        .collect()
}

#[test]
fn each_value_check_refuses_with_its_option_on_and_passes_with_it_off() {
    for (check, name) in relaxable() {
        let src = one_gpu().build();
        let dst = one_gpu()
            .tweak(1, |p| match name {
                "fw_version" => p.fw_version -= 1,
                "sdma_fw_version" => p.sdma_fw_version -= 1,
                "caches_count" => p.caches_count -= 1,
                "num_gws" => p.num_gws -= 1,
                "vram_size" => p.vram_size -= 1 << 20,
                "capability" => p.capability ^= 0x8000_0000,
                other => panic!("{other}"),
            })
            .build();
        let (criu, explain) = both(&src, &dst, &Options::default());
        assert!(!criu.restorable, "{name}");
        assert_eq!(
            criu.reason.as_deref(),
            Some("Failed to match remaining nodes")
        );
        let r = &explain.refusals;
        assert_eq!(r.len(), 1, "{name}: {r:#?}");
        assert_eq!(r[0].property, name);
        assert_eq!(r[0].option.as_deref(), Some(check.env_name()));
        assert_eq!(
            (r[0].checkpoint_gpu, r[0].local_gpu),
            (Some(0x1001), Some(0x1001))
        );
        assert_eq!(criu.refusals, explain.refusals, "criu mode names it too");
        let (criu, explain) = both(&src, &dst, &off(&[check]));
        assert!(criu.restorable && explain.restorable, "{name} off");
        // Turning any other option off does not help.
        let others: Vec<Check> = Check::ALL.into_iter().filter(|c| *c != check).collect();
        let (criu, _) = both(&src, &dst, &off(&others));
        assert!(!criu.restorable, "{name} with the others off");
    }
}

#[test]
fn a_higher_local_value_passes_the_at_most_checks_but_not_capability() {
    let src = one_gpu().build();
    let newer = one_gpu()
        .tweak(1, |p| {
            p.fw_version += 10;
            p.sdma_fw_version += 1;
            p.caches_count += 8;
            p.num_gws += 1;
            p.vram_size += 1 << 30;
        })
        .build();
    assert!(both(&src, &newer, &Options::default()).0.restorable);
    let more_caps = one_gpu().tweak(1, |p| p.capability |= 1).build();
    let (_, explain) = both(&src, &more_caps, &Options::default());
    assert_eq!(explain.refusals[0].property, "capability");
}

#[test]
fn exactly_matched_values_refuse_whatever_the_options() {
    let all_off = off(&Check::ALL);
    for prop in PROPERTIES.iter().filter(|p| p.option.is_none()) {
        let dst = one_gpu()
            .tweak(1, |p| match prop.name {
                "simd_count" => p.simd_count += 4,
                "mem_banks_count" => p.mem_banks_count += 1,
                "io_links_count" => p.io_links_count += 4,
                "max_waves_per_simd" => p.max_waves_per_simd += 1,
                "lds_size_in_kb" => p.lds_size_in_kb += 96,
                "wave_front_size" => p.wave_front_size = 32,
                "array_count" => p.array_count = 4,
                "simd_arrays_per_engine" => p.simd_arrays_per_engine += 1,
                "cu_per_simd_array" => p.cu_per_simd_array -= 1,
                "simd_per_cu" => p.simd_per_cu = 2,
                "max_slots_scratch_cu" => p.max_slots_scratch_cu += 1,
                "vendor_id" => p.vendor_id = 0x10de,
                "device_id" => p.device_id = 0x74b5,
                "num_sdma_engines" => p.num_sdma_engines = 2,
                "num_sdma_xgmi_engines" => p.num_sdma_xgmi_engines = 6,
                "num_sdma_queues_per_engine" => p.num_sdma_queues_per_engine = 6,
                "num_cp_queues" => p.num_cp_queues = 32,
                "vram_public" => p.vram_public = 0,
                other => panic!("{other}"),
            })
            .build();
        let (criu, explain) = both(&one_gpu().build(), &dst, &all_off);
        assert!(!criu.restorable, "{}", prop.name);
        assert_eq!(explain.refusals.len(), 1, "{}", prop.name);
        assert_eq!(explain.refusals[0].property, prop.name);
        assert_eq!(explain.refusals[0].option, None);
    }
}

#[test]
fn gpu_counts_must_be_equal() {
    let src = one_gpu().build();
    let dst = one_gpu().gpu(2, 0).build();
    let (criu, explain) = both(&src, &dst, &off(&Check::ALL));
    assert_eq!(
        criu.reason.as_deref(),
        Some("Number of devices mismatch (checkpointed:1 local:2)")
    );
    let r = &explain.refusals[0];
    assert_eq!(r.property, "gpu_count");
    assert_eq!(
        (r.checkpoint_gpu, r.local_gpu, r.option.as_deref()),
        (None, None, None)
    );
    assert_eq!(serde_json::to_value(&r.checkpoint_value).unwrap(), 1);
    assert_eq!(serde_json::to_value(&r.local_value).unwrap(), 2);
    // Fewer GPUs visible makes the counts equal.
    let request = Request {
        gpus: vec!["0x1002".into()],
        ..Request::default()
    };
    let v = check(
        &super::image(src.clone()),
        &super::local(dst.clone()),
        &request,
    )
    .unwrap();
    assert!(v.restorable);
    assert_eq!(v.mapping[0].local_gpu, 0x1002);
    let request = Request {
        gpus: vec!["renderD128".into(), "0000:02:00.0".into()],
        ..Request::default()
    };
    let v = check(
        &super::image(src.clone()),
        &super::local(dst.clone()),
        &request,
    )
    .unwrap();
    assert_eq!(v.local_gpus, 2);
    let request = Request {
        gpus: vec!["0x7777".into()],
        ..Request::default()
    };
    let err = check(&super::image(src), &super::local(dst), &request).unwrap_err();
    assert!(
        matches!(err, RestoreCheckError::Local(LocalError::UnknownGpu { ref id }) if id == "0x7777")
    );
    assert!(err.is_invalid_input());
}

#[test]
fn numa_grouping_one_cpu_to_two_cpus_and_back() {
    let one_cpu = TopoBuilder::new().cpu(0).gpu(1, 0).gpu(2, 0).build();
    let two_cpus = TopoBuilder::new().cpu(0).cpu(1).gpu(2, 0).gpu(3, 1).build();
    for (src, dst) in [(&one_cpu, &two_cpus), (&two_cpus, &one_cpu)] {
        let (criu, explain) = both(src, dst, &Options::default());
        assert!(!criu.restorable);
        let r = &explain.refusals;
        assert_eq!(r.len(), 1, "{r:#?}");
        assert_eq!(r[0].property, "numa_node");
        assert_eq!(r[0].option.as_deref(), Some("KFD_NUMA_CHECK"));
        assert!(r[0].checkpoint_gpu.is_some() && r[0].local_gpu.is_some());
        assert_eq!(criu.refusals, explain.refusals);
        assert!(both(src, dst, &off(&[Check::Numa])).0.restorable);
    }
}

#[test]
fn numa_grouping_is_kept_whatever_the_cpu_numbers() {
    // Checkpoint: GPUs 2, 3 on CPU 0 and GPUs 4, 5 on CPU 1. Here the pairs
    // sit on CPUs 1 and 0: the grouping is the same.
    let src = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 1)
        .gpu(5, 1)
        .build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 1)
        .gpu(3, 0)
        .gpu(4, 1)
        .gpu(5, 0)
        .build();
    let (criu, explain) = both(&src, &dst, &Options::default());
    for v in [&criu, &explain] {
        assert!(v.restorable);
        let on_cpu = |gpu: u32| if gpu == 0x1002 || gpu == 0x1004 { 1 } else { 0 };
        let groups: Vec<(u32, u32)> = v
            .mapping
            .iter()
            .map(|m| (m.checkpoint_gpu, on_cpu(m.local_gpu)))
            .collect();
        assert_eq!(groups[0].1, groups[1].1, "{groups:?}");
        assert_eq!(groups[2].1, groups[3].1, "{groups:?}");
        assert_ne!(groups[0].1, groups[2].1, "{groups:?}");
    }
    // Three checkpoint GPUs on CPU 0 cannot keep together on a 2 + 2 node.
    let uneven = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .gpu(5, 1)
        .build();
    let (_, explain) = both(&uneven, &dst, &Options::default());
    assert_eq!(explain.refusals[0].property, "numa_node");
}

#[test]
fn xgmi_hives_must_fit() {
    let hive = TopoBuilder::new()
        .cpu(0)
        .gpu(1, 0)
        .gpu(2, 0)
        .hive(&[1, 2])
        .build();
    let pcie = TopoBuilder::new().cpu(0).gpu(1, 0).gpu(2, 0).build();
    let (criu, explain) = both(&hive, &pcie, &off(&Check::ALL));
    assert_eq!(
        criu.reason.as_deref(),
        Some("Number of xgmi groups mismatch (checkpointed:1 local:0)")
    );
    assert_eq!(explain.refusals[0].property, "xgmi_hives");
    // PCIe-only GPUs restore onto hive members.
    assert!(both(&pcie, &hive, &Options::default()).0.restorable);
    assert!(both(&hive, &hive, &Options::default()).0.restorable);
}

#[test]
fn a_hive_cannot_be_split_across_two_local_hives() {
    // A hive of 3 (and a plain GPU) against two hives of 2 whose GPUs also
    // link to a second CPU, so that link counts and properties fit pair by
    // pair: only the hive shape is wrong.
    let src = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .gpu(5, 0)
        .hive(&[2, 3, 4])
        .build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .gpu(5, 0)
        .link(2, 1)
        .link(3, 1)
        .link(4, 1)
        .link(5, 1)
        .hive(&[2, 3])
        .hive(&[4, 5])
        .build();
    let (criu, explain) = both(&src, &dst, &Options::default());
    assert_eq!(
        criu.reason.as_deref(),
        Some("Failed to match all GPU groups")
    );
    let r = &explain.refusals;
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(r[0].property, "xgmi_hive");
    assert_eq!(r[0].checkpoint_gpu, Some(0x1002));
    assert_eq!(
        serde_json::to_value(&r[0].local_value).unwrap(),
        "hives of [2, 2] GPUs"
    );
    assert_eq!(r[0].option, None);
}

#[test]
fn link_count_beyond_the_property_is_enforced() {
    // io_links_count (the property) is equal, but the checkpoint GPU had a
    // valid XGMI peer the local one lacks: 2 valid links against 1.
    let src = TopoBuilder::new()
        .cpu(0)
        .gpu(1, 0)
        .gpu(2, 0)
        .hive(&[1, 2])
        .build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .gpu(1, 0)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .hive(&[1, 2])
        .hive(&[3, 4])
        .build();
    let request = Request {
        gpus: vec!["0x1001".into(), "0x1003".into()],
        ..Request::default()
    };
    let v = check(&super::image(src), &super::local(dst), &request).unwrap();
    assert!(!v.restorable);
    assert_eq!(
        v.reason.as_deref().map(|r| r.contains("XGMI")),
        Some(true),
        "{v:#?}"
    );
}

#[test]
fn io_links_count_differs_with_hive_size_and_no_option_helps() {
    let src = one_gpu().tweak(1, |p| p.io_links_count = 8).build();
    let dst = one_gpu().build();
    let (criu, explain) = both(&src, &dst, &off(&Check::ALL));
    assert!(!criu.restorable);
    let r = &explain.refusals[0];
    assert_eq!(r.property, "io_links_count");
    assert_eq!(serde_json::to_value(&r.checkpoint_value).unwrap(), 8);
    assert_eq!(serde_json::to_value(&r.local_value).unwrap(), 4);
}

#[test]
fn text_output_names_gpu_property_values_and_option() {
    let src = one_gpu().build();
    let dst = one_gpu().tweak(1, |p| p.fw_version = 170).build();
    let v = run(&src, &dst, Mode::Explain, Options::default());
    let mut text = Vec::new();
    v.write_text(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.starts_with("refused (explain mode, CRIU 3.17.1)"),
        "{text}"
    );
    assert!(
        text.contains("checkpoint GPU 0x1001 (node 1) on local GPU 0x1001 (node 1, 0000:01:00.0): fw_version: 177 in the checkpoint, 170 here; KFD_FW_VER_CHECK=0 would relax it"),
        "{text}"
    );
    let v = run(&src, &dst, Mode::Explain, off(&[Check::FwVersion]));
    let mut text = Vec::new();
    v.write_text(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.starts_with("restorable (explain mode, CRIU 3.17.1)"),
        "{text}"
    );
    assert!(text.contains("-> local GPU 0x1001"), "{text}");
    assert!(text.contains("checks off: KFD_FW_VER_CHECK"), "{text}");
}

#[test]
fn many_identical_partitions_are_diagnosed_and_crash_criu() {
    // 64 partitions in one hive over two CPUs, like an 8-GPU CPX node; the
    // local node has the 8 partitions of one GPU on an older firmware.
    let build = |bad: Option<std::ops::Range<u32>>| {
        let mut b = TopoBuilder::new().cpu(0).cpu(1);
        for id in 2..66 {
            b = b.gpu(id, u32::from(id >= 34));
            if bad.as_ref().is_some_and(|r| r.contains(&id)) {
                b = b.tweak(id, |p| p.fw_version -= 1);
            }
        }
        let ids: Vec<u32> = (2..66).collect();
        b.hive(&ids).build()
    };
    let src = build(None);
    let dst = build(Some(26..34));
    let explain = run(&src, &dst, Mode::Explain, Options::default());
    assert!(!explain.restorable);
    assert_eq!(explain.refusals.len(), 8);
    for r in &explain.refusals {
        assert_eq!(r.property, "fw_version");
        assert!(
            (0x1000 + 26..0x1000 + 34).contains(&r.local_gpu.unwrap()),
            "{r:#?}"
        );
    }
    let explain = run(&src, &dst, Mode::Explain, off(&[Check::FwVersion]));
    assert!(explain.restorable);
    assert_eq!(explain.mapping.len(), 64);
    // CRIU prints each hive's members into a 200-byte buffer before it
    // compares anything (topology_print -> p2pgroup_to_str): 10 bytes of
    // "type:XGMI:", 7 per "0x%04X ", a NUL: 64 members take 459 bytes,
    // whose last three land on the low bytes of src_topology.nodes.next
    // (criu::printbuf): a note says so. The search list of the hive (449
    // bytes from byte 224) covers restore_maps.cpu_maps, which map_device
    // walks under the NUMA check at the first pair that fits: a crash.
    let criu = run(&src, &dst, Mode::Criu, off(&[Check::FwVersion]));
    assert_eq!(criu.outcome, Outcome::CriuWouldCrash);
    assert!(
        criu.reason
            .as_deref()
            .is_some_and(|r| r.contains("449 bytes") && r.contains("restore_maps.cpu_maps")),
        "{:?}",
        criu.reason
    );
    assert!(
        criu.notes
            .iter()
            .any(|n| n.contains("459 bytes") && n.contains("may not be CRIU's")),
        "{:?}",
        criu.notes
    );
    assert_eq!(explain.criu_outcome, Some(Outcome::CriuWouldCrash));
    assert!(
        explain.notes.iter().any(|n| n.contains("56 more")),
        "{:?}",
        explain.notes
    );
}
