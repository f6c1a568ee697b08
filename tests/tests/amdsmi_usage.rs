//! Issue 23, scope item 2: `GetUsage` takes each GPU's VRAM used and
//! activity from AMD SMI where the library reports them, and from sysfs
//! otherwise. amd-gpud runs with the fake AMD SMI, whose figures differ from
//! the fake sysfs files; a GPU whose fixture entry has no figures (the fake
//! then answers `NOT_SUPPORTED`, as a library without the getters looks to
//! the caller) keeps sysfs's; a probe that hangs is killed and leaves
//! sysfs's figures within the call's deadline. Private bus with the shipped
//! policy. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use ipc::usage::GpuUse;
use serde_json::{Value, json};
use tests::{
    bus::{Policy, PrivateBus},
    fixture::{self, BuildOptions},
    stack,
};

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;
/// `GetUsage`'s answers are served again for 2 s.
const CACHE: Duration = Duration::from_millis(2100);

#[test]
fn get_usage_prefers_amdsmi_and_falls_back_to_sysfs() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), scenario());
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The PCI addresses of the fixture's processors, in order, deduplicated.
fn fixture_gpus(fixture: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for socket in fixture["sockets"].as_array().unwrap() {
        for p in socket["processors"].as_array().unwrap() {
            let bdf = p["bdf"].as_str().unwrap().to_owned();
            if !out.contains(&bdf) {
                out.push(bdf);
            }
        }
    }
    out
}

/// Sets `fields` on every processor at `bdf`.
fn set_on(fixture: &mut Value, bdf: &str, fields: &Value) {
    for socket in fixture["sockets"].as_array_mut().unwrap() {
        for p in socket["processors"].as_array_mut().unwrap() {
            if p["bdf"] == bdf {
                for (k, v) in fields.as_object().unwrap() {
                    p[k] = v.clone();
                }
            }
        }
    }
}

fn save(path: &Path, fixture: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(fixture).unwrap()).unwrap();
}

async fn usage(bus: &PrivateBus) -> Vec<GpuUse> {
    let conn = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    let node = ipc::proxy::NodeProxy::new(&conn).await.unwrap();
    node.get_usage().await.unwrap().2
}

fn figures<'a>(gpus: &'a [GpuUse], bdf: &str) -> (i64, i64, &'a str) {
    let g = gpus.iter().find(|g| g.bdf == bdf).unwrap();
    (g.vram_used_bytes, g.busy_percent, g.source.as_str())
}

async fn scenario() {
    let root = fixture::scratch_dir().unwrap();
    let spec = fixture::named("mi300x-8-spx").unwrap();
    let opts = BuildOptions {
        drm: true,
        amdsmi_abi: Some("7.0".into()),
    };
    fixture::build(&spec, root.path(), &opts).unwrap();
    let path = root.path().join(fixture::FIXTURE_FILE);
    let mut smi: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let gpus = fixture_gpus(&smi);
    let (gpu0, gpu1) = (gpus[0].clone(), gpus[1].clone());
    // sysfs says 9 GiB and 63 % on both; AMD SMI says 5000 MiB and 17 % on GPU 0 only.
    for bdf in [&gpu0, &gpu1] {
        let pci = root.path().join(format!("sys/bus/pci/devices/{bdf}"));
        write(&pci.join("mem_info_vram_used"), &format!("{}\n", 9 * GIB));
        write(&pci.join("gpu_busy_percent"), "63\n");
    }
    let on_gpu0 = json!({"gfx_activity": 17, "umc_activity": 4, "vram_used_mib": 5000});
    set_on(&mut smi, &gpu0, &on_gpu0);
    save(&path, &smi);
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let fake_node = common::fake_node_exe();
    let library = tests::fake_amdsmi::library_for("7.0");
    let _gpud = stack::gpud_with_amdsmi(&fake_node, &bus, root.path(), library, &path).unwrap();

    let got = usage(&bus).await;
    assert_eq!(figures(&got, &gpu0), (5000 * MIB, 17, "amdsmi"), "{got:?}");
    assert_eq!(figures(&got, &gpu1), (9 * GIB, 63, "sysfs"), "{got:?}");

    // The probe's getter hangs: the child is killed, sysfs answers in time.
    smi["faults"] = json!({"amdsmi_get_gpu_activity": "hang"});
    save(&path, &smi);
    tokio::time::sleep(CACHE).await;
    let start = Instant::now();
    let got = usage(&bus).await;
    let took = start.elapsed();
    assert_eq!(figures(&got, &gpu0), (9 * GIB, 63, "sysfs"), "{got:?}");
    assert!(took < Duration::from_secs(3), "GetUsage took {took:?}");
    assert!(
        took >= Duration::from_secs(2),
        "the probe was waited for: {took:?}"
    );

    // AMD SMI is then left alone for a while: sysfs answers at once.
    tokio::time::sleep(CACHE).await;
    let start = Instant::now();
    let got = usage(&bus).await;
    assert_eq!(figures(&got, &gpu0), (9 * GIB, 63, "sysfs"), "{got:?}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}
