use std::fs;

use super::{profiles::amdsmi_index, *};
use crate::{
    amdsmi::{AmdSmiConfig, LibrarySource, report},
    inventory::{Partition, RestoreProps},
    pci::PciAddress,
};

fn gpu(mode: &str, partitions: u32) -> Gpu {
    let bdf: PciAddress = "0000:05:00.0".parse().unwrap();
    let parts = (0..partitions)
        .map(|i| Partition {
            index: i,
            kfd_node: 2 + i,
            gpu_id: Some(1000 + u64::from(i)),
            render_minor: Some(128 + i),
            card_minor: Some(i),
            bdf,
            compute_units: 304 / partitions,
            num_xcc: 8 / partitions,
            vram_bytes: (192 << 30) / u64::from(partitions),
            xcp: None,
            restore: RestoreProps::default(),
        })
        .collect();
    Gpu {
        bdf,
        rocr_uuid: Some("GPU-8ecb9de71e8aa497".into()),
        unique_id: 1,
        gfx: None,
        compute_units: 304,
        cus_per_wgp: 1,
        vram_bytes: 192 << 30,
        numa_node: Some(0),
        market_name: Some("AMD Instinct MI300X".into()),
        amdsmi_uuid: None,
        derived_uuid: None,
        published_id: None,
        compute_partition: Some(mode.into()),
        memory_partition: Some("NPS1".into()),
        available_compute_partitions: vec!["SPX".into(), "DPX".into(), "QPX".into(), "CPX".into()],
        supported_compute_partitions: vec![],
        available_memory_partitions: vec!["NPS1".into(), "NPS4".into()],
        vendor_id: 0x1002,
        device_id: 0x74a1,
        revision: None,
        hive_id: 0,
        partition_profile: None,
        partition_profiles: vec![],
        partitions: parts,
        links: vec![],
    }
}

/// AMD SMI switched off: every switch goes through sysfs.
fn off() -> AmdSmiConfig {
    AmdSmiConfig {
        library: LibrarySource::Disabled,
        helper: vec![],
        timeout: std::time::Duration::from_secs(1),
        child_env: vec![],
    }
}

/// A helper that answers every AMD SMI call with `outcome` (a JSON
/// document) and records its arguments in `<dir>/args`.
fn amdsmi_answering(dir: &std::path::Path, outcome: &str) -> AmdSmiConfig {
    let args = dir.join("args");
    let script = format!("echo \"$@\" >> '{}'; echo '{outcome}'", args.display());
    AmdSmiConfig {
        library: LibrarySource::Path("/opt/rocm/lib/libamd_smi.so.26".into()),
        helper: vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into()],
        timeout: std::time::Duration::from_secs(10),
        child_env: vec![],
    }
}

/// The answer of a `--set-profile` run with `status`.
fn switch_answer(status: u32, name: &str) -> String {
    format!(
        r#"{{"outcome":"ok","report":{{"library":"libamd_smi.so","version":{{"year":null,"major":26,"minor":0,"release":0,"build":null}},"layout":"7.0","processors":[],"errors":[],"profile_switch":{{"bdf":"0000:05:00.0","profile_index":3,"status":{status},"status_name":"{name}"}}}}}}"#
    )
}

/// The GPU as AMD SMI's profile config lists it (CPX is profile 3).
fn listed(mode: &str, partitions: u32) -> Gpu {
    let mut g = gpu(mode, partitions);
    g.partition_profiles = ["SPX", "DPX", "QPX", "CPX"]
        .into_iter()
        .zip(0..)
        .map(|(ty, index)| report::PartitionProfile {
            profile_type: ty.into(),
            num_partitions: expected_partitions(ty, 8),
            memory_caps: vec!["NPS1".into()],
            profile_index: index,
            partition_ids: vec![],
            xcc_per_partition: Some(8 / expected_partitions(ty, 8)),
        })
        .collect();
    g
}

