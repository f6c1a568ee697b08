//! Partition mode end to end: each compute partition registered as a device
//! of its own (count 1, the GPU's VRAM and CUs divided, mode `cpx`, the
//! profile menu in `custominfo`), allocated whole (no CU mask, no hook,
//! selected by container-local index), ids resolved across a restart of both
//! processes; a mixed Instinct + Radeon node; and `COMPUTE_PARTITION`
//! switching idle GPUs through amd-gpud while a GPU with allocations stays.
//! Needs root (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use common::world::{Gpu, NODE, Setup, World, schedule, world_with};
use serde_json::{Value, json};
use tests::{
    apiserver::{FakeApiServer, Kind},
    fixture::{self, BuildOptions, driver::FakeDriver, models::mixed_instinct_radeon},
};

fn partition_args(extra: &[&str]) -> Vec<String> {
    ["--operating-mode", "partition"]
        .iter()
        .chain(extra)
        .map(ToString::to_string)
        .collect()
}

/// The text of node annotation `key`.
fn annotation(api: &FakeApiServer, key: &str) -> String {
    let node = api.get(Kind::Node, "", NODE).unwrap();
    node["metadata"]["annotations"][key]
        .as_str()
        .unwrap()
        .to_owned()
}

fn register(api: &FakeApiServer) -> Vec<Value> {
    serde_json::from_str(&annotation(api, "hami.io/node-amd-register")).unwrap()
}

/// The register annotation's size and its floor: the same devices with
/// `custominfo` stripped to `pciBDF` (what HAMi's own AMD plugin sends).
fn register_sizes(api: &FakeApiServer) -> (usize, usize) {
    let text = annotation(api, "hami.io/node-amd-register");
    let mut devices: Vec<Value> = serde_json::from_str(&text).unwrap();
    for d in &mut devices {
        let bdf = d["custominfo"]["pciBDF"].clone();
        d["custominfo"] = json!({ "pciBDF": bdf });
    }
    (text.len(), serde_json::to_string(&devices).unwrap().len())
}

/// HAMi's budget for the register annotation of 64 partitions (issue 20).
const REGISTER_BUDGET: usize = 24 * 1024;

/// Waits until the register annotation satisfies `check`.
async fn wait_register(api: &FakeApiServer, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let devices = api
            .get(Kind::Node, "", NODE)
            .and_then(|n| {
                n["metadata"]["annotations"]["hami.io/node-amd-register"]
                    .as_str()
                    .map(str::to_owned)
            })
            .and_then(|v| serde_json::from_str::<Vec<Value>>(&v).ok())
            .unwrap_or_default();
        if check(&devices) {
            return devices;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "register annotation: {devices:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn allocate(
    w: &World,
    name: &str,
    devices: &[(&Gpu, u32, u32)],
    time: u64,
) -> tests::kubelet::ContainerAllocateResponse {
    schedule(&w.api, name, devices, time);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = devices
        .iter()
        .map(|(g, _, _)| format!("{}#0", g.id))
        .collect();
    w.kubelet.allocate(ids).await.unwrap()
}

#[test]
fn compute_partitions_are_whole_devices() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), cpx_node());
}

