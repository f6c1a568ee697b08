//! Compute-partition switching through amd-gpud: a fake MI300X node (SPX)
//! whose fake driver re-creates a GPU's KFD and DRM nodes when
//! `current_compute_partition` is written; `SetComputePartition` switches an
//! idle GPU to CPX and back, the D-Bus objects following, through sysfs
//! without AMD SMI and through the (fake) library with it; a GPU used by a
//! KFD process is refused with Busy and left untouched; a mode the GPU does
//! not offer is NotSupported; the profile menu checked field by field.
//! Needs root (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use ipc::{ApiError, proxy::NodeProxy, types::PartitionProfile};
use tests::{
    bus::{Policy, PrivateBus},
    fixture::{self, BuildOptions, driver::FakeDriver},
    stack,
};
use zbus::Connection;

/// Where the fake AMD SMI logs each profile switch it made (in the host root).
const AMDSMI_CALLS: &str = "amdsmi-calls.log";

/// The fake AMD SMI's switch log, one call a line.
fn amdsmi_calls(root: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(root.join(AMDSMI_CALLS))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

const GPU0: &str = "0000:05:00.0";
const GPU1: &str = "0000:15:00.0";

#[test]
fn idle_gpus_switch_and_busy_ones_are_refused() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), switch_scenario());
}

async fn gpu(conn: &Connection, bdf: &str) -> ipc::types::GpuInfo {
    ipc::proxy::read_gpu(conn, &ipc::gpu_path(bdf).as_ref())
        .await
        .unwrap()
}

/// Switches GPU 0 to `mode` and checks it: the mode read back and `live`
/// partitions. Returns the generation the call answered and the GPU.
async fn switch_gpu0(
    node: &NodeProxy<'_>,
    conn: &Connection,
    mode: &str,
    live: usize,
) -> (u64, ipc::types::GpuInfo) {
    let generation = node.set_compute_partition(GPU0, mode, false).await.unwrap();
    let after = gpu(conn, GPU0).await;
    assert_eq!(after.compute_partition, mode.to_ascii_uppercase());
    assert_eq!(live_partitions(conn, GPU0).await, live);
    (generation, after)
}

/// Partitions of `bdf` that are not missing.
async fn live_partitions(conn: &Connection, bdf: &str) -> usize {
    let mut live = 0;
    for path in gpu(conn, bdf).await.partitions {
        let part = ipc::proxy::read_partition(conn, &path.as_ref())
            .await
            .unwrap();
        if part.health != ipc::MISSING {
            live += 1;
        }
    }
    live
}

async fn switch_scenario() {
    let root = fixture::scratch_dir().unwrap();
    let spec = fixture::named("mi300x-8-spx").unwrap();
    let opts = BuildOptions {
        drm: true,
        amdsmi_abi: None,
    };
    fixture::build(&spec, root.path(), &opts).unwrap();
    let driver = FakeDriver::start(root.path(), spec, opts);
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let _gpud = stack::gpud(&common::fake_node_exe(), &bus, root.path(), 0).unwrap();
    let conn = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    let node = NodeProxy::new(&conn).await.unwrap();

    // The menu, as the scheduler gets it.
    let before = gpu(&conn, GPU0).await;
    let menu: Vec<(u32, &str, u32, u32, Vec<String>)> = before
        .partition_profiles
        .iter()
        .map(|p: &PartitionProfile| {
            (
                p.index,
                p.compute_partition.as_str(),
                p.partitions,
                p.xcc_per_partition,
                p.memory_partitions.clone(),
            )
        })
        .collect();
    let nps1 = || vec!["NPS1".to_owned()];
    assert_eq!(
        menu,
        [
            (0, "SPX", 1, 8, nps1()),
            (1, "DPX", 2, 4, nps1()),
            (2, "QPX", 4, 2, nps1()),
            (3, "CPX", 8, 1, nps1())
        ]
    );

    // An idle GPU goes to CPX: eight live partitions, the others untouched.
    let (generation, _) = switch_gpu0(&node, &conn, "cpx", 8).await;
    assert!(generation > 1, "{generation}");
    assert_eq!(gpu(&conn, GPU1).await.compute_partition, "SPX");
    assert_eq!(driver.spec().gpus[0].compute_mode().as_str(), "CPX");

    refusals(&conn, &node, root.path()).await;

    // Without AMD SMI the switch was sysfs's: the fake library logged nothing.
    assert!(!root.path().join(AMDSMI_CALLS).exists());

    // And back: one live partition again.
    switch_gpu0(&node, &conn, "SPX", 1).await;
    // Asking for the current mode changes nothing.
    let generation = node.generation().await.unwrap();
    assert_eq!(
        node.set_compute_partition(GPU0, "SPX", false)
            .await
            .unwrap(),
        generation
    );
}