fn host() -> (tempfile::TempDir, HostPaths) {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::under(dir.path());
    fs::create_dir_all(paths.pci_device("0000:05:00.0")).unwrap();
    fs::write(
        paths
            .pci_device("0000:05:00.0")
            .join("current_compute_partition"),
        "SPX\n",
    )
    .unwrap();
    (dir, paths)
}

fn current(paths: &HostPaths) -> String {
    fs::read_to_string(
        paths
            .pci_device("0000:05:00.0")
            .join("current_compute_partition"),
    )
    .unwrap()
}

#[test]
fn the_sysfs_menu_lists_the_offered_modes_with_their_shape() {
    let menu = profiles(&gpu("SPX", 1));
    let shape: Vec<(u32, &str, u32, u32)> = menu
        .iter()
        .map(|p| {
            (
                p.index,
                p.compute_partition.as_str(),
                p.partitions,
                p.xcc_per_partition,
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (0, "SPX", 1, 8),
            (1, "DPX", 2, 4),
            (2, "QPX", 4, 2),
            (3, "CPX", 8, 1)
        ]
    );
    assert!(menu.iter().all(|p| p.memory_partitions == ["NPS1"]));
    let mut rdna = gpu("SPX", 1);
    rdna.available_compute_partitions.clear();
    assert!(profiles(&rdna).is_empty());
}

/// In NPS4 an MI300X offers QPX and CPX only; their indices stay AMD SMI's
/// (positions in `supported_xcp_configs`), not positions in the offer.
#[test]
fn the_sysfs_index_is_amd_smis_not_an_ordinal_of_the_offer() {
    let mut g = gpu("CPX", 8);
    g.memory_partition = Some("NPS4".into());
    g.available_compute_partitions = vec!["QPX".into(), "CPX".into()];
    g.supported_compute_partitions = vec!["SPX".into(), "DPX".into(), "QPX".into(), "CPX".into()];
    let menu = profiles(&g);
    let got: Vec<(u32, &str)> = menu
        .iter()
        .map(|p| (p.index, p.compute_partition.as_str()))
        .collect();
    assert_eq!(got, [(2, "QPX"), (3, "CPX")]);
    assert!(menu.iter().all(|p| p.memory_partitions == ["NPS4"]));
    assert_eq!(amdsmi_index(&g, "spx"), Some(0));
    assert_eq!(amdsmi_index(&g, "TPX"), None);
    // A kernel without `supported_xcp_configs`: AMD SMI falls back to the
    // offered modes, and so does the sysfs path.
    g.supported_compute_partitions.clear();
    assert_eq!(amdsmi_index(&g, "CPX"), Some(1));
}

#[test]
fn amd_smis_menu_wins_when_the_library_lists_one() {
    let mut g = gpu("CPX", 8);
    g.partition_profiles = vec![report::PartitionProfile {
        profile_type: "CPX".into(),
        num_partitions: 8,
        memory_caps: vec!["NPS1".into(), "NPS4".into()],
        profile_index: 3,
        partition_ids: vec![],
        xcc_per_partition: Some(1),
    }];
    let menu = profiles(&g);
    assert_eq!(menu.len(), 1);
    assert_eq!(menu[0].index, 3);
    assert_eq!(menu[0].memory_partitions, ["NPS1", "NPS4"]);
}

#[test]
fn modes_parse_in_any_case_and_nothing_else() {
    assert_eq!(parse_mode("cpx").unwrap(), "CPX");
    assert_eq!(parse_mode(" Dpx ").unwrap(), "DPX");
    assert!(matches!(
        parse_mode("MIG"),
        Err(PartitionError::BadMode { .. })
    ));
    assert_eq!(expected_partitions("CPX", 8), 8);
    assert_eq!(expected_partitions("QPX", 8), 4);
}

#[test]
fn an_idle_gpu_is_switched_through_sysfs() {
    let (_dir, paths) = host();
    assert_eq!(
        switch(&paths, &off(), &gpu("SPX", 1), "CPX", false).unwrap(),
        Switched::Written
    );
    assert_eq!(current(&paths), "CPX");
    assert_eq!(
        switch(&paths, &off(), &gpu("CPX", 8), "CPX", false).unwrap(),
        Switched::Already
    );
}

/// With the library loaded and listing the GPU's profiles, the switch is
/// AMD SMI's, by its profile index; sysfs is left to the library.
#[test]
fn with_amd_smi_loaded_the_library_switches_by_profile_index() {
    let (dir, paths) = host();
    let amdsmi = amdsmi_answering(dir.path(), &switch_answer(0, "SUCCESS"));
    assert_eq!(
        switch(&paths, &amdsmi, &listed("SPX", 1), "CPX", false).unwrap(),
        Switched::ByAmdSmi { profile_index: 3 }
    );
    let args = fs::read_to_string(dir.path().join("args")).unwrap();
    assert!(args.contains("--set-profile 0000:05:00.0=3"), "{args}");
    assert_eq!(current(&paths), "SPX\n", "the library writes sysfs itself");
    // BUSY from the library is busy.
    let busy = amdsmi_answering(dir.path(), &switch_answer(30, "BUSY"));
    let err = switch(&paths, &busy, &listed("SPX", 1), "CPX", false).unwrap_err();
    assert!(matches!(err, PartitionError::Busy { .. }), "{err}");
    // Without the library's profile list, sysfs; the helper is not run.
    fs::remove_file(dir.path().join("args")).unwrap();
    assert_eq!(
        switch(&paths, &amdsmi, &gpu("SPX", 1), "DPX", false).unwrap(),
        Switched::Written
    );
    assert!(!dir.path().join("args").exists());
    assert_eq!(current(&paths), "DPX");
}

/// A library call that fails other than busy (here the helper cannot start)
/// falls back to sysfs.
#[test]
fn a_failing_library_falls_back_to_sysfs() {
    let (_dir, paths) = host();
    let broken = AmdSmiConfig {
        helper: vec!["/nonexistent/amd-gpud".into()],
        ..amdsmi_answering(std::path::Path::new("/nonexistent"), "")
    };
    assert_eq!(
        switch(&paths, &broken, &listed("SPX", 1), "CPX", false).unwrap(),
        Switched::Written
    );
    assert_eq!(current(&paths), "CPX");
}

#[test]
fn refusals_leave_the_gpu_untouched() {
    let (_dir, paths) = host();
    let err = switch(&paths, &off(), &gpu("SPX", 1), "TPX", false).unwrap_err();
    assert!(matches!(err, PartitionError::NotOffered { .. }), "{err}");
    assert!(err.to_string().contains("NPS1"), "{err}");
    let err = switch(&paths, &off(), &gpu("SPX", 1), "CPX", true).unwrap_err();
    assert!(matches!(err, PartitionError::Busy { .. }), "{err}");
    // A process holding VRAM on the GPU's partition.
    let proc = paths.kfd_proc().join("4242");
    fs::create_dir_all(&proc).unwrap();
    fs::write(proc.join("vram_1000"), "0\n").unwrap();
    fs::write(proc.join("vram_77"), "4096\n").unwrap();
    assert_eq!(
        switch(&paths, &off(), &gpu("SPX", 1), "DPX", false).unwrap(),
        Switched::Written,
        "vram_1000 = 0 and another GPU's VRAM are no use"
    );
    fs::write(proc.join("vram_1000"), "1048576\n").unwrap();
    let err = switch(&paths, &off(), &gpu("DPX", 1), "CPX", false).unwrap_err();
    assert!(
        err.to_string().contains("4242") && err.to_string().contains("1048576"),
        "{err}"
    );
    assert_eq!(current(&paths), "DPX");
    // A queue without VRAM is use too.
    fs::write(proc.join("vram_1000"), "0\n").unwrap();
    fs::create_dir_all(proc.join("queues/3")).unwrap();
    fs::write(proc.join("queues/3/gpuid"), "1000\n").unwrap();
    let err = switch(&paths, &off(), &gpu("DPX", 1), "CPX", false).unwrap_err();
    assert!(err.to_string().contains("queue 3"), "{err}");
}