/// The register annotation of the CPX node (64 partition devices, each
/// naming its GPU, the GPU's facts in its first one, under HAMi's budget)
/// and the CRIU facts, once per GPU.
fn check_cpx_annotations(api: &FakeApiServer) {
    let devices = register(api);
    assert_eq!(devices.len(), 64);
    let first = &devices[0];
    assert!(first["id"].as_str().unwrap().ends_with("-cpx0"), "{first}");
    assert_eq!(
        (
            &first["count"],
            &first["devmem"],
            &first["devcore"],
            &first["mode"]
        ),
        (&json!(1), &json!(24576), &json!(38), &json!("cpx"))
    );
    // The GPU's facts (the Go plugin's `partitionProfiles` and `xgmiPeers`)
    // in its first entry only; each partition's own compute queues.
    let info = &first["custominfo"];
    let menu = info["partitionProfiles"].as_array().unwrap();
    let types: Vec<&str> = menu.iter().map(|p| p["Type"].as_str().unwrap()).collect();
    assert_eq!(types, ["SPX", "DPX", "QPX", "CPX"]);
    assert_eq!(
        menu[3],
        json!({"ProfileIndex": 3, "Type": "CPX", "MemoryCaps": "NPS1",
               "NumPartitions": 8, "XCCPerPartition": 1})
    );
    let peers = info["xgmiPeers"].as_array().unwrap();
    assert_eq!(peers.len(), 7, "{info}");
    assert!(!peers.contains(&json!("0000:05:00.0")));
    assert_eq!(
        (&info["pciBDF"], &info["gpuBDF"], &info["partitionProfile"]),
        (
            &json!("0000:05:00.0"),
            &json!("0000:05:00.0"),
            &json!("cpx_nps1")
        )
    );
    // A partition is always selected by index; the key is left out.
    assert!(info.get("rocrVisibleDevice").is_none(), "{info}");
    assert!(info["computeQueues"].as_u64().unwrap() > 0, "{info}");
    let second = &devices[1]["custominfo"];
    assert!(second.get("partitionProfiles").is_none() && second.get("xgmiPeers").is_none());
    assert_eq!(second["computeQueues"], info["computeQueues"]);
    assert_eq!(devices[9]["custominfo"]["gpuBDF"], "0000:15:00.0");
    assert!(devices[8]["custominfo"].get("partitionProfiles").is_some());
    let (size, floor) = register_sizes(api);
    assert!(
        size < REGISTER_BUDGET,
        "register annotation {size} bytes for 64 partitions (floor {floor})"
    );
    // What has no place in the register (CRIU's facts), once per GPU.
    let gpus: Value = serde_json::from_str(&annotation(api, "hami.io/node-amd-gpus")).unwrap();
    assert_eq!(gpus.as_object().unwrap().len(), 8, "{gpus}");
    assert!(gpus["0000:05:00.0"].get("partitionProfiles").is_none());
    assert_eq!(gpus["0000:05:00.0"]["criu"]["fw_version"], 177);
}

async fn cpx_node() {
    let args = partition_args(&[]);
    let mut w = world_with(&Setup {
        fixture: "mi300x-8-cpx",
        devices: 64,
        gpud_args: &[],
        plugin_args: &args,
        prepare: &|_| {},
    })
    .await;
    check_cpx_annotations(&w.api);

    // One partition, whole: no mask, no hook, its own render node.
    let one = allocate(&w, "one-part", &[(&w.gpus[0], 24576, 38)], 600).await;
    assert_eq!(one.envs["ROCR_VISIBLE_DEVICES"], "0");
    assert!(!one.envs.contains_key("HSA_CU_MASK") && !one.envs.contains_key("LD_AUDIT"));
    assert!(one.mounts.is_empty());
    let paths: Vec<&str> = one
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(paths.len(), 3, "{paths:?}");
    assert_eq!(paths[0], "/dev/kfd");
    // A share of a partition (the Go plugin's vLLM example asks
    // `amd.com/gpucores: 64`): still the whole partition, no mask, no hook.
    let share = allocate(&w, "part-share", &[(&w.gpus[4], 8192, 24)], 603).await;
    assert!(
        !share.envs.contains_key("HSA_CU_MASK")
            && !share.envs.contains_key("LD_AUDIT")
            && !share
                .envs
                .keys()
                .any(|k| k.starts_with("HIP_DEVICE_MEMORY_LIMIT")),
        "{:?}",
        share.envs
    );
    assert!(share.mounts.is_empty());
    // Two partitions in one container, by container-local index.
    let two = allocate(
        &w,
        "two-parts",
        &[(&w.gpus[1], 24576, 38), (&w.gpus[2], 24576, 38)],
        601,
    )
    .await;
    assert_eq!(two.envs["ROCR_VISIBLE_DEVICES"], "0,1");
    let renders: BTreeSet<String> = [&one, &two]
        .iter()
        .flat_map(|a| a.devices.iter())
        .filter(|d| d.container_path.contains("renderD"))
        .map(|d| d.host_path.clone())
        .collect();
    assert_eq!(
        renders.len(),
        3,
        "each partition its own render node: {renders:?}"
    );

    // Both processes restarted: the same ids, and an id from before resolves.
    let before: BTreeSet<String> = w.kubelet.devices().into_iter().map(|d| d.id).collect();
    let fourth = w.gpus[3].id.clone();
    w.restart_both().await;
    w.kubelet
        .wait_devices(Duration::from_secs(20), |d| d.len() == 64)
        .await
        .unwrap();
    let after: BTreeSet<String> = w.kubelet.devices().into_iter().map(|d| d.id).collect();
    assert_eq!(before, after);
    let g3 = Gpu {
        id: fourth,
        device_type: w.gpus[3].device_type.clone(),
        rocr_uuid: String::new(),
    };
    let again = allocate(&w, "after-restart", &[(&g3, 24576, 38)], 602).await;
    assert_eq!(again.envs["ROCR_VISIBLE_DEVICES"], "0");
}

