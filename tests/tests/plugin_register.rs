//! amd-device-plugin publishing `hami.io/node-amd-register` through the real
//! kube-rs client to the fake API server: the value HAMi reads (with the Go
//! plugin's `custominfo` keys), the node capacity of `--report-node-capacity`,
//! no rewrite when nothing changed, health changes, and the graceful-stop form.
//! Needs root (the private bus loads the shipped policy).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{
    apiserver::{FakeApiServer, Kind},
    bus::{Policy, PrivateBus},
    kubelet::FakeKubelet,
    stack,
};

const NODE: &str = "gpu-node-1";

fn register_value(api: &FakeApiServer) -> Option<Vec<Value>> {
    let node = api.get(Kind::Node, "", NODE)?;
    let text = node["metadata"]["annotations"]["hami.io/node-amd-register"]
        .as_str()?
        .to_owned();
    serde_json::from_str(&text).ok()
}

async fn wait_register(
    api: &FakeApiServer,
    what: &str,
    pred: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let start = Instant::now();
    loop {
        if let Some(devices) = register_value(api).filter(|d| pred(d)) {
            return devices;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no register annotation with {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn the_node_register_annotation_follows_the_inventory() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(90), scenario());
}

/// The eight healthy GPUs; `index` is each GPU's DRM card minor, as HAMi's
/// Go plugin publishes it (0 is left out).
fn assert_first_listing(devices: &[Value]) {
    assert!(
        devices
            .iter()
            .all(|d| d["health"] == true && d["count"] == 10 && d["devcore"] == 304)
    );
    assert_eq!(devices[0]["custominfo"]["pciBDF"], "0000:05:00.0");
    assert!(devices[0]["type"].as_str().unwrap().starts_with("AMD"));
    let spec = tests::fixture::named("mi300x-8-spx").unwrap();
    let layout = tests::fixture::Layout::new(&spec);
    for (i, device) in devices.iter().enumerate() {
        let card = layout.nodes_of_gpu(i).next().unwrap().card_minor;
        let index = device["index"].as_u64().unwrap_or(0);
        assert_eq!(index, u64::from(card), "GPU {i}: {device}");
    }
    assert!(
        devices.iter().any(|d| d["index"].as_u64().unwrap_or(0) > 0),
        "some card minor is not 0"
    );
}

/// The Go plugin's `custominfo` keys, as its tests read them: the profile
/// menu (`partitionProfiles`, its `amdsmi.PartitionProfile` fields), the
/// current profile, KFD's `num_cp_queues` (`computeQueues`) and the GPUs
/// reached over XGMI (`xgmiPeers`, sorted PCI addresses).
fn assert_go_custominfo(devices: &[Value]) {
    let info = &devices[0]["custominfo"];
    assert_eq!(info["partitionProfile"], "spx_nps1");
    assert_eq!(
        info["partitionProfiles"][0],
        json!({"ProfileIndex": 0, "Type": "SPX", "MemoryCaps": "NPS1",
               "NumPartitions": 1, "XCCPerPartition": 8}),
        "{info}"
    );
    assert_eq!(info["computeQueues"], 24, "{info}");
    let peers: Vec<String> = serde_json::from_value(info["xgmiPeers"].clone()).unwrap();
    let others: Vec<String> = devices[1..]
        .iter()
        .map(|d| d["custominfo"]["pciBDF"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(peers, others, "every other MI300X of the platform, sorted");
}

/// Waits until the node's capacity and allocatable show the healthy
/// devices' memory (MiB) and CUs, `healthy` GPUs' worth.
async fn wait_capacity(api: &FakeApiServer, devices: &[Value], healthy: u64) {
    let (devmem, devcore) = (&devices[0]["devmem"], &devices[0]["devcore"]);
    let memory = (healthy * devmem.as_u64().unwrap()).to_string();
    let cores = (healthy * devcore.as_u64().unwrap()).to_string();
    let start = Instant::now();
    loop {
        let node = api.get(Kind::Node, "", NODE).unwrap();
        let shows = |list: &str| {
            let list = &node["status"][list];
            list["amd.com/gpumem"] == memory.as_str() && list["amd.com/gpucores"] == cores.as_str()
        };
        if shows("capacity") && shows("allocatable") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no capacity {memory} MiB, {cores} CUs: {}",
            node["status"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scenario() {
    let root = common::build_fixture("mi300x-8-spx");
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let fake_node = common::fake_node_exe();
    let _gpud = stack::gpud(&fake_node, &bus, root.path(), 0).unwrap();
    let api = FakeApiServer::start().unwrap();
    api.put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let kubeconfig = api.kubeconfig(root.path());
    let kubelet = FakeKubelet::start().await.unwrap();
    let kube = kubeconfig.display().to_string();
    let extra = [
        "--kube",
        kube.as_str(),
        "--node-name",
        NODE,
        "--register-interval",
        "1",
        "--report-node-capacity",
        "true",
    ];
    let mut plugin = stack::plugin(&fake_node, &bus, kubelet.dir(), extra).unwrap();

    let devices = wait_register(&api, "8 healthy devices", |d| d.len() == 8).await;
    assert_first_listing(&devices);
    assert_go_custominfo(&devices);
    // What CRIU compares at restore, for pre-selecting nodes: once per GPU,
    // keyed by its address, in an annotation of its own.
    assert!(devices[0]["custominfo"].get("criu").is_none());
    let node = api.get(Kind::Node, "", NODE).unwrap();
    let gpus: Value = serde_json::from_str(
        node["metadata"]["annotations"]["hami.io/node-amd-gpus"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(gpus.as_object().unwrap().len(), 8);
    let criu = &gpus["0000:05:00.0"]["criu"];
    assert_eq!(
        (&criu["fw_version"], &criu["sdma_fw_version"]),
        (&json!(177), &json!(24))
    );
    assert_eq!(criu["device_id"], 0x74a1);
    assert!(criu.get("drm_render_minor").is_none());
    assert!(gpus["0000:05:00.0"].get("partitionProfiles").is_none());
    // --report-node-capacity: the healthy GPUs' memory and CUs.
    wait_capacity(&api, &devices, 8).await;

    // Nothing changes: several re-check intervals pass without a write.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let patches = api.requests().patch;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        api.requests().patch,
        patches,
        "no rewrite when nothing changed"
    );

    // A GPU vanishes: its device turns unhealthy in the annotation.
    std::fs::remove_dir_all(root.path().join("sys/class/kfd/kfd/topology/nodes/9")).unwrap();
    stack::rescan(&bus).unwrap();
    let devices = wait_register(&api, "one unhealthy device", |d| {
        d.iter().filter(|x| x["health"] != true).count() == 1
    })
    .await;
    wait_capacity(&api, &devices, 7).await;

    // Someone else rewrites the annotation: the re-check puts ours back.
    api.put_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "annotations": {"hami.io/node-amd-register": "[]"}}
    }));
    wait_register(&api, "8 devices again", |d| d.len() == 8).await;

    graceful_stop_keeps_health(&api, &mut plugin);
}

/// A graceful stop (a rollout) keeps the published health: kubelet learns
/// of the plugin's absence on its own, and HAMi keeps the node's GPUs for
/// the length of the rollout (issue 36, point 6).
fn graceful_stop_keeps_health(api: &FakeApiServer, plugin: &mut stack::Process) {
    let before = register_value(api).unwrap();
    let pid = plugin.0.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = plugin.wait_exit(Duration::from_secs(20)).unwrap();
    assert!(status.success(), "{status}");
    let devices = register_value(api).unwrap();
    assert_eq!(
        devices, before,
        "the stop left the register annotation as it was"
    );
    assert_eq!(
        devices.iter().filter(|d| d["health"] == true).count(),
        7,
        "{devices:?}"
    );
}
