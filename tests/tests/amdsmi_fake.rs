//! AMD SMI through the real loader (a child `amd-gpud amdsmi-probe` that
//! dlopens the library) against the fake libamd_smi.so: every ABI layout, and
//! every injected failure leaves a working inventory.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{path::Path, time::Duration};

use gpud::testing::amdsmi::{self, AmdSmiError};
use serde_json::{Value, json};
use tests::fixture::{self, BuildOptions};

const ABIS: [&str; 5] = ["6.2", "6.3", "6.4", "7.0", "7.13"];

/// Builds mi300x-8-cpx with the fake AMD SMI at `abi`, letting `tweak` edit
/// the library's fixture first.
fn node(abi: &str, tweak: impl FnOnce(&mut Value)) -> (tempfile::TempDir, std::path::PathBuf) {
    let spec = fixture::named("mi300x-8-cpx").unwrap();
    let dir = tests::fixture::scratch_dir().unwrap();
    let opts = BuildOptions {
        drm: true,
        amdsmi_abi: None,
    };
    fixture::build(&spec, dir.path(), &opts).unwrap();
    let mut value = fixture::amdsmi_fixture_json(&spec, abi);
    tweak(&mut value);
    let path = dir.path().join("amdsmi.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
    (dir, path)
}

fn probe(fixture: &Path, timeout: Duration) -> Result<amdsmi::report::AmdSmiReport, AmdSmiError> {
    amdsmi::probe(&common::fake_amdsmi(fixture, timeout))
}

fn fault(call: &str, what: &str) -> impl FnOnce(&mut Value) {
    let (call, what) = (call.to_owned(), what.to_owned());
    move |v: &mut Value| v["faults"][call] = json!(what)
}

#[test]
fn every_abi_decodes_the_same_facts() {
    for abi in ABIS {
        let (_dir, fixture) = node(abi, |v| {
            v["sockets"][0]["processors"][0]["processes"] = json!([
                {"pid": 4242, "name": "python3", "mem_bytes": 1_048_576, "vram_bytes": 2_097_152},
                {"pid": 77, "name": "rocminfo", "mem_bytes": 0, "vram_bytes": 0}
            ]);
        });
        let report =
            probe(&fixture, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{abi}: {e}"));
        assert_eq!(report.layout, abi, "layout chosen from the version word");
        assert_eq!(report.processors.len(), 64, "{abi}");
        let first = &report.processors[0];
        assert_eq!(first.bdf.as_deref(), Some("0000:05:00.0"), "{abi}");
        assert_eq!(
            first.market_name.as_deref(),
            Some("AMD Instinct MI300X"),
            "{abi}"
        );
        let asic = first.asic.as_ref().expect("asic info");
        assert_eq!(
            asic.device_id, 0x74a1,
            "{abi}: device_id at the ABI's offset"
        );
        assert_eq!(asic.vendor_id, 0x1002, "{abi}");
        let cus = if abi == "6.2" { None } else { Some(38) };
        assert_eq!(asic.num_compute_units, cus, "{abi}");
        let procs = first.processes.as_ref().expect("process list");
        let names: Vec<(u32, &str, u64)> = procs
            .iter()
            .map(|p| (p.pid, p.name.as_str(), p.vram_bytes))
            .collect();
        assert_eq!(
            names,
            [(4242, "python3", 2_097_152), (77, "rocminfo", 0)],
            "{abi}: stride"
        );
        let has_kfd = abi != "6.2";
        assert_eq!(first.kfd_id.is_some(), has_kfd, "{abi}");
        let has_config = !matches!(abi, "6.2" | "6.3");
        assert_eq!(first.profile_config.is_some(), has_config, "{abi}");
        assert_eq!(first.enumeration.is_some(), has_config, "{abi}");
    }
}

#[test]
fn every_abi_enriches_the_inventory() {
    for abi in ABIS {
        let (dir, fixture) = node(abi, |_| {});
        let inv = common::inventory(
            dir.path(),
            &common::fake_amdsmi(&fixture, Duration::from_secs(30)),
        );
        assert_eq!(inv.amdsmi.state, "loaded", "{abi}: {}", inv.amdsmi.detail);
        assert_eq!(inv.gpus.len(), 8);
        for gpu in &inv.gpus {
            assert_eq!(
                gpu.market_name.as_deref(),
                Some("AMD Instinct MI300X"),
                "{abi}"
            );
            assert!(gpu.amdsmi_uuid.is_some(), "{abi}");
            assert_eq!(gpu.partition_profile.is_some(), abi != "6.2", "{abi}");
            assert_eq!(
                gpu.partition_profiles.len(),
                if matches!(abi, "6.2" | "6.3") { 0 } else { 4 }
            );
        }
    }
}

/// The fake's UUIDs are the real library's: at every ABI the whole GPU's
/// UUID is what amd-gpud derives from sysfs for that release (no
/// disagreement is reported), 6.2 to 7.0 share one UUID across a GPU's
/// partitions and 7.13 puts the partition index in its function byte.
#[test]
fn every_abi_reports_the_uuid_its_release_derives() {
    for abi in ABIS {
        let (dir, fixture) = node(abi, |_| {});
        let inv = common::inventory(
            dir.path(),
            &common::fake_amdsmi(&fixture, Duration::from_secs(30)),
        );
        let disagree: Vec<_> = inv
            .warnings
            .iter()
            .filter(|w| w.contains("reports UUID"))
            .collect();
        assert!(disagree.is_empty(), "{abi}: {disagree:?}");
        let report = probe(&fixture, Duration::from_secs(30)).unwrap();
        let (p0, p1) = (&report.processors[0], &report.processors[1]);
        let (u0, u1) = (p0.uuid.as_deref().unwrap(), p1.uuid.as_deref().unwrap());
        let gpu = &inv.gpus[0];
        let published = gpu.derived_uuid.as_deref().unwrap();
        if abi == "7.13" {
            assert_eq!((&u0[2..4], &u1[2..4]), ("00", "01"), "{u0} {u1}");
            assert_eq!((&u0[..2], &u0[4..]), (&published[..2], &published[4..]));
        } else {
            assert_eq!((u0, u1), (published, published), "{abi}");
            assert_eq!(&published[2..4], "ff");
        }
    }
}

/// The inventory with AMD SMI failing as `tweak` says must equal the sysfs one
/// in everything sysfs knows.
fn assert_inventory_survives(
    tweak: impl FnOnce(&mut Value),
    timeout: Duration,
) -> gpud::testing::inventory::Inventory {
    let (dir, fixture) = node("7.0", tweak);
    let inv = common::inventory(dir.path(), &common::fake_amdsmi(&fixture, timeout));
    assert_eq!(inv.gpus.len(), 8);
    for gpu in &inv.gpus {
        assert_eq!(gpu.partitions.len(), 8);
        assert_eq!(gpu.compute_units, 304);
        assert_eq!(gpu.compute_partition.as_deref(), Some("CPX"), "from sysfs");
        assert_eq!(gpu.vram_bytes, 192 << 30);
    }
    inv
}

#[test]
fn busy_is_retried_then_reported_per_call_and_device() {
    let (_dir, fixture) = node("7.0", fault("amdsmi_get_gpu_compute_partition", "BUSY"));
    let report = probe(&fixture, Duration::from_secs(60)).unwrap();
    let busy: Vec<_> = report
        .errors
        .iter()
        .filter(|e| e.status_name == "BUSY")
        .collect();
    assert_eq!(busy.len(), 64, "one per processor");
    assert_eq!(busy[0].call, "amdsmi_get_gpu_compute_partition");
    assert!(
        busy[0]
            .device
            .as_deref()
            .is_some_and(|d| d.contains("0000:05:00.0")),
        "{busy:?}"
    );
    assert!(
        report
            .processors
            .iter()
            .all(|p| p.compute_partition.is_none())
    );
    let inv = assert_inventory_survives(
        fault("amdsmi_get_gpu_compute_partition", "BUSY"),
        Duration::from_secs(60),
    );
    assert_eq!(inv.amdsmi.state, "loaded");
}

#[test]
fn not_supported_leaves_the_field_empty() {
    let inv = assert_inventory_survives(
        fault("amdsmi_get_gpu_asic_info", "NOT_SUPPORTED"),
        Duration::from_secs(30),
    );
    // libdrm's amdgpu.ids still names the GPUs, as AMD SMI itself would.
    assert!(
        inv.gpus
            .iter()
            .all(|g| g.market_name.as_deref() == Some("AMD Instinct MI300X"))
    );
    assert!(
        inv.gpus.iter().all(|g| g.amdsmi_uuid.is_some()),
        "other calls still count"
    );
}

#[test]
fn a_hanging_library_is_killed_after_the_timeout() {
    let (_dir, fixture) = node("7.0", fault("amdsmi_init", "hang"));
    let err = probe(&fixture, Duration::from_secs(2)).unwrap_err();
    assert!(matches!(err, AmdSmiError::HelperTimeout { .. }), "{err}");
    let inv = assert_inventory_survives(fault("amdsmi_init", "hang"), Duration::from_secs(2));
    assert_eq!(inv.amdsmi.state, "unavailable");
    assert!(
        inv.amdsmi.detail.contains("2s") || inv.amdsmi.detail.contains("timed out"),
        "{}",
        inv.amdsmi.detail
    );
}

#[test]
fn an_aborting_library_takes_only_the_probe_down() {
    let (_dir, fixture) = node("7.0", fault("amdsmi_get_gpu_asic_info", "abort"));
    let err = probe(&fixture, Duration::from_secs(30)).unwrap_err();
    assert!(
        matches!(err, AmdSmiError::HelperKilled { signal: 6, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("SIGABRT"), "{err}");
    let inv = assert_inventory_survives(
        fault("amdsmi_get_gpu_asic_info", "abort"),
        Duration::from_secs(30),
    );
    assert_eq!(inv.amdsmi.state, "unavailable");
}

#[test]
fn a_failing_init_is_a_typed_error_naming_the_call() {
    let (_dir, fixture) = node("7.0", fault("amdsmi_init", "INIT_ERROR"));
    let err = probe(&fixture, Duration::from_secs(30)).unwrap_err();
    match &err {
        AmdSmiError::Status {
            call, status, name, ..
        } => {
            assert_eq!(call, "amdsmi_init");
            assert_eq!(*status, 18);
            assert_eq!(name, "INIT_ERROR");
        }
        other => panic!("expected a status error, got {other}"),
    }
    assert!(err.to_string().contains("amdsmi_init"), "{err}");
}

#[test]
fn without_root_the_profile_config_is_skipped_not_fatal() {
    let (_dir, fixture) = node("7.0", |v| v["root"] = json!(false));
    let report = probe(&fixture, Duration::from_secs(30)).unwrap();
    assert!(report.processors.iter().all(|p| p.profile_config.is_none()));
    assert!(report.errors.iter().any(|e| e.status_name == "NO_PERM"));
    assert!(report.processors[0].partition_profile.is_some());
}

#[test]
fn a_missing_library_is_reported_with_what_was_tried() {
    let mut config = common::fake_amdsmi(Path::new("/nonexistent.json"), Duration::from_secs(10));
    config.library = amdsmi::LibrarySource::Path("/nonexistent/libamd_smi.so.26".into());
    let err = amdsmi::probe(&config).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/libamd_smi.so.26"),
        "{err}"
    );
}