/// The figures of docs/benchmarks.md ("Register annotation size"): run with
/// `cargo test -p tests --test plugin_partition -- --ignored --nocapture
/// register_annotation_size`.
#[test]
#[ignore = "a measurement; prints the sizes for docs/benchmarks.md"]
fn register_annotation_size() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), async {
        let args = partition_args(&[]);
        let w = world_with(&Setup {
            fixture: "mi300x-8-cpx",
            devices: 64,
            gpud_args: &[],
            plugin_args: &args,
            prepare: &|_| {},
        })
        .await;
        let (size, floor) = register_sizes(&w.api);
        let node = w.api.get(Kind::Node, "", NODE).unwrap();
        let gpus = node["metadata"]["annotations"]["hami.io/node-amd-gpus"]
            .as_str()
            .map_or(0, str::len);
        println!(
            "mi300x-8-cpx, 64 partitions: hami.io/node-amd-register {size} bytes \
             (floor, custominfo = pciBDF only: {floor} bytes); hami.io/node-amd-gpus {gpus} bytes"
        );
    });
}

#[test]
fn a_mixed_node_keeps_radeons_cu_maskable() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), mixed());
}

fn build_mixed(root: &std::path::Path) {
    std::fs::remove_dir_all(root).unwrap();
    let opts = BuildOptions {
        drm: true,
        amdsmi_abi: None,
    };
    fixture::build(&mixed_instinct_radeon(), root, &opts).unwrap();
}

async fn mixed() {
    let args = partition_args(&[]);
    let w = world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 2 * 2 + 2,
        gpud_args: &[],
        plugin_args: &args,
        prepare: &build_mixed,
    })
    .await;
    let devices = register(&w.api);
    let modes: Vec<(&str, i64)> = devices
        .iter()
        .map(|d| {
            (
                d["mode"].as_str().unwrap_or(""),
                d["count"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        modes,
        [("", 2), ("dpx", 1), ("dpx", 1), ("dpx", 1), ("dpx", 1)],
        "{devices:?}"
    );
    let radeon = w.gpus.iter().find(|g| !g.id.contains("-dpx")).unwrap();
    let sliced = allocate(&w, "radeon-half", &[(radeon, 4096, 32)], 700).await;
    assert_eq!(sliced.envs["HSA_CU_MASK"], "0:0-31");
    let part = w.gpus.iter().find(|g| g.id.ends_with("-dpx1")).unwrap();
    let whole = allocate(&w, "dpx-part", &[(part, 98304, 152)], 701).await;
    assert!(!whole.envs.contains_key("HSA_CU_MASK"));
}

#[test]
fn compute_partition_switches_idle_gpus_at_start() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), switch_at_start());
}

async fn switch_at_start() {
    // A pod already holds GPU 3 (HAMi's record survives the plugin).
    let spec = fixture::named("mi300x-8-spx").unwrap();
    let args = partition_args(&[]);
    let mut w = world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 8,
        gpud_args: &[],
        plugin_args: &args,
        prepare: &|_| {},
    })
    .await;
    let _driver = FakeDriver::start(
        w.root(),
        spec,
        BuildOptions {
            drm: true,
            amdsmi_abi: None,
        },
    );
    schedule(&w.api, "holder", &[(&w.gpus[3], 1024, 304)], 800);
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.kubelet
        .allocate(vec![format!("{}#0", w.gpus[3].id)])
        .await
        .unwrap();
    let held = w.gpus[3].id.clone();

    // The switch waits for kubelet's pod-resources API to answer too.
    let pod_resources = tests::kubelet::pod_resources::FakePodResources::start().unwrap();
    let socket = pod_resources.socket().display().to_string();
    w.extra
        .extend(["--pod-resources-socket".to_owned(), socket]);
    w.extra
        .extend(["--compute-partition".to_owned(), "CPX".to_owned()]);
    w.restart_plugin().await;
    let devices = wait_register(&w.api, |d| d.len() == 7 * 8 + 1).await;
    assert!(
        devices
            .iter()
            .any(|d| d["id"] == held.as_str() && d["mode"] == "spx"),
        "GPU 3 stays"
    );
    w.kubelet
        .wait_devices(Duration::from_secs(30), |d| d.len() == 57)
        .await
        .unwrap();

    // And back to SPX everywhere (the holder is gone).
    w.api.remove(Kind::Pod, "default", "holder");
    let n = w.extra.len();
    w.extra[n - 1] = "SPX".to_owned();
    w.restart_plugin().await;
    wait_register(&w.api, |d| {
        d.len() == 8 && d.iter().all(|x| x["mode"] == "spx")
    })
    .await;
    w.kubelet
        .wait_devices(Duration::from_secs(30), |d| d.len() == 8)
        .await
        .unwrap();
}