#[test]
fn a_switch_with_amd_smi_loaded_reads_the_library_again() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), amdsmi_scenario());
}

/// The same switch with amd-gpud reading the fake AMD SMI library: the
/// switch is the library's (`amdsmi_set_gpu_accelerator_partition_profile`
/// with the mode's profile index, which the fake logs and turns into a write
/// of the fake host's partition file, as the real library writes the
/// kernel's), and the fake driver rewrites the library's fixture with the
/// new mode: after the switch the GPU keeps its AMD SMI identity, and its
/// mode and partitions are the new ones whether they come from sysfs or the
/// library.
async fn amdsmi_scenario() {
    let root = fixture::scratch_dir().unwrap();
    let spec = fixture::named("mi300x-8-spx").unwrap();
    let opts = BuildOptions {
        drm: true,
        amdsmi_abi: Some("7.0".into()),
    };
    fixture::build(&spec, root.path(), &opts).unwrap();
    let _driver = FakeDriver::start(root.path(), spec, opts);
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let library = tests::fake_amdsmi::library_for("7.0");
    let fixture = root.path().join(fixture::FIXTURE_FILE);
    let _gpud = stack::gpud_with_amdsmi(
        &common::fake_node_exe(),
        &bus,
        root.path(),
        library,
        &fixture,
    )
    .unwrap();
    let conn = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    let node = NodeProxy::new(&conn).await.unwrap();
    let amdsmi = node.amd_smi().await.unwrap();
    assert!(amdsmi.contains("7."), "AMD SMI loaded: {amdsmi}");
    let before = gpu(&conn, GPU0).await;
    assert!(!before.amdsmi_uuid.is_empty(), "{before:?}");
    assert_eq!(before.compute_partition, "SPX");

    let (_, after) = switch_gpu0(&node, &conn, "CPX", 8).await;
    // AMD SMI switched, by its profile index (CPX is 3 on an MI300X).
    assert_eq!(
        amdsmi_calls(root.path()),
        ["amdsmi_set_gpu_accelerator_partition_profile 0000:05:00.0 3"]
    );
    assert_eq!(
        after.amdsmi_uuid, before.amdsmi_uuid,
        "same GPU for AMD SMI"
    );
    assert_eq!(after.market_name, before.market_name);
    assert_eq!(node.amd_smi().await.unwrap(), amdsmi, "still loaded");

    switch_gpu0(&node, &conn, "SPX", 1).await;
    assert_eq!(
        amdsmi_calls(root.path()).last().map(String::as_str),
        Some("amdsmi_set_gpu_accelerator_partition_profile 0000:05:00.0 0")
    );
    let warnings = node.warnings().await.unwrap();
    assert!(
        warnings.iter().all(|w| !w.contains("render minors")),
        "a switch is not a shortage of render minors: {warnings:?}"
    );
}

/// Refusals on GPU 1, which stays in SPX throughout.
async fn refusals(conn: &Connection, node: &NodeProxy<'_>, root: &std::path::Path) {
    // Not offered in NPS1 on this model: TPX.
    let err = node
        .set_compute_partition(GPU1, "TPX", false)
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::NotSupported(_)), "{err:?}");
    // The caller's allocations, then a KFD process holding VRAM, make it busy.
    let err = node
        .set_compute_partition(GPU1, "DPX", true)
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Busy(_)), "{err:?}");
    let part = ipc::proxy::read_partition(conn, &gpu(conn, GPU1).await.partitions[0].as_ref())
        .await
        .unwrap();
    let proc = root.join("sys/class/kfd/kfd/proc/4242");
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(proc.join(format!("vram_{}", part.gpu_id)), "1048576\n").unwrap();
    let err = node
        .set_compute_partition(GPU1, "DPX", false)
        .await
        .unwrap_err();
    match &err {
        ApiError::Busy(why) => assert!(why.contains("4242"), "{why}"),
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        gpu(conn, GPU1).await.compute_partition,
        "SPX",
        "left untouched"
    );
    std::fs::remove_dir_all(&proc).unwrap();
}
