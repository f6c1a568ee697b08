//! Issue 36, point 4 and part of 5: what a node run by HAMi's Go AMD plugin
//! keeps when it switches over, in the Go plugin's own formats. The node
//! annotation `hami.io/amd-compute-partition` (its vLLM example writes
//! `qpx`) is followed while the plugin runs, in any case, a bad value named
//! in a Warning Event; `--exclude-gpus` (the Go chart's `excludeGPUs`: PCI
//! BDFs and `cardN`) keeps GPUs out of kubelet's list and HAMi's register
//! annotation; and a pod HAMi up to v2.9 placed with `<node>-AMDGPU-<n>`
//! ids is admitted onto the GPU of kubelet's n-th slot. Needs root
//! (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::world::{Gpu, NODE, Setup, World, registered, schedule, world, world_with};
use serde_json::{Value, json};
use tests::{
    apiserver::{FakeApiServer, Kind},
    fixture::{self, BuildOptions, driver::FakeDriver},
};

const ANNOTATION: &str = "hami.io/amd-compute-partition";
const INVALID: &str = "ComputePartitionInvalid";

fn set_partition(api: &FakeApiServer, mode: &str) {
    let mut node = api.get(Kind::Node, "", NODE).unwrap();
    node["metadata"]["annotations"][ANNOTATION] = json!(mode);
    api.put_node(node);
}

/// Waits until HAMi's register annotation has `n` devices, all in `mode`.
async fn wait_registered(api: &FakeApiServer, n: usize, mode: &str) {
    let start = Instant::now();
    loop {
        let devices = registered(api);
        if devices.len() == n && devices.iter().all(|d| d["mode"] == mode) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{n} devices in {mode}: {} registered",
            devices.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn invalid_events(api: &FakeApiServer) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == "Node" && e["reason"] == INVALID)
        .collect()
}

#[test]
fn the_compute_partition_annotation_is_followed_in_any_case() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(240), follow_scenario());
}

async fn follow_scenario() {
    let args: Vec<String> = [
        "--operating-mode",
        "partition",
        "--pod-resources-socket",
        "none",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    let w = world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 8,
        gpud_args: &[],
        plugin_args: &args,
        prepare: &|_| {},
    })
    .await;
    let _driver = FakeDriver::start(
        w.root(),
        fixture::named("mi300x-8-spx").unwrap(),
        BuildOptions {
            drm: true,
            amdsmi_abi: None,
        },
    );

    // The Go plugin's vLLM example: `qpx`, lower case, while the plugin runs.
    set_partition(&w.api, "qpx");
    wait_registered(&w.api, 8 * 4, "qpx").await;
    w.kubelet
        .wait_devices(Duration::from_secs(30), |d| d.len() == 32)
        .await
        .unwrap();

    // A value that is no mode: a Warning Event naming it and the
    // annotation; the GPUs stay in QPX.
    set_partition(&w.api, "cpx4");
    let start = Instant::now();
    while invalid_events(&w.api).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            w.api.events()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let note = invalid_events(&w.api)[0]["note"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        note.contains("\"cpx4\"") && note.contains(ANNOTATION),
        "{note}"
    );
    assert_eq!(invalid_events(&w.api)[0]["type"], "Warning");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(registered(&w.api).len(), 32, "unchanged");

    // Mixed case is a mode too.
    set_partition(&w.api, "Cpx");
    wait_registered(&w.api, 8 * 8, "cpx").await;
    assert_eq!(invalid_events(&w.api).len(), 1, "said once");
}

#[test]
fn excluded_gpus_are_neither_offered_nor_registered() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), exclude_scenario());
}

async fn exclude_scenario() {
    // GPU 0 by its short BDF, GPU 1 (card1) by its DRM card, and an address
    // no GPU of the node has (a warning only).
    let args: Vec<String> = ["--exclude-gpus", "05:00.0, card1,0000:99:00.0"]
        .iter()
        .map(ToString::to_string)
        .collect();
    let w = world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 60,
        gpud_args: &[],
        plugin_args: &args,
        prepare: &|_| {},
    })
    .await;
    let bdfs: Vec<String> = registered(&w.api)
        .iter()
        .map(|d| d["custominfo"]["pciBDF"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bdfs.len(), 6, "{bdfs:?}");
    for gone in ["0000:05:00.0", "0000:15:00.0"] {
        assert!(!bdfs.iter().any(|b| b == gone), "{gone} in {bdfs:?}");
    }
    let devices = w.kubelet.devices();
    assert_eq!(devices.len(), 60);
    assert!(
        devices
            .iter()
            .all(|d| w.gpus.iter().any(|g| d.id.starts_with(&g.id))),
        "only the registered GPUs' slots"
    );
}

#[test]
fn a_pod_hami_v2_9_placed_gets_the_gpu_of_its_index() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), legacy_scenario());
}

/// HAMi up to v2.9's id for kubelet slot `n` of this node.
fn legacy(w: &World, n: u32, like: usize) -> Gpu {
    Gpu {
        id: format!("{NODE}-AMDGPU-{n}"),
        ..w.gpus[like].clone()
    }
}

async fn legacy_scenario() {
    let w = world().await;
    let g1 = &w.gpus[1];
    // A pod placed under the current id takes the first quarter of GPU 1.
    schedule(&w.api, "new-hami", &[(g1, 49_152, 76)], 99);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let current = w
        .kubelet
        .allocate(vec![format!("{}#1", g1.id)])
        .await
        .unwrap();
    assert_eq!(current.envs["HSA_CU_MASK"], "0:0-75");

    // Slot 11 with 10 slots a GPU: the second GPU, as in the Go plugin's
    // TestResolveUpstreamAMDGPUIndex; its CUs counted with the first pod's.
    schedule(&w.api, "old-hami", &[(&legacy(&w, 11, 1), 49_152, 76)], 100);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = w
        .kubelet
        .allocate(vec![format!("{}#0", g1.id)])
        .await
        .unwrap();
    assert_eq!(
        answer.envs["ROCR_VISIBLE_DEVICES"],
        current.envs["ROCR_VISIBLE_DEVICES"]
    );
    assert_eq!(answer.envs["HSA_CU_MASK"], "0:76-151");
    let paths: Vec<&str> = answer
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(paths, ["/dev/kfd", "/dev/dri/card1", "/dev/dri/renderD129"]);
    let pod = w.api.get(Kind::Pod, "default", "old-hami").unwrap();
    let cus: Value = serde_json::from_str(
        pod["metadata"]["annotations"]["hami.io/amd-cu-allocated"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        cus[&g1.id], "76-151",
        "recorded under the current id: {cus}"
    );

    // A slot past the node's 80 names no GPU: refused, the id named.
    schedule(&w.api, "too-far", &[(&legacy(&w, 80, 2), 1024, 10)], 101);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = w
        .kubelet
        .allocate(vec![format!("{}#0", w.gpus[2].id)])
        .await
        .unwrap_err();
    assert!(err.message().contains("AMDGPU-80"), "{}", err.message());
}
